--
-- Moving the key memory with a tenant: idempotency.export_key_memory(),
-- import_key_memory(), export_message_memory(), import_message_memory()
--
-- Two databases of their own, a tenant's remembered keys and ids carried
-- from one to the other through psql variables.
\set regress_db :DBNAME
CREATE DATABASE km_transfer_src;
CREATE DATABASE km_transfer_dst;
CREATE ROLE regress_km_app;
CREATE ROLE regress_km_mover;
\c km_transfer_src
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO regress_km_app;

-- partitions one second wide, keys and messages that expire within it
SET idempotency.partition_interval = '1s';
SET idempotency.key_ttl = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.premake = 0;
SET idempotency.key_memory = '1h';
SELECT partitions_created > 0 AS made FROM idem_maintain();

CREATE FUNCTION pg_temp.wait_rows_ended() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  WHILE clock_timestamp() <= (SELECT max(p.upper_bound)
                                FROM idempotency.partitions p
                               WHERE EXISTS (SELECT 1 FROM idempotency.keys k WHERE k.tableoid = p.partition)
                                  OR EXISTS (SELECT 1 FROM idempotency.messages m WHERE m.tableoid = p.partition)) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;

-- two tenants' keys (one released: ran nothing, not remembered), ids of
-- two consumers, all of the application role
SET ROLE regress_km_app;
BEGIN;
SELECT count(*) FROM (SELECT idem_claim('key-' || g, scope => 'tenant-' || g % 2, ttl => '1 second'),
                             idem_complete('key-' || g, 200, scope => 'tenant-' || g % 2)
                        FROM generate_series(1, 6) g) s;
SELECT status FROM idem_claim('given-up', scope => 'tenant-1', ttl => '1 second');
SELECT idem_release('given-up', scope => 'tenant-1');
COMMIT;
SELECT count(*) FROM idem_consume_messages('consumer-1', ARRAY['m1', 'm2', 'm3'], ttl => '1 second');
SELECT count(*) FROM idem_consume_messages('consumer-2', ARRAY['m1', 'm4'], ttl => '1 second');
RESET ROLE;
SELECT pg_temp.wait_rows_ended();

-- expired, still in the ledger: exported from there; after the drop, from
-- the memory's pieces, the same pairs
CREATE TEMP TABLE before_drop AS
  SELECT role, digest FROM idempotency.export_key_memory(ARRAY['tenant-1']);
SELECT role, count(*) FROM before_drop GROUP BY role;
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) AS ledger_rows FROM idempotency.keys;
SELECT count(*) AS same_pairs,
       count(*) FILTER (WHERE b.digest IS NULL) AS only_after,
       (SELECT count(*) FROM before_drop) AS before
  FROM idempotency.export_key_memory(ARRAY['tenant-1']) a
  LEFT JOIN before_drop b USING (role, digest);
SELECT count(*) AS all_scopes FROM idempotency.export_key_memory();
SELECT count(*) AS no_scope FROM idempotency.export_key_memory(ARRAY[]::text[]);
SELECT count(*) AS consumer_1 FROM idempotency.export_message_memory(ARRAY['consumer-1']);
-- every pair expired by the end of its partition, which has passed
SELECT bool_and(expired_by <= now()) AS ended FROM idempotency.export_key_memory();
-- a session without memory remembers nothing, so exports nothing
BEGIN;
SET LOCAL idempotency.key_memory = 0;
SELECT count(*) AS without_memory FROM idempotency.export_key_memory();
ROLLBACK;

-- carried as text in psql variables
SET DateStyle = ISO;  -- text that reads back in any time zone (not "SST")
SELECT string_agg(pg_catalog.format('(%L, %L, %L)', role, digest, expired_by), ', ') AS keys
  FROM idempotency.export_key_memory(ARRAY['tenant-1']) \gset
SELECT string_agg(pg_catalog.format('(%L, %L, %L)', role, digest, expired_by), ', ') AS ids
  FROM idempotency.export_message_memory(ARRAY['consumer-1']) \gset

\c km_transfer_dst
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO regress_km_app;
SET idempotency.key_memory = '1h';
CREATE TEMP TABLE keys_in (r idempotency.memory_record);
CREATE TEMP TABLE ids_in (r idempotency.memory_record);
INSERT INTO keys_in SELECT ROW(v.*)::idempotency.memory_record FROM (VALUES :keys) v;
INSERT INTO ids_in SELECT ROW(v.*)::idempotency.memory_record FROM (VALUES :ids) v;

-- before the import: the keys are new here
SET ROLE regress_km_app;
BEGIN;
SELECT status FROM idem_claim('key-1', scope => 'tenant-1', ttl => '1 second');
ROLLBACK;
RESET ROLE;

SELECT idempotency.import_message_memory(r) AS outcome, count(*) FROM ids_in GROUP BY 1;
-- one key first: the piece of imported keys is made
SELECT idempotency.import_key_memory(r) AS outcome
  FROM (SELECT r FROM keys_in ORDER BY (r).digest LIMIT 1) k;
