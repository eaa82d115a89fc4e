--
-- Moving tenants between nodes: idempotency.export_keys() and
-- export_messages() give the live rows of a set of scopes or consumers;
-- import_key() and import_message() store them on another node (here: the
-- same database once its ledgers are emptied), keeping tokens,
-- fingerprints, recovery points, responses and expiry.  An import never
-- makes a key older than the local version.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency;
CREATE EXTENSION idempotency;
RESET client_min_messages;
CREATE ROLE regress_idem_transfer_app;

-- ---------------------------------------------------------------- source
SET ROLE regress_idem_transfer_app;
BEGIN;
SELECT status FROM idem_claim('k-done', '{"amount": 5}', scope => 'acme');
SELECT idem_complete('k-done', 201, '{"payment": "p-1", "amount": 5}', scope => 'acme');
COMMIT;
SELECT status, token AS held_token
  FROM idem_claim('k-held', '{"amount": 6}', scope => 'acme', lease => '1 hour') \gset
SELECT idem_checkpoint('k-held', 'charged', scope => 'acme', token => :held_token);
SELECT status, token AS released_token
  FROM idem_claim('k-released', scope => 'acme', lease => '1 hour') \gset
SELECT idem_release('k-released', scope => 'acme', token => :released_token);
BEGIN;
SELECT status FROM idem_claim('k-done', '{"amount": 5}', scope => 'globex');
SELECT idem_complete('k-done', 201, '{"payment": "p-2"}', scope => 'globex');
COMMIT;
SELECT idem_consume_message('acme-events', 'm-1') AS m1,
       idem_consume_message('acme-events', 'm-2') AS m2,
       idem_consume_message('globex-events', 'm-1') AS other;
-- ordinary roles may not export or import
SELECT * FROM idempotency.export_keys(ARRAY['acme']);
SELECT * FROM idempotency.export_messages();
RESET ROLE;

-- ---------------------------------------------------------------- export
CREATE TABLE moved_keys AS SELECT * FROM idempotency.export_keys(ARRAY['acme', 'acme']);
SELECT role, status, token = :held_token AS held_token_kept,
       recovery_point, response_code, response_body,
       lease_expires_at IS NOT NULL AS has_lease,
       fingerprint = sha256(convert_to('{"amount": 5}', 'UTF8')) AS fingerprint_of_request,
       expires_at > now() + interval '23 hours' AS expires_in_a_day
  FROM moved_keys ORDER BY status;
CREATE TABLE moved_messages AS SELECT * FROM idempotency.export_messages(ARRAY['acme-events']);
SELECT role, count(*) FROM moved_messages GROUP BY role;
-- the digests are those the ledger stores
SELECT count(*) AS exported_digests_in_ledger
  FROM moved_keys k JOIN idempotency.keys l USING (digest);
-- NULL: everything live; an empty list: nothing; many scopes: their union
SELECT (SELECT count(*) FROM idempotency.export_keys()) AS all_keys,
       (SELECT count(*) FROM idempotency.export_keys('{}')) AS no_scope,
       (SELECT count(*) FROM idempotency.export_keys(ARRAY['acme', 'globex', 'nobody'])) AS two_scopes,
       (SELECT count(*) FROM idempotency.export_messages()) AS all_messages;

-- rows of two roles in one scope and one consumer: both roles' are exported
-- (each partition's index is on (role, digest): one range scan per role
-- and namespace)
CREATE ROLE regress_idem_transfer_other;
SET ROLE regress_idem_transfer_other;
BEGIN;
SELECT status FROM idem_claim('k-other', scope => 'acme');
SELECT idem_complete('k-other', 200, scope => 'acme');
COMMIT;
SELECT idem_consume_message('acme-events', 'm-1') AS other_m1;
RESET ROLE;
SELECT role, status, count(*) FROM idempotency.export_keys(ARRAY['globex', 'acme'])
 GROUP BY role, status ORDER BY role, status;
SELECT role, count(*) FROM idempotency.export_messages(ARRAY['acme-events'])
 GROUP BY role ORDER BY role;

