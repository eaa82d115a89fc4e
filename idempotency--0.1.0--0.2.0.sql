/* idempotency--0.1.0--0.2.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

-- 0.2.0 adds the background worker (no SQL objects: it comes with
-- shared_preload_libraries = 'idempotency') and the statistics it and the
-- SQL functions keep in shared memory.  Data and behaviour of 0.1.0 are
-- unchanged.

-- Statistics (shared memory; only with shared_preload_libraries)

CREATE FUNCTION idempotency.stats_info(OUT dboid oid,
                                       OUT claims bigint,
                                       OUT replays bigint,
                                       OUT conflicts bigint,
                                       OUT mismatches bigint,
                                       OUT consumed bigint,
                                       OUT duplicates bigint,
                                       OUT partitions_created bigint,
                                       OUT partitions_dropped bigint,
                                       OUT maintenance_runs bigint,
                                       OUT last_maintenance timestamptz,
                                       OUT last_maintenance_error text,
                                       OUT last_error_at timestamptz,
                                       OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_info'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

REVOKE ALL ON FUNCTION idempotency.stats_info() FROM PUBLIC;

CREATE VIEW idempotency.stats AS
SELECT d.datname,
       s.claims, s.replays, s.conflicts, s.mismatches,
       s.consumed, s.duplicates,
       s.partitions_created, s.partitions_dropped,
       s.maintenance_runs, s.last_maintenance,
       s.last_maintenance_error, s.last_error_at,
       s.stats_reset
  FROM idempotency.stats_info() AS s
  LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.dboid;

COMMENT ON VIEW idempotency.stats IS
'per-database counters since server start or idempotency.stats_reset() (needs shared_preload_libraries)';

GRANT SELECT ON idempotency.stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.stats_info() TO pg_monitor;

CREATE FUNCTION idempotency.stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION idempotency.stats_reset() IS
'zeroes the statistics of every database';

REVOKE ALL ON FUNCTION idempotency.stats_reset() FROM PUBLIC;