-- a call reads the memory (without preloading, this backend's own filter
-- of it is built, with that one key)
SET ROLE regress_km_app;
BEGIN;
SELECT status FROM idem_claim('never-seen', scope => 'tenant-1', ttl => '1 second');
ROLLBACK;
RESET ROLE;
-- the others go into the same piece: the filter is built again
SELECT idempotency.import_key_memory(r) AS outcome, count(*) FROM keys_in GROUP BY 1 ORDER BY 1;
-- again: remembered already
SELECT idempotency.import_key_memory(r) AS outcome, count(*) FROM keys_in GROUP BY 1;

-- the tenant's keys answer "expired" here, writing nothing; the other
-- tenant's, the released key and another consumer's ids were not moved
SET ROLE regress_km_app;
SELECT * FROM idem_claim('key-1', scope => 'tenant-1');
SELECT status FROM idem_claim('key-3', scope => 'tenant-1');
SELECT * FROM idem_lookup('key-5', scope => 'tenant-1');
BEGIN;
SELECT status FROM idem_claim('key-2', scope => 'tenant-0', ttl => '1 second');
SELECT status FROM idem_claim('given-up', scope => 'tenant-1', ttl => '1 second');
ROLLBACK;
SELECT idem_consume_message('consumer-1', 'm2');
SELECT idem_consume_messages('consumer-1', ARRAY['m1', 'm3', 'm9']);
BEGIN;
SELECT idem_consume_message('consumer-2', 'm4', ttl => '1 second');
ROLLBACK;
RESET ROLE;
SELECT count(*) AS ledger_rows FROM idempotency.keys;

-- kept in a piece of imported keys, with its index; exported again as
-- they came
SELECT c.relname ~ '^keys_memory_import_[0-9]{8}$' AS import_piece,
       (SELECT count(*) FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid) AS indexes
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'idempotency.keys_memory'::regclass;
SELECT count(*) AS same_records
  FROM idempotency.export_key_memory(ARRAY['tenant-1']) e
  JOIN keys_in k ON (k.r).role = e.role AND (k.r).digest = e.digest
                AND (k.r).expired_by = e.expired_by;

-- a record past this node's memory is not remembered; without memory
-- nothing is
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(),
                                         now() - interval '2 hours')::idempotency.memory_record);
BEGIN;
SET LOCAL idempotency.key_memory = 0;
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(),
                                         now())::idempotency.memory_record);
ROLLBACK;

-- bad records: nothing written
SELECT idempotency.import_key_memory(ROW('regress_km_app', NULL, now())::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(), NULL)::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW(NULL, gen_random_uuid(), now())::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW('regress_km_nobody', gen_random_uuid(), now())::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(), 'infinity')::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(),
                                         now() + interval '100 years')::idempotency.memory_record);
SELECT idempotency.import_key_memory(ROW('regress_km_app'::name, gen_random_uuid()));
SELECT idempotency.import_key_memory(ROW('regress_km_app'::name, 'a text'::text, now()));
SELECT idempotency.export_key_memory(ARRAY[NULL]::text[]);
SELECT idempotency.export_key_memory(ARRAY[['a'], ['b']]);

-- who may move it: nobody without a grant; a granted role only into the
-- scope of a role whose privileges it has (the trust model's line "no
-- role imports memory into another role's scope")
GRANT USAGE ON SCHEMA idempotency TO regress_km_mover;
SET ROLE regress_km_mover;
SELECT count(*) FROM idempotency.export_key_memory();
SELECT idempotency.import_key_memory(ROW('regress_km_mover', gen_random_uuid(),
                                         now())::idempotency.memory_record);
RESET ROLE;
GRANT EXECUTE ON FUNCTION idempotency.import_key_memory(record),
                          idempotency.import_message_memory(record)
   TO regress_km_mover;
SET ROLE regress_km_mover;
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(),
                                         now())::idempotency.memory_record);
SELECT idempotency.import_message_memory(ROW('regress_km_app', gen_random_uuid(),
                                             now())::idempotency.memory_record);
-- its own scope: allowed
SELECT idempotency.import_key_memory(ROW('regress_km_mover', gen_random_uuid(),
                                         now())::idempotency.memory_record);
RESET ROLE;
-- a member of the role has its privileges
GRANT regress_km_app TO regress_km_mover;
SET ROLE regress_km_mover;
SELECT idempotency.import_key_memory(ROW('regress_km_app', gen_random_uuid(),
                                         now())::idempotency.memory_record);
RESET ROLE;
REVOKE regress_km_app FROM regress_km_mover;
-- the pieces are the owner's alone
SET ROLE regress_km_mover;
SELECT count(*) FROM idempotency.keys_memory;
RESET ROLE;

\c :regress_db
DROP DATABASE km_transfer_src;
DROP DATABASE km_transfer_dst;
DROP ROLE regress_km_app;
DROP ROLE regress_km_mover;
