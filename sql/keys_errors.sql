--
-- Bad input and misuse of the idempotency-key functions: every case is a
-- clean error with its SQLSTATE, and a call that fails writes nothing.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- runs a statement and reports SQLSTATE and message instead of failing;
-- token numbers in messages are masked (they change from run to run).
-- PostgreSQL 17 gives the unit in a setting's valid range ("1 s .. 2 s");
-- it is masked so that one expected output serves every major
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' ||
         regexp_replace(regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N'),
                        '\(([-0-9]+) [a-z]+ \.\. ([-0-9]+) [a-z]+\)', '(\1 .. \2)');
END $$;
-- the same, with the hint
CREATE FUNCTION pg_temp.try_hint(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  hint text;
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N')
         || ' (hint: ' || hint || ')';
END $$;

-- fixtures: a completed key, a committed two-phase claim (token in :held),
-- a released key, and a claim that expires within a second
BEGIN;
SELECT status FROM idem_claim('err-done', '{"v": 1}');
SELECT idem_complete('err-done', 200, '"done"');
COMMIT;
SELECT token AS held FROM idem_claim('err-held', lease => '1 hour') \gset
SELECT token AS released FROM idem_claim('err-released', lease => '1 hour') \gset
SELECT idem_release('err-released', token => :released);
SELECT token AS expiring FROM idem_claim('err-expiring', ttl => '1 second', lease => '1 second') \gset

-- the ledger as it is before the failing calls (rows and their versions)
SELECT count(*) AS rows_before,
       md5(string_agg(k::text || k.ctid::text || k.xmin::text, ',' ORDER BY k.ctid)) AS ledger_before
  FROM idempotency.keys k \gset

----------------------------------------------------------------------------
-- idem_claim
----------------------------------------------------------------------------

-- key: NULL, empty, over idempotency.max_key_length (255 bytes, not characters)
SELECT pg_temp.try($$SELECT idem_claim(NULL)$$);
SELECT pg_temp.try($$SELECT idem_claim('')$$);
SELECT pg_temp.try($$SELECT idem_claim(repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT idem_claim(repeat('é', 128))$$);
SET idempotency.max_key_length = 8;
SELECT pg_temp.try($$SELECT idem_claim('123456789')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', scope => '123456789')$$);
RESET idempotency.max_key_length;
-- scope: NULL, over the limit (empty is a scope like any other)
SELECT pg_temp.try($$SELECT idem_claim('k', scope => NULL)$$);
SELECT pg_temp.try($$SELECT idem_claim('k', scope => repeat('s', 256))$$);

-- ttl: not positive, over idempotency.max_ttl (30 days); the default ttl over it
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '0')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '-1 hour')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '31 days')$$);
SET idempotency.max_ttl = '1h';
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '2 hours')$$);
SELECT pg_temp.try($$SELECT idem_claim('k')$$);
RESET idempotency.max_ttl;

-- lease: not positive, longer than the ttl (given or default), over max_ttl
SELECT pg_temp.try($$SELECT idem_claim('k', lease => '0')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', lease => '-1 second')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '1 minute', lease => '2 minutes')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', lease => '25 hours')$$);
SELECT pg_temp.try($$SELECT idem_claim('k', ttl => '30 days', lease => '31 days')$$);

-- wait: NULL
SELECT pg_temp.try($$SELECT idem_claim('k', wait => NULL)$$);

----------------------------------------------------------------------------
-- idem_complete, idem_checkpoint, idem_release: arguments
----------------------------------------------------------------------------
SELECT pg_temp.try($$SELECT idem_complete(NULL, 200)$$);
SELECT pg_temp.try($$SELECT idem_complete('', 200)$$);
SELECT pg_temp.try($$SELECT idem_complete(repeat('k', 256), 200)$$);
SELECT pg_temp.try($$SELECT idem_complete('err-held', 200, scope => NULL)$$);
SELECT pg_temp.try($$SELECT idem_complete('err-held', 200, scope => repeat('s', 256))$$);
-- response_code: NULL, outside 100..599
SELECT pg_temp.try($$SELECT idem_complete('err-held', NULL)$$);
SELECT pg_temp.try($$SELECT idem_complete('err-held', 99)$$);
SELECT pg_temp.try($$SELECT idem_complete('err-held', 600)$$);
SELECT pg_temp.try($$SELECT idem_complete('err-held', -200)$$);

SELECT pg_temp.try($$SELECT idem_checkpoint(NULL, 'step')$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('', 'step')$$);
SELECT pg_temp.try($$SELECT idem_checkpoint(repeat('k', 256), 'step')$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('err-held', 'step', scope => NULL)$$);
-- recovery_point: NULL, empty
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, NULL, token => %s)', 'err-held', :held));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-held', '', :held));

