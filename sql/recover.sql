--
-- Recovering lapsed two-phase work (0.4.0): idem_claim(..., keep_request)
-- and idem_recover()
--
-- Tokens and timestamps change from run to run: they are only ever printed
-- as comparisons.  Leases lapse by waiting for them (a few short sleeps).
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP TABLE IF EXISTS idempotency.keys;
RESET client_min_messages;

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N');
END $$;
-- waits until the lease of a key has lapsed
CREATE FUNCTION pg_temp.lapse(k text, s text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  until timestamptz := (SELECT lease_expires_at FROM idem_lookup(k, s));
BEGIN
  WHILE clock_timestamp() <= until LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;

CREATE ROLE regress_idem_rec_a;
CREATE ROLE regress_idem_rec_b;
SET ROLE regress_idem_rec_a;

-- keep_request needs a lease, and is not null
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('no lease',  $$SELECT idem_claim('x', '{}', keep_request => true)$$),
  ('null',      $$SELECT idem_claim('x', '{}', lease => '1 minute', keep_request => NULL)$$)
) AS t(label, stmt);
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('lease 0',          $$SELECT * FROM idem_recover('0')$$),
  ('lease negative',   $$SELECT * FROM idem_recover('-1 minute')$$),
  ('lease over max_ttl', $$SELECT * FROM idem_recover('30 days 00:00:01')$$),
  ('lease past the range', $$SELECT * FROM idem_recover('178000000 years')$$),
  ('lease before the range', $$SELECT * FROM idem_recover('-178000000 years')$$),
  ('max_keys 0',       $$SELECT * FROM idem_recover('1 minute', NULL, 0)$$),
  ('empty scope: ok',  $$SELECT * FROM idem_recover('1 minute', '')$$)
) AS t(label, stmt);

-- nothing to recover before any key storage exists
SELECT count(*) FROM idem_recover('1 minute');

-- three kept claims (two scopes), one claim without keep_request; all
-- committed in progress with a short lease; and a kept claim whose lease
-- is live for an hour, which no call below recovers
SELECT status FROM idem_claim('charge-1', '{"amount": 10}', 'pay', lease => '200 ms', keep_request => true);
SELECT status FROM idem_claim('charge-2', '{"amount": 20}', 'pay', lease => '300 ms', keep_request => true);
SELECT status FROM idem_claim('mail-1', NULL, 'mail', lease => '200 ms', keep_request => true);
SELECT status FROM idem_claim('plain-1', '{"amount": 30}', 'pay', lease => '200 ms');
SELECT status FROM idem_claim('charge-live', '{"amount": 99}', 'pay', lease => '1 hour', keep_request => true);
SELECT pg_temp.lapse('charge-2', 'pay');
-- another role's recoverer sees none of them
SET ROLE regress_idem_rec_b;
SELECT count(*) FROM idem_recover('1 minute');
SET ROLE regress_idem_rec_a;

-- one scope, oldest lapse first, at most max_keys, each with a new token
SELECT token AS old1 FROM idem_lookup('charge-1', 'pay') \gset
BEGIN;
SELECT key, scope, request, recovery_point, token > :old1 AS newer_token,
       lapsed_at < now() AS lapsed
  FROM idem_recover('1 hour', 'pay', 1);
-- taken: the same call again finds the next one only
SELECT key, scope, request FROM idem_recover('1 hour', 'pay', 5);
-- recovered claims are this transaction's: complete without a token
SELECT idem_complete('charge-1', 200, '{"charged": 10}', 'pay');
COMMIT;
SELECT status, response_body FROM idem_lookup('charge-1', 'pay');
-- charge-2, taken by the second call and not finished: in progress, with
-- the new lease
SELECT status, lease_expires_at > now() + interval '50 minutes' AS new_lease,
       request FROM idem_lookup('charge-2', 'pay');
-- the rest: mail-1 (no request kept, only its key); plain-1 was not kept
SELECT key, scope, request FROM idem_recover('1 hour');
SELECT count(*) FROM idem_recover('1 hour');

