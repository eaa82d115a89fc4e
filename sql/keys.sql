--
-- idem_claim / idem_complete / idem_checkpoint / idem_release / idem_lookup:
-- the idempotency-key ledger
--
-- Tokens and timestamps change from run to run: they are only ever printed
-- as comparisons.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
-- start without key storage, whatever tests ran before
DROP TABLE IF EXISTS idempotency.keys;
RESET client_min_messages;

-- keep(name, token) remembers a token (for the session) and tells whether
-- there was one; tok(name) gives it back.  Neither prints the token.
CREATE FUNCTION pg_temp.keep(name text, token bigint) RETURNS boolean
LANGUAGE sql AS $$
  SELECT set_config('keys_test.' || name, coalesce(token::text, ''), false) <> ''
$$;
CREATE FUNCTION pg_temp.tok(name text) RETURNS bigint
LANGUAGE sql AS $$
  SELECT nullif(current_setting('keys_test.' || name), '')::bigint
$$;
-- try(stmt) runs a statement and reports SQLSTATE and message instead of
-- failing; token numbers in messages are masked
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N');
END $$;

-- storage is made by the first claim, not by CREATE EXTENSION nor by lookups
SELECT to_regclass('idempotency.keys') IS NULL AS no_key_storage_yet;
SELECT count(*) AS rows FROM idem_lookup('order-1');
SELECT to_regclass('idempotency.keys') IS NULL AS still_no_key_storage;

----------------------------------------------------------------------------
-- claimed, then completed in the same transaction; completed replays
----------------------------------------------------------------------------
BEGIN;
SELECT status, pg_temp.keep('order1', token) AS has_token, recovery_point,
       response_code, response_body,
       expires_at BETWEEN now() + interval '24 hours'
                      AND clock_timestamp() + interval '24 hours' AS default_ttl_24h
  FROM idem_claim('order-1', '{"amount": 100, "currency": "EUR", "items": [1, 2]}');
SELECT to_regclass('idempotency.keys') IS NOT NULL AS storage_made;
-- our own claim, seen by lookup in the same transaction
SELECT status, token = pg_temp.tok('order1') AS same_token, recovery_point, response_code,
       response_body, claimed_at BETWEEN now() AND clock_timestamp() AS claimed_now,
       expires_at - claimed_at AS ttl, lease_expires_at
  FROM idem_lookup('order-1');
SELECT idem_complete('order-1', 201, '{"order": 1, "state": "created"}');
COMMIT;

-- a retry with the same request replays the stored response verbatim
SELECT status, token, recovery_point, response_code, response_body,
       expires_at = (SELECT expires_at FROM idem_lookup('order-1')) AS same_expiry
  FROM idem_claim('order-1', '{"amount": 100, "currency": "EUR", "items": [1, 2]}');
-- the fingerprint ignores key order and whitespace
SELECT status, response_code
  FROM idem_claim('order-1', '{ "items":[1,2],  "currency" : "EUR", "amount":100 }');
-- a NULL request is not checked
SELECT status, response_code FROM idem_claim('order-1');
SELECT status, response_code FROM idem_claim('order-1', NULL, wait => true);
-- a different request is a mismatch: nothing returned, nothing changed
SELECT status, token, recovery_point, response_code, response_body
  FROM idem_claim('order-1', '{"amount": 101, "currency": "EUR", "items": [1, 2]}');
SELECT status FROM idem_claim('order-1', '{"amount": 100, "currency": "EUR", "items": [2, 1]}');
SELECT status FROM idem_claim('order-1', '{"amount": 100, "currency": "EUR"}');
SELECT status FROM idem_claim('order-1', '[]');
SELECT status, token = pg_temp.tok('order1') AS same_token, response_code, response_body
  FROM idem_lookup('order-1');