SELECT pg_temp.try($$SELECT idem_release(NULL)$$);
SELECT pg_temp.try($$SELECT idem_release('')$$);
SELECT pg_temp.try($$SELECT idem_release(repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT idem_release('err-held', scope => NULL)$$);
SELECT pg_temp.try($$SELECT idem_release('err-held', scope => repeat('s', 256))$$);

SELECT pg_temp.try($$SELECT * FROM idem_lookup(NULL)$$);
SELECT pg_temp.try($$SELECT * FROM idem_lookup('')$$);
SELECT pg_temp.try($$SELECT * FROM idem_lookup(repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT * FROM idem_lookup('k', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM idem_lookup('k', repeat('s', 256))$$);

----------------------------------------------------------------------------
-- idem_complete, idem_checkpoint, idem_release: no live claim held
----------------------------------------------------------------------------

-- never claimed
SELECT pg_temp.try($$SELECT idem_complete('err-never', 200)$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('err-never', 'step')$$);
SELECT pg_temp.try($$SELECT idem_release('err-never')$$);
SELECT pg_temp.try($$SELECT idem_complete('err-never', 200, token => 1)$$);
-- in another scope than the one claimed
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, scope => %L, token => %s)',
                          'err-held', 'other-scope', :held));
-- released
SELECT pg_temp.try($$SELECT idem_complete('err-released', 200)$$);
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)', 'err-released', :released));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-released', 'step', :released));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)', 'err-released', :released));
-- already completed
SELECT pg_temp.try($$SELECT idem_complete('err-done', 200)$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('err-done', 'step')$$);
SELECT pg_temp.try($$SELECT idem_release('err-done')$$);
-- held, but not by this transaction: the token is needed
SELECT pg_temp.try_hint($$SELECT idem_complete('err-held', 200)$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('err-held', 'step')$$);
SELECT pg_temp.try($$SELECT idem_release('err-held')$$);
-- a wrong token is refused as stale, before and after the holder's own work
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)', 'err-held', :held - 1));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-held', 'step', :held + 1));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)', 'err-held', 0));
BEGIN;
SELECT status, token IS NOT NULL AS has_token FROM idem_claim('err-own', '{"v": 1}');
SELECT pg_temp.try($$SELECT idem_complete('err-own', 200, token => 1)$$);
SELECT pg_temp.try($$SELECT idem_checkpoint('err-own', 'step', token => 1)$$);
SELECT pg_temp.try($$SELECT idem_release('err-own', token => 1)$$);
-- ... and the claim is of scope '', not of another scope
SELECT pg_temp.try($$SELECT idem_complete('err-own', 200, scope => 'other')$$);
SELECT pg_temp.try($$SELECT idem_release('err-own', scope => 'other')$$);
ROLLBACK;
-- expired
DO $$
BEGIN
  WHILE clock_timestamp() <= (SELECT max(expires_at) FROM idempotency.keys
                               WHERE expires_at < now() + interval '1 minute') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)', 'err-expiring', :expiring));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-expiring', 'step', :expiring));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)', 'err-expiring', :expiring));
-- another role's claim, even with its token
CREATE ROLE regress_idem_keys_errors;
SET ROLE regress_idem_keys_errors;
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)', 'err-held', :held));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-held', 'step', :held));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)', 'err-held', :held));
SELECT count(*) AS rows FROM idem_lookup('err-held');
RESET ROLE;
DROP ROLE regress_idem_keys_errors;

----------------------------------------------------------------------------
-- read-only transactions: no writes, lookups work
----------------------------------------------------------------------------
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT idem_claim('err-ro')$$);
SELECT pg_temp.try($$SELECT idem_claim('err-done', '{"v": 1}')$$);
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)', 'err-held', :held));
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'err-held', 'step', :held));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)', 'err-held', :held));
SELECT status, response_code, response_body FROM idem_lookup('err-done');
COMMIT;
SET default_transaction_read_only = on;
SELECT pg_temp.try($$SELECT idem_claim('err-ro', lease => '1 hour')$$);
RESET default_transaction_read_only;

-- nothing was written by any failed call: the same rows, not even updated
SELECT count(*) - :rows_before AS rows_written,
       md5(string_agg(k::text || k.ctid::text || k.xmin::text, ',' ORDER BY k.ctid))
         = :'ledger_before' AS ledger_unchanged
  FROM idempotency.keys k;
SELECT status FROM idem_lookup('err-held');
SELECT count(*) AS rows FROM idem_lookup('k');

-- the boundaries are accepted: a 255-byte key and scope, response codes
-- 100 and 599, a lease equal to the ttl, an empty scope
BEGIN;
SELECT status FROM idem_claim(repeat('k', 255), scope => repeat('s', 255));
SELECT idem_complete(repeat('k', 255), 100, scope => repeat('s', 255));
SELECT status FROM idem_claim('err-599', ttl => '1 hour', lease => '1 hour');
SELECT idem_complete('err-599', 599);
SELECT status FROM idem_claim('err-empty-scope', scope => '');
SELECT idem_release('err-empty-scope', '');
COMMIT;
SELECT count(*) - :rows_before AS rows_written FROM idempotency.keys;

-- invalid settings
SELECT pg_temp.try($$SET idempotency.key_ttl = 0$$);
SELECT pg_temp.try($$SET idempotency.key_ttl = 'forever'$$);
SELECT pg_temp.try($$SET idempotency.key_ttl = '-1h'$$);
