--
-- idempotency.key_memory: expired keys and message ids remembered
--
-- In a database of its own: the tests before it leave rows in day-wide
-- partitions, where this test's keys would land and not expire in time.
\set regress_db :DBNAME
CREATE DATABASE key_memory_regress;
\c key_memory_regress
CREATE EXTENSION idempotency;

-- partitions one second wide, keys and messages that expire within it
SET idempotency.partition_interval = '1s';
SET idempotency.key_ttl = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.premake = 0;
SELECT partitions_created > 0 AS made FROM idem_maintain();

-- waits until every ledger partition that holds a row has ended
CREATE FUNCTION pg_temp.wait_rows_ended() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  WHILE clock_timestamp() <= (SELECT max(p.upper_bound)
                                FROM idempotency.partitions p
                               WHERE EXISTS (SELECT 1 FROM idempotency.keys k WHERE k.tableoid = p.partition)
                                  OR EXISTS (SELECT 1 FROM idempotency.messages m WHERE m.tableoid = p.partition)) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;

SHOW idempotency.key_memory;
-- without memory (the default): an expired key is claimed afresh
BEGIN;
SELECT status FROM idem_claim('v1-key', ttl => '1 second');
SELECT idem_complete('v1-key', 200);
COMMIT;
SELECT idem_consume_message('km', 'v1-id', ttl => '1 second');
SELECT pg_temp.wait_rows_ended();
BEGIN;
SELECT status FROM idem_claim('v1-key', ttl => '1 second');
ROLLBACK;
SELECT idem_consume_message('km', 'v1-id', ttl => '1 second');
SELECT pg_temp.wait_rows_ended();
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT to_regclass('idempotency.keys_memory') IS NULL AS no_memory_table;

-- with memory
SET idempotency.key_memory = '1h';
BEGIN;
SELECT status FROM idem_claim('done', ttl => '1 second');
SELECT idem_complete('done', 201, '{"id": 1}');
SELECT status FROM idem_claim('given-up', ttl => '1 second');
SELECT idem_release('given-up');
COMMIT;
BEGIN;
SELECT token AS moved_token FROM idem_claim('moved', ttl => '1 second') \gset
SELECT idem_complete('moved', 200);
COMMIT;
SELECT digest AS moved_digest FROM idempotency.keys WHERE token = :moved_token \gset
SELECT status FROM idem_claim('held', ttl => '1 second', lease => '1 second');
SELECT idem_consume_message('km', 'id-1', ttl => '1 second');
SELECT idem_consume_messages('km', ARRAY['id-2', 'id-3'], ttl => '1 second');
SELECT pg_temp.wait_rows_ended();