-- numbers compare as jsonb compares them: their written scale does not
-- matter (1.0 = 1 = 1.00), their value does
BEGIN;
SELECT status FROM idem_claim('order-scale', '{"amount": 10.50, "items": [1.0, {"q": 2}], "n": -0.0}');
SELECT idem_complete('order-scale', 201);
COMMIT;
SELECT status, response_code
  FROM idem_claim('order-scale', '{"n": 0, "items": [1, {"q": 2.000}], "amount": 10.5}');
SELECT status FROM idem_claim('order-scale', '{"amount": 10.51, "items": [1, {"q": 2}], "n": 0}');
SELECT status FROM idem_claim('order-scale', '{"amount": "10.5", "items": [1, {"q": 2}], "n": 0}');
SELECT '{"amount": 10.50}'::jsonb = '{"amount": 10.5}'::jsonb AS jsonb_agrees;
-- nested objects are canonical too; duplicate keys keep the last value, as jsonb does
BEGIN;
SELECT status FROM idem_claim('order-2', '{"a": {"x": 1, "y": [true, null]}, "b": "s"}');
SELECT idem_complete('order-2', 200);
COMMIT;
SELECT status FROM idem_claim('order-2', '{"b": "s", "a": {"y": [true, null], "x": 1}}');
SELECT status FROM idem_claim('order-2', '{"b": "t", "b": "s", "a": {"y": [true, null], "x": 1}}');
SELECT status FROM idem_claim('order-2', '{"b": "s", "a": {"y": [null, true], "x": 1}}');
-- a key first claimed without a request matches any request
BEGIN;
SELECT status FROM idem_claim('order-3');
SELECT idem_complete('order-3', 204);
COMMIT;
SELECT status, response_code, response_body FROM idem_claim('order-3', '{"anything": 1}');
SELECT status, response_code FROM idem_claim('order-3', '"a string"');

----------------------------------------------------------------------------
-- same-transaction mode
----------------------------------------------------------------------------

-- committing a claim that was neither completed nor released is an error at
-- COMMIT, and the transaction rolls back
BEGIN;
SELECT status FROM idem_claim('forgotten', '{"v": 1}');
COMMIT;
\echo :SQLSTATE
SELECT count(*) AS rows FROM idem_lookup('forgotten');
-- the same in an implicit transaction
SELECT status FROM idem_claim('forgotten-too');
\echo :SQLSTATE
SELECT count(*) AS rows FROM idem_lookup('forgotten-too');
-- and for a claim in a savepoint that was released (its work is kept)
BEGIN;
SAVEPOINT s;
SELECT status FROM idem_claim('forgotten-in-savepoint');
RELEASE SAVEPOINT s;
COMMIT;
\echo :SQLSTATE
-- and when the completion was undone by a rolled back savepoint
BEGIN;
SELECT status FROM idem_claim('completion-undone');
SAVEPOINT s;
SELECT idem_complete('completion-undone', 200);
ROLLBACK TO SAVEPOINT s;
COMMIT;
\echo :SQLSTATE
-- and when the release was undone by a rolled back savepoint
BEGIN;
SELECT status FROM idem_claim('release-undone');
SAVEPOINT s;
SELECT idem_release('release-undone');
ROLLBACK TO SAVEPOINT s;
COMMIT;
\echo :SQLSTATE
-- and for a claim made again after the first one (completed in a nested
-- savepoint) was rolled back with its savepoint
BEGIN;
SAVEPOINT a;
SELECT status FROM idem_claim('claimed-twice');
SAVEPOINT b;
SELECT idem_complete('claimed-twice', 200);
RELEASE SAVEPOINT b;
ROLLBACK TO SAVEPOINT a;
SELECT status FROM idem_claim('claimed-twice');
COMMIT;
\echo :SQLSTATE
-- and at PREPARE TRANSACTION
BEGIN;
SELECT status FROM idem_claim('forgotten-prepared');
PREPARE TRANSACTION 'regress_idem_keys';
\echo :SQLSTATE
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'regress_idem_keys';
SELECT count(*) AS rows FROM idem_lookup('forgotten-prepared');
-- none of these keys was stored, so each can be claimed afresh
BEGIN;
SELECT k, c.status, c.recovery_point
  FROM unnest(ARRAY['forgotten', 'forgotten-too', 'forgotten-in-savepoint',
                    'completion-undone', 'release-undone', 'claimed-twice',
                    'forgotten-prepared']) AS k,
       LATERAL idem_claim(k, '{"v": 2}') AS c;