-- ---------------------------------------------------------------- import
-- "another node": the same database with empty ledgers
TRUNCATE idempotency.keys, idempotency.messages;
SELECT idempotency.import_key(k) AS outcome, count(*) FROM moved_keys k GROUP BY 1;
SELECT idempotency.import_message(m) AS outcome, count(*) FROM moved_messages m GROUP BY 1;
-- again: nothing changes
SELECT idempotency.import_key(k) AS outcome, count(*) FROM moved_keys k GROUP BY 1;
SELECT idempotency.import_message(m) AS outcome, count(*) FROM moved_messages m GROUP BY 1;
-- the rows are in the current partitions of their lanes
SELECT count(*) AS rows_in_their_lanes
  FROM idempotency.keys k JOIN idempotency.partitions p ON p.partition = k.tableoid
 WHERE p.lane = (k.lane::int & 255) AND k.lane < 0;

-- every answer is what the source gave
SET ROLE regress_idem_transfer_app;
SELECT status, response_code, response_body
  FROM idem_claim('k-done', '{"amount": 5}', scope => 'acme');
SELECT status FROM idem_claim('k-done', '{"amount": 7}', scope => 'acme');
SELECT status FROM idem_claim('k-held', '{"amount": 6}', scope => 'acme');
SELECT status, token = :held_token AS same_token, recovery_point
  FROM idem_lookup('k-held', 'acme');
SELECT idem_complete('k-held', 200, '{"ok": true}', scope => 'acme', token => :held_token);
SELECT status, response_code FROM idem_lookup('k-held', 'acme');
SELECT status, token > :released_token AS larger_token
  FROM idem_claim('k-released', scope => 'acme', lease => '1 hour');
SELECT idem_consume_message('acme-events', 'm-1') AS m1,
       idem_consume_message('acme-events', 'm-2') AS m2,
       idem_consume_message('acme-events', 'm-3') AS m3;
-- the other tenant's rows did not come along
SELECT count(*) AS globex_keys FROM idem_lookup('k-done', 'globex');
SELECT idem_consume_message('globex-events', 'm-1') AS globex_m1;
RESET ROLE;