-- expired, the partition not dropped yet: remembered
SELECT * FROM idem_claim('done');
SELECT status FROM idem_claim('held');
SELECT * FROM idem_lookup('done');
SELECT status FROM idem_lookup('held');
SELECT idem_consume_message('km', 'id-1');
SELECT idem_consume_messages('km', ARRAY['id-2', 'id-3', 'id-4']);
BEGIN;
-- a released key ran nothing: claimed afresh
SELECT status FROM idem_claim('given-up', ttl => '1 second');
-- a key never seen: claimed
SELECT status FROM idem_claim('never-seen', ttl => '1 second');
SELECT idem_release('given-up');
SELECT idem_release('never-seen');
COMMIT;
-- a key that ran stays remembered through a newer version of it: imported
-- in progress over its expired row, then released (nothing ran under that
-- version, but the key's first one ran)
SELECT status FROM idem_claim('moved');
SELECT idempotency.import_key(ROW(current_user, :'moved_digest'::uuid,
         now() + interval '1 second', 'in_progress'::text, :moved_token + 1,
         now(), now() + interval '500 milliseconds', NULL::bytea, NULL::text,
         NULL::int, NULL::jsonb));
SELECT status, token = :moved_token + 1 AS imported FROM idem_lookup('moved');
SELECT idem_release('moved', token => :moved_token + 1);

-- the partitions dropped: their keys go to the memory
SELECT pg_temp.wait_rows_ended();
-- (the import expired too: the key is remembered by its first version)
SELECT status FROM idem_claim('moved');
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) AS ledger_rows FROM idempotency.keys;
SELECT count(*) > 0 AS pieces FROM idempotency.keys_memory;
SELECT count(*) > 0 AS pieces FROM idempotency.messages_memory;
SELECT * FROM idem_claim('done');
SELECT * FROM idem_claim('held', wait => true);
SELECT * FROM idem_lookup('done');
SELECT status FROM idem_claim('moved');
-- released keys are not remembered
BEGIN;
SELECT status FROM idem_claim('never-seen');
ROLLBACK;
SELECT * FROM idem_lookup('nothing');
SELECT idem_consume_message('km', 'id-1');
SELECT idem_consume_messages('km', ARRAY['id-2', 'id-3', 'id-4', 'id-5']);
-- another scope, another consumer: not remembered
BEGIN;
SELECT status FROM idem_claim('done', scope => 'other', ttl => '1 second');
ROLLBACK;
SELECT idem_consume_message('other', 'id-1', ttl => '1 second');
-- the claim answered "expired" wrote nothing
SELECT count(*) AS rows_of_done FROM idempotency.keys
 WHERE expires_at > now() - interval '1 hour' AND state = 'c';

-- another role holds none of them
CREATE ROLE km_other;
GRANT USAGE ON SCHEMA idempotency TO km_other;
SET ROLE km_other;
BEGIN;
SELECT status FROM idem_claim('done', ttl => '1 second');
ROLLBACK;
SELECT idem_consume_message('km', 'id-1', ttl => '1 second');
RESET ROLE;

-- a session with key_memory 0 gets the v1 answer
BEGIN;
SET LOCAL idempotency.key_memory = 0;
SELECT status FROM idem_claim('done', ttl => '1 second');
SELECT idem_consume_message('km', 'id-3', ttl => '1 second');
ROLLBACK;
SELECT status FROM idem_claim('done');

-- memory is for superusers to set
SET ROLE km_other;
SET idempotency.key_memory = '1d';
RESET ROLE;

-- the memory passes: its pieces are dropped, the keys forgotten (a
-- piece's range is one second wide, its expires_at its lower bound)
SELECT pg_temp.wait_rows_ended();
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) AS ledger_rows FROM idempotency.keys;
SELECT count(*) AS ledger_rows FROM idempotency.messages;
SET idempotency.key_memory = '1s';
DO $$
BEGIN
  WHILE clock_timestamp() <= (SELECT max(expires_at) + interval '2 seconds'
                                FROM (SELECT expires_at FROM idempotency.keys_memory
                                      UNION ALL
                                      SELECT expires_at FROM idempotency.messages_memory) m) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
-- a piece this session itself reads (a cursor of its transaction) is
-- left for the next run, and the run goes on (before, it failed: cannot
-- DROP TABLE "keys_memory_..." because it is being used by active queries
-- in this session)
BEGIN;
DECLARE pieces CURSOR FOR SELECT 1 AS one FROM idempotency.keys_memory;
FETCH 1 FROM pieces;
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) > 0 AS pieces_kept FROM idempotency.keys_memory;
SELECT count(*) AS pieces_left FROM idempotency.messages_memory;
CLOSE pieces;
COMMIT;
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) AS pieces_left FROM idempotency.keys_memory;
SELECT count(*) AS pieces_left FROM idempotency.messages_memory;
BEGIN;
SELECT status FROM idem_claim('done', ttl => '1 second');
ROLLBACK;
SELECT idem_consume_message('km', 'id-2', ttl => '1 second');

RESET idempotency.key_memory;
REVOKE USAGE ON SCHEMA idempotency FROM km_other;
\c :regress_db
DROP DATABASE key_memory_regress;
DROP ROLE km_other;
