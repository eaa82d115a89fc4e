--
-- sql/relocate.sql -- idempotency.relocate_lanes() moves rows that sit in
-- another lane than their digest gives (rows a big-endian 0.2.0 wrote), and
-- makes the partition of their lane when it is missing, also for the
-- legacy partitions (made before 0.3.0) such rows live in.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency;
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT idem_maintain() IS NOT NULL AS made;

-- a legacy layout of two lanes (lane values 512 and 513), of which only
-- lane 0 has a partition, holding a row whose digest belongs to lane 1
-- (bytes 12-15 of the digest, read little-endian, are 1)
CREATE TABLE idempotency.messages_2_0_20260101_000000 (LIKE idempotency.messages INCLUDING ALL);
ALTER TABLE idempotency.messages ATTACH PARTITION idempotency.messages_2_0_20260101_000000
  FOR VALUES FROM (512, date_trunc('day', now()) - interval '2 days')
               TO (512, date_trunc('day', now()) + interval '2 days');
INSERT INTO idempotency.messages (expires_at, digest, role, lane)
VALUES (date_trunc('day', now()) + interval '1 day', '00000000-0000-0000-0000-000001000000',
        current_user::regrole, 512);

SELECT idempotency.relocate_lanes() AS moved;
SELECT regexp_replace(tableoid::regclass::text, '[0-9]{8}_[0-9]{6}$', 'T') AS partition, lane
  FROM idempotency.messages WHERE digest = '00000000-0000-0000-0000-000001000000';
SELECT idempotency.relocate_lanes() AS moved_again;

DROP EXTENSION idempotency;
