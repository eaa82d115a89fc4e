--
-- Statistics and the worker's setting without shared_preload_libraries
-- (the pg_regress instance does not preload the library; the worker, the
-- counters and a preloaded server are tested in test/t/030_worker.pl)
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

-- the view and the reset refuse, saying what is missing ...
SELECT * FROM idempotency.stats;
SELECT idempotency.stats_reset();
-- ... with SQLSTATE 55000
DO $$
BEGIN
  PERFORM * FROM idempotency.stats;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
  RAISE NOTICE 'stats: 55000';
END $$;
DO $$
BEGIN
  PERFORM idempotency.stats_reset();
EXCEPTION WHEN object_not_in_prerequisite_state THEN
  RAISE NOTICE 'stats_reset: 55000';
END $$;

-- the objects exist, and only pg_monitor may read the statistics
SELECT has_table_privilege('pg_monitor', 'idempotency.stats', 'SELECT') AS monitor_reads,
       has_table_privilege('public', 'idempotency.stats', 'SELECT') AS public_reads,
       has_function_privilege('public', 'idempotency.stats_reset()', 'EXECUTE') AS public_resets;

-- the digest filters: none without preloading (nor their setting,
-- idempotency.filter_memory, which only a preloaded library defines)
SELECT count(*) AS filters FROM idempotency.filter_info();
SELECT has_function_privilege('pg_monitor', 'idempotency.filter_info()', 'EXECUTE') AS monitor_lists,
       has_function_privilege('public', 'idempotency.filter_info()', 'EXECUTE') AS public_lists;
SELECT count(*) AS filter_memory_settings
  FROM pg_settings WHERE name = 'idempotency.filter_memory';

-- idempotency.naptime: seconds, 1 s .. 1 day, only in postgresql.conf
SELECT name, setting, unit, context, min_val, max_val
  FROM pg_settings WHERE name = 'idempotency.naptime';
SET idempotency.naptime = '10s';
-- (only the SQLSTATE of the range errors: PostgreSQL 17 words them with
-- units; the range itself is pg_settings' min_val and max_val above)
\set VERBOSITY sqlstate
ALTER SYSTEM SET idempotency.naptime = 0;
ALTER SYSTEM SET idempotency.naptime = '2d';
\set VERBOSITY default
ALTER SYSTEM SET idempotency.naptime = 'soon';
