/* idempotency--0.1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- Storage.  The ledger tables in this schema are made by the extension on
-- first use (they are not members of the extension, so that pg_dump and
-- pg_restore carry them and their run-time partitions); ordinary roles
-- cannot read or write them.
CREATE SCHEMA idempotency;
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;
COMMENT ON SCHEMA idempotency IS 'storage of the idempotency extension';

-- Processed-message ledger

CREATE FUNCTION pg_catalog.idem_consume_message(consumer text,
                                                message_id text,
                                                ttl interval DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume_message'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_consume_message(text, text, interval) IS
'records a message as consumed in this transaction: true on first delivery, false if already consumed';

CREATE FUNCTION pg_catalog.idem_consume_messages(consumer text,
                                                 message_ids text[],
                                                 ttl interval DEFAULT NULL)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'idem_consume_messages'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION pg_catalog.idem_consume_messages(text, text[], interval) IS
'records a batch of messages as consumed in this transaction and returns the new ones, in input order';

-- Maintenance

CREATE FUNCTION pg_catalog.idem_maintain(OUT partitions_created integer,
                                         OUT partitions_dropped integer)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_maintain'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_maintain() IS
'makes partitions ahead and drops expired ones; safe to call concurrently (for pg_cron)';

REVOKE ALL ON FUNCTION pg_catalog.idem_maintain() FROM PUBLIC;

-- Observability

CREATE FUNCTION idempotency.partition_info(OUT table_name text,
                                           OUT partition regclass,
                                           OUT lanes integer,
                                           OUT lane integer,
                                           OUT lower_bound timestamptz,
                                           OUT upper_bound timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_partition_info'
LANGUAGE C STABLE PARALLEL RESTRICTED;

REVOKE ALL ON FUNCTION idempotency.partition_info() FROM PUBLIC;

CREATE VIEW idempotency.partitions AS
SELECT p.table_name,
       p.partition,
       p.lanes,
       p.lane,
       p.lower_bound,
       p.upper_bound,
       p.upper_bound AS droppable_at,
       p.upper_bound <= pg_catalog.now() AS expired,
       CASE WHEN c.reltuples < 0 THEN NULL
            ELSE c.reltuples::bigint END AS rows_estimate,
       pg_catalog.pg_total_relation_size(p.partition) AS bytes
  FROM idempotency.partition_info() AS p
  JOIN pg_catalog.pg_class AS c ON c.oid = p.partition;

COMMENT ON VIEW idempotency.partitions IS
'partitions of the ledgers: lane, range of expiry times, size, and when each becomes droppable';

GRANT USAGE ON SCHEMA idempotency TO pg_monitor;
GRANT SELECT ON idempotency.partitions TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.partition_info() TO pg_monitor;