SELECT idem_complete(k, 200)
  FROM unnest(ARRAY['forgotten', 'forgotten-too', 'forgotten-in-savepoint',
                    'completion-undone', 'release-undone', 'claimed-twice',
                    'forgotten-prepared']) AS k;
COMMIT;
-- a completed claim may be prepared and committed
BEGIN;
SELECT status FROM idem_claim('prepared');
SELECT idem_complete('prepared', 202);
PREPARE TRANSACTION 'regress_idem_keys';
COMMIT PREPARED 'regress_idem_keys';
SELECT status, response_code FROM idem_claim('prepared');

-- a rolled back claim leaves nothing: a different request is claimed, not a mismatch
BEGIN;
SELECT status FROM idem_claim('rolled-back', '{"v": 1}');
ROLLBACK;
SELECT count(*) AS rows FROM idem_lookup('rolled-back');
BEGIN;
SELECT status FROM idem_claim('rolled-back', '{"v": 2}');
SELECT idem_complete('rolled-back', 200, '"second"');
COMMIT;
SELECT status, response_body FROM idem_claim('rolled-back', '{"v": 2}');

-- a claim in a rolled back savepoint is gone, and is no error at COMMIT
BEGIN;
SAVEPOINT s;
SELECT status FROM idem_claim('in-savepoint');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS rows FROM idem_lookup('in-savepoint');
COMMIT;
SELECT count(*) AS rows FROM idem_lookup('in-savepoint');
-- ... and the key can be claimed afresh in the same transaction
BEGIN;
SAVEPOINT s;
-- (psql variables survive the rollback, session settings would not)
SELECT token AS sp_token FROM idem_claim('in-savepoint-2') \gset
ROLLBACK TO SAVEPOINT s;
SELECT status, token <> :sp_token AS new_token FROM idem_claim('in-savepoint-2');
SELECT idem_complete('in-savepoint-2', 200);
COMMIT;
SELECT status, response_code FROM idem_lookup('in-savepoint-2');

-- claiming again in the same transaction is the same claim, with the same token
BEGIN;
SELECT status, pg_temp.keep('again', token) AS has_token FROM idem_claim('again', '{"n": 1}');
SELECT status, token = pg_temp.tok('again') AS same_token FROM idem_claim('again', '{"n": 1}');
SELECT status, token = pg_temp.tok('again') AS same_token FROM idem_claim('again');
-- wait => true does not wait for our own transaction
SELECT status, token = pg_temp.tok('again') AS same_token FROM idem_claim('again', wait => true);
-- a different request is still a mismatch
SELECT status, token FROM idem_claim('again', '{"n": 2}');
-- completing with the claim's own token works too
SELECT idem_complete('again', 200, token => pg_temp.tok('again'));
-- once completed, a claim in the same transaction replays
SELECT status, token, response_code FROM idem_claim('again', '{"n": 1}');
COMMIT;

-- a checkpoint in the same transaction, then completion
BEGIN;
SELECT status FROM idem_claim('multi-step');
SELECT idem_checkpoint('multi-step', 'created-order');
SELECT idem_checkpoint('multi-step', 'charged-card');
SELECT status, recovery_point, response_code FROM idem_lookup('multi-step');
SELECT idem_complete('multi-step', 201);
COMMIT;
SELECT status, recovery_point, response_code, response_body FROM idem_lookup('multi-step');

----------------------------------------------------------------------------
-- two-phase mode: lease, commit the claim, finish in a later transaction
----------------------------------------------------------------------------
SELECT status, pg_temp.keep('pay1', token) AS has_token, recovery_point,
       expires_at BETWEEN now() + interval '24 hours'
                      AND clock_timestamp() + interval '24 hours' AS default_ttl_24h
  FROM idem_claim('payment-1', '{"amount": 5}', lease => '1 hour');