-- ---------------------------------------------------------------- never older
-- k-held is completed here now; its exported version (in progress, same
-- token) is older
SELECT idempotency.import_key(k) FROM moved_keys k WHERE k.status = 'in_progress';
SET ROLE regress_idem_transfer_app;
SELECT status, response_code FROM idem_lookup('k-held', 'acme');
RESET ROLE;
-- k-released was claimed again here (larger token); the export is older
SELECT idempotency.import_key(k) FROM moved_keys k WHERE k.status = 'released';
-- a newer version replaces the local one: the same claim, a later checkpoint
SELECT idempotency.import_key(k) FROM (
  SELECT (e.role, e.digest, e.expires_at, e.status, e.token, e.claimed_at,
          e.lease_expires_at, e.fingerprint, 'shipped', NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record AS k
    FROM idempotency.export_keys(ARRAY['acme']) e WHERE e.status = 'in_progress') s;
-- ... and a larger token
SELECT idempotency.import_key(k) FROM (
  SELECT (e.role, e.digest, e.expires_at, 'completed', e.token + 1, e.claimed_at,
          NULL, e.fingerprint, NULL, 202, '{"by": "newer"}', NULL, NULL, NULL, NULL, NULL)::idempotency.key_record AS k
    FROM idempotency.export_keys(ARRAY['acme']) e WHERE e.status = 'in_progress') s;
SET ROLE regress_idem_transfer_app;
SELECT status, response_code, response_body FROM idem_lookup('k-released', 'acme');
RESET ROLE;
-- an expired record is not stored
SELECT idempotency.import_key(k) FROM (
  SELECT (e.role, e.digest, now() - interval '1 second', e.status, e.token + 1,
          e.claimed_at, NULL, e.fingerprint, NULL, e.response_code,
          e.response_body, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record AS k
    FROM idempotency.export_keys(ARRAY['acme']) e WHERE e.status = 'completed' LIMIT 1) s;
SELECT idempotency.import_message((m.role, m.digest, now() - interval '1 second')::idempotency.message_record)
  FROM moved_messages m LIMIT 1;

-- ---------------------------------------------------------------- bad input
-- nothing is written by a call that fails
CREATE TABLE before_bad AS SELECT * FROM idempotency.keys;
SELECT idempotency.import_key(('regress_idem_nobody', gen_random_uuid(), now() + interval '1 hour',
        'completed', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key((NULL, gen_random_uuid(), now() + interval '1 hour',
        'completed', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', NULL, now() + interval '1 hour',
        'completed', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), NULL,
        'completed', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'done', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'completed', 0, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'completed', 1, NULL, NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'completed', 1, now(), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'completed', 1, now(), NULL, NULL, NULL, 600, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'in_progress', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'released', 1, now(), now() + interval '1 minute', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'in_progress', 1, now(), NULL, '\x00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_message(('regress_idem_transfer_app', NULL, now() + interval '1 hour')::idempotency.message_record);
-- in progress without a lease: it could never be taken over
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'in_progress', 1, now(), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
-- a lease that outlives the key
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'in_progress', 1, now(), now() + interval '2 hours', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
-- beyond this node's idempotency.max_ttl (30 days)
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '31 days',
        'completed', 1, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT idempotency.import_message(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '31 days')::idempotency.message_record);
-- a token that leaves no room for later claims
SELECT idempotency.import_key(('regress_idem_transfer_app', gen_random_uuid(), now() + interval '1 hour',
        'completed', 9223372036854775807, now(), NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record);
SELECT * FROM idempotency.export_keys(ARRAY['acme', NULL]);
SELECT * FROM idempotency.export_keys(ARRAY[['acme'], ['globex']]);
SELECT * FROM idempotency.export_messages(ARRAY[repeat('x', 100000)]);
SELECT count(*) AS rows_changed
  FROM ((TABLE idempotency.keys EXCEPT TABLE before_bad)
        UNION ALL (TABLE before_bad EXCEPT TABLE idempotency.keys)) d;
-- a completed key is final: a larger token in progress or released does not
-- replace it
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, s.status, e.token + 1, e.claimed_at,
        CASE s.status WHEN 'in_progress' THEN now() + interval '1 minute' END,
        e.fingerprint, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record) AS outcome, s.status
  FROM idempotency.export_keys(ARRAY['acme']) e, (VALUES ('in_progress'), ('released')) s(status)
 WHERE e.status = 'completed'
 ORDER BY 2;
-- the largest token a key may have: claiming it again after its lease
-- lapsed needs a larger one, and there is none
SET ROLE regress_idem_transfer_app;
SELECT status FROM idem_claim('k-max', scope => 'maxed', lease => '1 hour');
RESET ROLE;
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, 'in_progress', 4611686018427387903,
        e.claimed_at, now() - interval '1 second', e.fingerprint, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record)
  FROM idempotency.export_keys(ARRAY['maxed']) e;
SET ROLE regress_idem_transfer_app;
SELECT status FROM idem_claim('k-max', scope => 'maxed', lease => '1 hour');
RESET ROLE;
-- a key claimed before 0.3.1 was fingerprinted with its numbers as written:
-- a retry with the very same request still matches it
SET ROLE regress_idem_transfer_app;
BEGIN;
SELECT status FROM idem_claim('k-fp', '{"amount": 1.0}', scope => 'fp');
SELECT idem_complete('k-fp', 200, scope => 'fp');
COMMIT;
RESET ROLE;
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1, e.claimed_at,
        NULL, sha256(convert_to('{"amount": 1.0}', 'UTF8')), NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record)
  FROM idempotency.export_keys(ARRAY['fp']) e;
SET ROLE regress_idem_transfer_app;
SELECT status FROM idem_claim('k-fp', '{"amount": 1.0}', scope => 'fp');
SELECT status FROM idem_claim('k-fp', '{"amount": 1.5}', scope => 'fp');
RESET ROLE;
-- a key this transaction wrote itself is not overwritten
BEGIN;
SET LOCAL ROLE regress_idem_transfer_app;
SELECT status FROM idem_claim('k-mine', scope => 'acme');
RESET ROLE;
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, 'completed', e.token + 1,
        e.claimed_at, NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.key_record)
  FROM idempotency.export_keys(ARRAY['acme']) e, idempotency.keys k
 WHERE k.digest = e.digest AND k.xmin::text = txid_current()::text;
ROLLBACK;
-- read-only transactions
BEGIN READ ONLY;
SELECT idempotency.import_key(k) FROM moved_keys k LIMIT 1;
ROLLBACK;

-- ------------------------------------------------- kept requests, responses
-- a kept request, response headers and raw bytes travel with the key
SET ROLE regress_idem_transfer_app;
SELECT status FROM idem_claim('k-kept', '{"amount": 7}', scope => 'v4',
                              lease => '1 hour', keep_request => true);
BEGIN;
SELECT status FROM idem_claim('k-raw', scope => 'v4');
SELECT idem_complete('k-raw', 201, scope => 'v4',
                     response_headers => '{"Location": "/r/1", "Content-Type": "text/csv"}',
                     response_raw => convert_to(E'a,b\n1,2\n', 'UTF8'));
COMMIT;
RESET ROLE;
CREATE TABLE moved_v4 AS SELECT * FROM idempotency.export_keys(ARRAY['v4']);
SELECT status, kept_key, kept_scope, request, response_headers, response_raw
  FROM moved_v4 ORDER BY status;
DELETE FROM idempotency.keys WHERE digest IN (SELECT digest FROM moved_v4);
SELECT idempotency.import_key(k) FROM moved_v4 k ORDER BY status;
SET ROLE regress_idem_transfer_app;
SELECT status, request, response_headers, convert_from(response_raw, 'UTF8') AS raw
  FROM idem_lookup('k-kept', 'v4') UNION ALL
SELECT status, request, response_headers, convert_from(response_raw, 'UTF8')
  FROM idem_lookup('k-raw', 'v4');
RESET ROLE;
-- a record of the 0.3.1 shape (11 columns) is still taken
SELECT idempotency.import_key(ROW(e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, NULL::timestamptz, NULL::bytea, NULL::text, 200, '"v1"'::jsonb))
  FROM moved_v4 e WHERE e.status = 'completed';
-- a kept key that is not the digest's, a request without a kept key, a
-- response of a key not completed, and both a body and raw bytes
\set VERBOSITY terse
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, e.lease_expires_at, e.fingerprint, NULL, NULL, NULL,
        'other', e.kept_scope, e.request, NULL, NULL)::idempotency.key_record)
  FROM moved_v4 e WHERE e.status = 'in_progress';
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, e.lease_expires_at, e.fingerprint, NULL, NULL, NULL,
        NULL, NULL, e.request, NULL, NULL)::idempotency.key_record)
  FROM moved_v4 e WHERE e.status = 'in_progress';
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, e.lease_expires_at, e.fingerprint, NULL, NULL, NULL,
        e.kept_key, e.kept_scope, e.request, '{"ETag": "x"}', NULL)::idempotency.key_record)
  FROM moved_v4 e WHERE e.status = 'in_progress';
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, NULL, NULL, NULL, 200, '{}', NULL, NULL, NULL, NULL, '\x00')::idempotency.key_record)
  FROM moved_v4 e WHERE e.status = 'completed';
