--
-- Digests and lanes: the stored digest and lane are the documented
-- functions of the namespace and key bytes (keyhash.c), and rows written
-- before 0.3.0 (legacy digest form, in legacy partitions) are still found,
-- replayed, completed and claimed again.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency;
CREATE EXTENSION idempotency;
SELECT partitions_created >= 0 AS made FROM idem_maintain();
RESET client_min_messages;

-- the documented forms, in SQL
CREATE FUNCTION pg_temp.full_hash(ns text, k text) RETURNS bytea LANGUAGE sql AS $$
  SELECT sha256(int4send(octet_length(ns)) || convert_to(ns, 'UTF8') || convert_to(k, 'UTF8'))
$$;
CREATE FUNCTION pg_temp.current_digest(ns text, k text) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(substring(sha256(int4send(octet_length(ns)) || convert_to(ns, 'UTF8')) FROM 1 FOR 4)
                || substring(pg_temp.full_hash(ns, k) FROM 5 FOR 12), 'hex')::uuid
$$;
CREATE FUNCTION pg_temp.legacy_digest(ns text, k text) RETURNS uuid LANGUAGE sql AS $$
  SELECT encode(substring(pg_temp.full_hash(ns, k) FROM 1 FOR 16), 'hex')::uuid
$$;
-- lane number: bytes 12-15 of the digest, little-endian, modulo the lanes
CREATE FUNCTION pg_temp.lane_number(d uuid, lanes int) RETURNS int LANGUAGE sql AS $$
  SELECT ((get_byte(uuid_send(d), 12)::bigint +
           get_byte(uuid_send(d), 13)::bigint * 256 +
           get_byte(uuid_send(d), 14)::bigint * 65536 +
           get_byte(uuid_send(d), 15)::bigint * 16777216) % lanes)::int
$$;

-- ---------------------------------------------------------------- current form
SELECT idem_consume_message('digests', 'm-1');
SELECT m.digest = pg_temp.current_digest('digests', 'm-1') AS digest_as_documented,
       m.lane < 0 AS current_lane,
       (m.lane::int & 255) = pg_temp.lane_number(m.digest, (m.lane::int & 32512) >> 8)
         AS lane_as_documented
  FROM idempotency.messages m;
-- every key of a namespace shares the digest's first 4 bytes, others do not
SELECT count(*) FROM idem_consume_messages('digests', ARRAY['m-2', 'm-3', 'm-4']);
SELECT idem_consume_message('other', 'm-1');
SELECT count(DISTINCT substring(uuid_send(digest) FROM 1 FOR 4)) AS prefixes,
       count(*) FILTER (WHERE substring(uuid_send(digest) FROM 5)
                              = substring(uuid_send(pg_temp.legacy_digest('other', 'm-1')) FROM 5))
         AS key_bytes_shared_with_legacy_form
  FROM idempotency.messages;

-- ---------------------------------------------------------------- legacy rows
-- what 0.2.0 made: partitions with non-negative lane values (here one lane),
-- rows with the legacy digest form
CREATE TABLE idempotency.messages_1_0_20260101_000000 (LIKE idempotency.messages INCLUDING ALL);
ALTER TABLE idempotency.messages ATTACH PARTITION idempotency.messages_1_0_20260101_000000
  FOR VALUES FROM (256, now() - interval '1 day') TO (256, now() + interval '60 days');
CREATE TABLE idempotency.keys_1_0_20260101_000000 (LIKE idempotency.keys INCLUDING ALL);
ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_1_0_20260101_000000
  FOR VALUES FROM (256, now() - interval '1 day') TO (256, now() + interval '60 days');
INSERT INTO idempotency.messages
SELECT now() + interval '1 day', pg_temp.legacy_digest('digests', id), current_user::regrole, 256
  FROM unnest(ARRAY['old-1', 'old-2']) AS id;
INSERT INTO idempotency.keys (expires_at, digest, role, lane, state, token, claimed_at,
                              lease_until, fingerprint, response_code, response_body, recovery_point)
VALUES (now() + interval '1 day', pg_temp.legacy_digest('s', 'k-done'), current_user::regrole, 256,
        'c', 1000, now(), NULL, sha256(convert_to('{"a": 1}', 'UTF8')), 201, '{"charge": 7}', NULL),
       (now() + interval '1 day', pg_temp.legacy_digest('s', 'k-released'), current_user::regrole, 256,
        'r', 2000, now(), NULL, NULL, NULL, NULL, NULL),
       (now() + interval '1 day', pg_temp.legacy_digest('s', 'k-held'), current_user::regrole, 256,
        'p', 3000, now(), now() + interval '1 hour', NULL, NULL, NULL, 'step-1');
SELECT lanes, lane, partition::text LIKE '%\_1\_0\_20260101\_000000' AS legacy
  FROM idempotency.partitions WHERE lanes = 1 AND lane = 0 ORDER BY table_name, legacy;

-- consumed legacy ids are duplicates; a new id goes to a current partition
SELECT idem_consume_message('digests', 'old-1') AS old_1,
       idem_consume_message('digests', 'old-2') AS old_2,
       idem_consume_message('digests', 'new-1') AS new_1;
SELECT count(*) AS new_rows_in_legacy_partitions
  FROM idempotency.messages WHERE lane >= 0 AND digest = pg_temp.legacy_digest('digests', 'new-1');
SELECT count(*) FROM idem_consume_messages('digests', ARRAY['old-1', 'new-2', 'old-2']);

-- a completed legacy key replays and checks its fingerprint
SELECT status, response_code, response_body FROM idem_claim('k-done', '{"a": 1}', scope => 's');
SELECT status FROM idem_claim('k-done', '{"a": 2}', scope => 's');
SELECT status, token, response_code FROM idem_lookup('k-done', 's');
-- its holder completes a two-phase legacy claim with its token, in place
SELECT status FROM idem_claim('k-held', scope => 's');
SELECT idem_complete('k-held', 200, '{"ok": true}', scope => 's', token => 3000);
SELECT status, recovery_point, response_code FROM idem_lookup('k-held', 's');
SELECT tableoid::regclass::text LIKE '%\_1\_0\_20260101\_000000' AS still_in_legacy_partition
  FROM idempotency.keys WHERE digest = pg_temp.legacy_digest('s', 'k-held');
-- a released legacy key is claimed afresh: its new row has the current form
BEGIN;
SELECT status, token > 2000 AS larger_token FROM idem_claim('k-released', '{"a": 3}', scope => 's');
SELECT idem_complete('k-released', 201, '{}', scope => 's');
COMMIT;
SELECT k.lane < 0 AS current_lane, k.digest = pg_temp.current_digest('s', 'k-released') AS current_form
  FROM idempotency.keys k
 WHERE k.digest IN (pg_temp.current_digest('s', 'k-released'), pg_temp.legacy_digest('s', 'k-released'));
SELECT status FROM idem_lookup('k-released', 's');

-- the other tests start from storage made by their own calls
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