-- another caller gets in_progress at once while the lease runs, even with wait
SELECT status, token, recovery_point, response_code, response_body
  FROM idem_claim('payment-1', '{"amount": 5}');
SELECT status, token FROM idem_claim('payment-1', '{"amount": 5}', wait => true);
SELECT status, token FROM idem_claim('payment-1', lease => '1 hour');
-- a different request is a mismatch even while in progress
SELECT status, token FROM idem_claim('payment-1', '{"amount": 6}');
SELECT status, token = pg_temp.tok('pay1') AS holder_token, recovery_point, response_code,
       lease_expires_at - claimed_at AS lease, expires_at - claimed_at AS ttl
  FROM idem_lookup('payment-1');
-- the holder records its progress with its token, in later transactions
SELECT idem_checkpoint('payment-1', 'called-provider', token => pg_temp.tok('pay1'));
SELECT status, recovery_point FROM idem_lookup('payment-1');
-- without the token, another transaction cannot act on the claim
SELECT pg_temp.try($$SELECT idem_complete('payment-1', 200)$$);
-- with it, the holder completes
SELECT idem_complete('payment-1', 200, '{"paid": true}', token => pg_temp.tok('pay1'));
SELECT status, token, response_code, response_body FROM idem_claim('payment-1', '{"amount": 5}');
SELECT status, token = pg_temp.tok('pay1') AS same_token, recovery_point, response_code,
       response_body, lease_expires_at
  FROM idem_lookup('payment-1');

-- the lease lapses: a new caller takes the key over with a larger token and
-- the last recovery point; the old holder's token is stale
SELECT status, pg_temp.keep('old', token) AS has_token
  FROM idem_claim('payment-2', '{"amount": 7}', lease => '0.3 seconds');
SELECT idem_checkpoint('payment-2', 'step-1', token => pg_temp.tok('old'));
SELECT idem_checkpoint('payment-2', 'step-2', token => pg_temp.tok('old'));
DO $$
BEGIN
  -- wait on the condition: the lease has lapsed
  WHILE clock_timestamp() <= (SELECT lease_expires_at FROM idem_lookup('payment-2')) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
-- lapsed but not taken over yet: still in progress for lookup
SELECT status, token = pg_temp.tok('old') AS old_token, recovery_point,
       lease_expires_at <= clock_timestamp() AS lease_lapsed
  FROM idem_lookup('payment-2');
-- the stored fingerprint still applies
SELECT status, token FROM idem_claim('payment-2', '{"amount": 8}');
SELECT status, pg_temp.keep('new', token) AS has_token, recovery_point, response_code
  FROM idem_claim('payment-2', '{"amount": 7}', lease => '1 hour');
SELECT pg_temp.tok('new') > pg_temp.tok('old') AS larger_token;
SELECT status, token = pg_temp.tok('new') AS new_token, recovery_point,
       lease_expires_at - claimed_at AS new_lease
  FROM idem_lookup('payment-2');
-- the new holder's lease runs: in_progress for everyone else
SELECT status, token FROM idem_claim('payment-2', '{"amount": 7}', wait => true);
-- the old holder is refused, whatever it tries
SELECT pg_temp.try(format('SELECT idem_checkpoint(%L, %L, token => %s)',
                          'payment-2', 'step-3', pg_temp.tok('old')));
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)',
                          'payment-2', pg_temp.tok('old')));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)',
                          'payment-2', pg_temp.tok('old')));
SELECT status, token = pg_temp.tok('new') AS new_token, recovery_point FROM idem_lookup('payment-2');
-- the new holder goes on from the recovery point and completes
SELECT idem_checkpoint('payment-2', 'step-3', token => pg_temp.tok('new'));
SELECT idem_complete('payment-2', 201, '{"charged": 7}', token => pg_temp.tok('new'));
SELECT status, token, recovery_point, response_code, response_body
  FROM idem_claim('payment-2', '{"amount": 7}');