-- the old holder's token is refused after a takeover ...
SELECT token AS t1 FROM idem_claim('charge-3', '{"amount": 3}', 'pay', lease => '100 ms', keep_request => true) \gset
SELECT pg_temp.lapse('charge-3', 'pay');
SELECT token AS t2 FROM idem_recover('1 hour', 'pay') WHERE key = 'charge-3' \gset
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('complete',   format('SELECT idem_complete(%L, 200, NULL, %L, %s)', 'charge-3', 'pay', :t1)),
  ('checkpoint', format('SELECT idem_checkpoint(%L, %L, %L, %s)', 'charge-3', 'step', 'pay', :t1)),
  ('release',    format('SELECT idem_release(%L, %L, %s)', 'charge-3', 'pay', :t1))
) AS t(label, stmt);
-- ... and the new one works; its checkpoint is kept for the next recoverer
SELECT idem_checkpoint('charge-3', 'card-charged', 'pay', :t2);
-- ... but until someone takes a lapsed key over, its old holder may still
-- complete it (as in v1), and then it is no longer recoverable
SELECT token AS t4 FROM idem_claim('charge-4', '{"amount": 4}', 'pay', lease => '100 ms', keep_request => true) \gset
SELECT pg_temp.lapse('charge-4', 'pay');
SELECT idem_complete('charge-4', 200, NULL, 'pay', :t4);
SELECT count(*) FROM idem_recover('1 hour', 'pay');

-- a takeover by a plain claim keeps the request; a release and a claim
-- afresh without keep_request forgets it
SELECT token AS t5 FROM idem_claim('charge-5', '{"amount": 5}', 'pay', lease => '100 ms', keep_request => true) \gset
SELECT pg_temp.lapse('charge-5', 'pay');
SELECT status, token > :t5 AS newer FROM idem_claim('charge-5', '{"amount": 5}', 'pay', lease => '100 ms');
SELECT request FROM idem_lookup('charge-5', 'pay');
SELECT pg_temp.lapse('charge-5', 'pay');
SELECT key, recovery_point, request FROM idem_recover('1 hour', 'pay');
SELECT idem_release('charge-5', 'pay', (SELECT token FROM idem_lookup('charge-5', 'pay')));
SELECT status FROM idem_claim('charge-5', '{"amount": 5}', 'pay', lease => '100 ms');
SELECT status, request FROM idem_lookup('charge-5', 'pay');
SELECT pg_temp.lapse('charge-5', 'pay');
SELECT count(*) FROM idem_recover('1 hour', 'pay');

-- a takeover by a claim with keep_request keeps the request stored (here
-- the taker passes none)
SELECT status FROM idem_claim('charge-7', '{"amount": 7}', 'pay', lease => '100 ms', keep_request => true);
SELECT pg_temp.lapse('charge-7', 'pay');
SELECT status FROM idem_claim('charge-7', NULL, 'pay', lease => '100 ms', keep_request => true);
SELECT request FROM idem_lookup('charge-7', 'pay');
SELECT pg_temp.lapse('charge-7', 'pay');
SELECT key, request FROM idem_recover('1 hour', 'pay');

-- the recovered lease is clipped to the key's expiry
SELECT token AS t6 FROM idem_claim('charge-6', NULL, 'pay', ttl => '1 minute', lease => '100 ms', keep_request => true) \gset
SELECT pg_temp.lapse('charge-6', 'pay');
SELECT key FROM idem_recover('1 hour', 'pay');
SELECT lease_expires_at = expires_at AS clipped FROM idem_lookup('charge-6', 'pay');

-- a read-only transaction cannot recover
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT * FROM idem_recover('1 hour')$$);
ROLLBACK;

-- the recovery index holds only claims that can be recovered
RESET ROLE;
SELECT count(*) AS keys,
       count(*) FILTER (WHERE recover_at IS NOT NULL) AS in_recover_index
  FROM idempotency.keys;
SELECT indexdef FROM pg_indexes WHERE indexname = 'keys_recover_idx';

DROP EXTENSION idempotency;
DROP ROLE regress_idem_rec_a, regress_idem_rec_b;