SELECT idempotency.import_key((e.role, e.digest, e.expires_at, e.status, e.token + 1,
        e.claimed_at, NULL, NULL, NULL, 200, NULL, NULL, NULL, NULL, '{"bad name": "x"}', NULL)::idempotency.key_record)
  FROM moved_v4 e WHERE e.status = 'completed';
\set VERBOSITY default
DROP TABLE moved_v4;

-- ---------------------------------------------------------------- legacy rows
-- partitions made before 0.3.0 hold digests without the namespace prefix:
-- export and import refuse while one is live
CREATE TABLE idempotency.keys_1_0_20260101_000000 (LIKE idempotency.keys INCLUDING ALL);
ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_1_0_20260101_000000
  FOR VALUES FROM (256, now() - interval '1 day') TO (256, now() + interval '60 days');
\set VERBOSITY terse
SELECT count(*) FROM idempotency.export_keys(ARRAY['acme']);
SELECT idempotency.import_key(k) FROM moved_keys k LIMIT 1;
\set VERBOSITY default
-- the message ledger has none: its export works
SELECT count(*) FROM idempotency.export_messages(ARRAY['acme-events']);

DROP TABLE moved_keys, moved_messages, before_bad;
DROP EXTENSION idempotency;
DROP ROLE regress_idem_transfer_app;
DROP ROLE regress_idem_transfer_other;