SELECT status, recovery_point, response_code, response_body, lease_expires_at
  FROM idem_lookup('payment-2');
-- still refused after completion
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)',
                          'payment-2', pg_temp.tok('old')));

-- a lapsed lease taken over in same-transaction mode: finished in that transaction
SELECT status, pg_temp.keep('lapse1', token) AS has_token
  FROM idem_claim('payment-3', lease => '0.2 seconds');
DO $$
BEGIN
  WHILE clock_timestamp() <= (SELECT lease_expires_at FROM idem_lookup('payment-3')) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
BEGIN;
SELECT status, token > pg_temp.tok('lapse1') AS larger_token FROM idem_claim('payment-3');
COMMIT;
\echo :SQLSTATE
-- the failed takeover rolled back: the lapsed claim is there as it was
SELECT status, token = pg_temp.tok('lapse1') AS old_token FROM idem_lookup('payment-3');
BEGIN;
SELECT status, token > pg_temp.tok('lapse1') AS larger_token FROM idem_claim('payment-3');
SELECT idem_complete('payment-3', 200);
COMMIT;
SELECT status, response_code, lease_expires_at FROM idem_lookup('payment-3');

----------------------------------------------------------------------------
-- release: the key can be claimed again, by a new request
----------------------------------------------------------------------------
SELECT status, pg_temp.keep('rel1', token) AS has_token
  FROM idem_claim('refund-1', '{"v": 1}', lease => '1 hour');
SELECT idem_checkpoint('refund-1', 'started', token => pg_temp.tok('rel1'));
SELECT idem_release('refund-1', token => pg_temp.tok('rel1'));
SELECT status, token = pg_temp.tok('rel1') AS same_token, recovery_point, response_code,
       lease_expires_at
  FROM idem_lookup('refund-1');
-- a released key takes no more completion, checkpoint or release
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)',
                          'refund-1', pg_temp.tok('rel1')));
-- claimed again, with another request: new, larger token, recovery point kept
BEGIN;
SELECT status, pg_temp.keep('rel2', token) AS has_token, recovery_point
  FROM idem_claim('refund-1', '{"v": 2}');
SELECT pg_temp.tok('rel2') > pg_temp.tok('rel1') AS larger_token;
SELECT idem_complete('refund-1', 200, '{"refunded": true}');
COMMIT;
-- the new request's fingerprint replaced the old one
SELECT status, response_code, response_body FROM idem_claim('refund-1', '{"v": 2}');
SELECT status FROM idem_claim('refund-1', '{"v": 1}');
-- the released token is stale
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)',
                          'refund-1', pg_temp.tok('rel1')));

-- release in same-transaction mode: COMMIT is fine, the key is free again
BEGIN;
SELECT status FROM idem_claim('refund-2', '{"v": 1}');
SELECT idem_release('refund-2');
COMMIT;
SELECT status, recovery_point, response_code FROM idem_lookup('refund-2');
BEGIN;
SELECT status FROM idem_claim('refund-2', '{"v": 2}');
SELECT idem_release('refund-2');
SELECT status FROM idem_claim('refund-2', '{"v": 3}');
SELECT idem_complete('refund-2', 409);
COMMIT;
SELECT status, response_code FROM idem_claim('refund-2', '{"v": 3}');
SELECT status FROM idem_claim('refund-2', '{"v": 2}');

----------------------------------------------------------------------------
-- per-key ttl: an expired key is absent, before its partition is dropped
----------------------------------------------------------------------------
BEGIN;
SELECT status, pg_temp.keep('ttl1', token) AS has_token,
       expires_at BETWEEN now() + interval '1 second'
                      AND clock_timestamp() + interval '1 second' AS ttl_1s
  FROM idem_claim('short-lived', '{"v": 1}', ttl => '1 second');
SELECT idem_complete('short-lived', 200, '{"first": true}');
-- replayed while it lives (checked at once: the ttl is short)
SELECT status, response_body FROM idem_claim('short-lived', '{"v": 1}');
COMMIT;
DO $$
BEGIN
  -- wait on the condition: every short-lived row of this test has expired
  WHILE clock_timestamp() <= (SELECT max(expires_at) FROM idempotency.keys
                               WHERE expires_at < now() + interval '1 minute') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT count(*) AS rows FROM idem_lookup('short-lived');
-- a new claim, with another request, is claimed (no mismatch, no replay)
BEGIN;
SELECT status, token > pg_temp.tok('ttl1') AS larger_token, recovery_point, response_body
  FROM idem_claim('short-lived', '{"v": 2}');
SELECT idem_complete('short-lived', 200, '{"second": true}');
COMMIT;
SELECT status, response_body FROM idem_claim('short-lived', '{"v": 2}');
-- the expired row is still stored until its partition is dropped
SELECT count(*) AS expired_rows FROM idempotency.keys WHERE expires_at <= now();

----------------------------------------------------------------------------
-- scopes are independent namespaces; '' is a scope of its own
----------------------------------------------------------------------------
BEGIN;
SELECT s AS scope, c.status
  FROM unnest(ARRAY['tenant-a', 'tenant-b', '']) AS s, LATERAL idem_claim('shared', scope => s) AS c;
SELECT idem_complete('shared', 201, '"a"', scope => 'tenant-a');
SELECT idem_complete('shared', 202, '"b"', scope => 'tenant-b');
SELECT idem_complete('shared', 200, '"none"');
COMMIT;
SELECT s AS scope, c.status, c.response_code, c.response_body
  FROM unnest(ARRAY['tenant-a', 'tenant-b', '', 'tenant-c']) AS s,
       LATERAL idem_claim('shared', scope => s, lease => '1 hour') AS c;
SELECT s AS scope, l.status, l.response_code
  FROM unnest(ARRAY['tenant-a', 'tenant-b', '', 'tenant-c', 'tenant-d']) AS s,
       LATERAL idem_lookup('shared', s) AS l;
SELECT idem_release('shared', 'tenant-c', (SELECT token FROM idem_lookup('shared', 'tenant-c')));
-- the boundary between scope and key is part of the identity: ('ab', 'c') <> ('a', 'bc')
BEGIN;
SELECT status FROM idem_claim('c', scope => 'ab');
SELECT status FROM idem_claim('bc', scope => 'a');
SELECT idem_complete('c', 200, '"ab/c"', scope => 'ab');
SELECT idem_complete('bc', 200, '"a/bc"', scope => 'a');
COMMIT;
SELECT response_body FROM idem_lookup('c', 'ab') UNION ALL SELECT response_body FROM idem_lookup('bc', 'a');
SELECT count(*) AS rows FROM idem_lookup('abc') UNION ALL SELECT count(*) FROM idem_lookup('c', 'a');

----------------------------------------------------------------------------
-- roles never see each other's keys
----------------------------------------------------------------------------
CREATE ROLE regress_idem_keys_alice;
CREATE ROLE regress_idem_keys_bob;
SET ROLE regress_idem_keys_alice;
BEGIN;
SELECT status FROM idem_claim('role-key', '{"who": "alice"}');
SELECT idem_complete('role-key', 201, '{"by": "alice"}');
COMMIT;
SELECT status, pg_temp.keep('alice', token) AS has_token
  FROM idem_claim('role-held', lease => '1 hour');
SELECT status, response_code, response_body FROM idem_claim('role-key', '{"who": "alice"}');
RESET ROLE;
SET ROLE regress_idem_keys_bob;
-- bob sees none of alice's keys
SELECT count(*) AS rows FROM idem_lookup('role-key');
SELECT count(*) AS rows FROM idem_lookup('role-held');
-- nor can he finish or release them, even with alice's token
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, token => %s)',
                          'role-held', pg_temp.tok('alice')));
SELECT pg_temp.try(format('SELECT idem_release(%L, token => %s)',
                          'role-held', pg_temp.tok('alice')));
-- the same key is new to bob (no replay of alice's response, no mismatch)
BEGIN;
SELECT status, token IS NOT NULL AS has_token, response_code FROM idem_claim('role-key', '{"who": "bob"}');
SELECT idem_complete('role-key', 202, '{"by": "bob"}');
COMMIT;
SELECT status, response_code, response_body FROM idem_claim('role-key', '{"who": "bob"}');
SELECT status, response_code, response_body FROM idem_lookup('role-key');
-- a claim of role-held is bob's own, alice's lease does not matter
SELECT status FROM idem_claim('role-held', lease => '1 hour');
-- bob cannot touch the storage
SELECT count(*) FROM idempotency.keys;
RESET ROLE;
SET ROLE regress_idem_keys_alice;
SELECT status, response_code, response_body FROM idem_lookup('role-key');
SELECT status, token = pg_temp.tok('alice') AS alice_token FROM idem_lookup('role-held');
SELECT idem_complete('role-held', 200, token => pg_temp.tok('alice'));
RESET ROLE;
-- within one transaction too: alice's claim is not bob's to complete
BEGIN;
SET LOCAL ROLE regress_idem_keys_alice;
SELECT status FROM idem_claim('role-tx');
SET LOCAL ROLE regress_idem_keys_bob;
SELECT pg_temp.try($$SELECT idem_complete('role-tx', 200)$$);
SELECT count(*) AS rows FROM idem_lookup('role-tx');
SELECT status FROM idem_claim('role-tx');
SELECT idem_complete('role-tx', 202);
SET LOCAL ROLE regress_idem_keys_alice;
SELECT status, response_code FROM idem_lookup('role-tx');
SELECT idem_complete('role-tx', 201);
COMMIT;
SET ROLE regress_idem_keys_bob;
SELECT status, response_code FROM idem_lookup('role-tx');
RESET ROLE;
SELECT role, count(*) FROM idempotency.keys
 WHERE role IN ('regress_idem_keys_alice'::regrole, 'regress_idem_keys_bob'::regrole)
 GROUP BY role ORDER BY role::text;

----------------------------------------------------------------------------
-- idem_lookup in every state, and in a read-only transaction
----------------------------------------------------------------------------
SELECT status, pg_temp.keep('ro', token) AS has_token FROM idem_claim('read-only', lease => '1 hour');
BEGIN READ ONLY;
SELECT status, token = pg_temp.tok('ro') AS same_token, recovery_point, lease_expires_at > now() AS lease_running
  FROM idem_lookup('read-only');
SELECT status, response_code, response_body FROM idem_lookup('order-1');
SELECT count(*) AS rows FROM idem_lookup('never-claimed');
COMMIT;
-- every state: in progress (read-only), completed (order-1), released
-- (shared in tenant-c), short-lived (its expired row is not shown, only the
-- live one), never claimed
SELECT k, sc AS scope, l.status, l.recovery_point, l.response_code, l.response_body,
       l.lease_expires_at - l.claimed_at AS lease, l.expires_at - l.claimed_at AS ttl
  FROM (VALUES ('read-only', ''), ('order-1', ''), ('multi-step', ''), ('shared', 'tenant-c'),
               ('short-lived', ''), ('never-claimed', '')) AS v(k, sc)
  LEFT JOIN LATERAL idem_lookup(k, sc) AS l ON true
 ORDER BY k;
SELECT idem_release('read-only', token => pg_temp.tok('ro'));
SELECT status, token = pg_temp.tok('ro') AS same_token, lease_expires_at FROM idem_lookup('read-only');

-- rows hold a digest of (scope, key), not the key itself
SELECT count(*) AS plain_keys FROM idempotency.keys WHERE digest::text ~ 'order|payment|refund';

DROP ROLE regress_idem_keys_alice;
DROP ROLE regress_idem_keys_bob;

-- a claim after a release is a fresh claim: it gets the ttl and lease it asks
-- for, so its lease never outlives the key
SELECT status FROM idem_claim('fresh-ttl', ttl => '2 seconds', lease => '1 second');
SELECT idem_release('fresh-ttl', token => (SELECT token FROM idem_lookup('fresh-ttl')));
SELECT status, expires_at - now() > interval '50 minutes' AS new_expiry
  FROM idem_claim('fresh-ttl', ttl => '1 hour', lease => '30 minutes');
SELECT lease_expires_at < expires_at AS lease_within_key,
       expires_at - now() > interval '50 minutes' AS stored_expiry
  FROM idem_lookup('fresh-ttl');
SELECT count(*) AS rows_for_key FROM idempotency.keys k
 WHERE k.digest = (SELECT digest FROM idempotency.keys ORDER BY claimed_at DESC LIMIT 1);

-- A completion updates its key's row, and a claim of a released key
-- deletes the old row: each is refused (55000), as an UPDATE or a DELETE
-- of the ledger is, when a publication carries that kind of change of the
-- ledger and its partitions have no replica identity (they have none as
-- made: no primary key).  Before, both were written, and no subscriber
-- could apply them.  Inserts are not refused.
CREATE FUNCTION pg_temp.try_published(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '"keys_[^"]*"', '"keys_..."');
END $$;
SELECT token AS released_token FROM idem_claim('published-released', lease => '1 hour') \gset
SELECT idem_release('published-released', token => :released_token);
SET client_min_messages = error;	-- (the warning about wal_level)
CREATE PUBLICATION regress_idem_ledger FOR TABLE idempotency.keys;
RESET client_min_messages;
SELECT token AS published_token FROM idem_claim('published', lease => '1 hour') \gset
SELECT pg_temp.try_published(format($$SELECT idem_complete('published', 200, token => %s)$$, :published_token));
SELECT pg_temp.try_published($$SELECT status FROM idem_claim('published-released', lease => '1 hour')$$);
SELECT k, status FROM (VALUES ('published'), ('published-released')) AS v(k),
       LATERAL idem_lookup(k) ORDER BY k;
-- publishing inserts only: nothing to refuse
ALTER PUBLICATION regress_idem_ledger SET (publish = 'insert');
SELECT pg_temp.try_published(format($$SELECT idem_complete('published', 200, token => %s)$$, :published_token));
-- the partitions given a replica identity: nothing to refuse either (the
-- ones made before their table was, altered by hand; those made after it,
-- made so by the extension)
ALTER PUBLICATION regress_idem_ledger SET (publish = 'insert, update, delete');
ALTER TABLE idempotency.keys REPLICA IDENTITY FULL;
DO $$
DECLARE
  part regclass;
BEGIN
  FOR part IN SELECT partition FROM idempotency.partitions WHERE table_name = 'keys' LOOP
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', part);
  END LOOP;
END $$;
SELECT pg_temp.try_published($$SELECT status FROM idem_claim('published-released', lease => '1 hour')$$);
SELECT k, status FROM (VALUES ('published'), ('published-released')) AS v(k),
       LATERAL idem_lookup(k) ORDER BY k;
SET idempotency.premake = 3;
SELECT partitions_created > 0 AS made FROM idem_maintain();
RESET idempotency.premake;
SELECT count(*) > 2 AS partitions, count(*) FILTER (WHERE c.relreplident <> 'f') AS not_full
  FROM idempotency.partitions p JOIN pg_class c ON c.oid = p.partition
 WHERE p.table_name = 'keys';
DROP PUBLICATION regress_idem_ledger;
ALTER TABLE idempotency.keys REPLICA IDENTITY DEFAULT;
DO $$
DECLARE
  part regclass;
BEGIN
  FOR part IN SELECT partition FROM idempotency.partitions WHERE table_name = 'keys' LOOP
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY DEFAULT', part);
  END LOOP;
END $$;
