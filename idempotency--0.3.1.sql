/* idempotency--0.3.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- Storage.  The ledger tables in this schema are made by the extension on
-- first use (they are not members of the extension, so that pg_dump and
-- pg_restore carry them and their run-time partitions); ordinary roles
-- cannot read or write them.
CREATE SCHEMA idempotency;
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

-- Idempotency keys

-- idem_claim()'s result.  A named row type rather than OUT parameters:
-- the executor then takes the result's shape from the type cache instead
-- of building it from pg_proc at every execution.
CREATE TYPE idempotency.claim_result AS (
    status         text,
    token          bigint,
    recovery_point text,
    response_code  integer,
    response_body  jsonb,
    expires_at     timestamptz
);

COMMENT ON TYPE idempotency.claim_result IS
'what idem_claim() answers: status, token, recovery_point, response_code, response_body, expires_at';

CREATE FUNCTION pg_catalog.idem_claim(key text,
                                      request jsonb DEFAULT NULL,
                                      scope text DEFAULT '',
                                      ttl interval DEFAULT NULL,
                                      lease interval DEFAULT NULL,
                                      wait boolean DEFAULT false)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409) or mismatch (422)';

CREATE FUNCTION pg_catalog.idem_complete(key text,
                                         response_code integer,
                                         response_body jsonb DEFAULT NULL,
                                         scope text DEFAULT '',
                                         token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_complete(text, integer, jsonb, text, bigint) IS
'stores the response of a claimed idempotency key and marks it completed';

CREATE FUNCTION pg_catalog.idem_checkpoint(key text,
                                           recovery_point text,
                                           scope text DEFAULT '',
                                           token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_checkpoint(text, text, text, bigint) IS
'records the recovery point reached by the holder of an idempotency key';

CREATE FUNCTION pg_catalog.idem_release(key text,
                                        scope text DEFAULT '',
                                        token bigint DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_release(text, text, bigint) IS
'gives up a claimed idempotency key so that a retry starts fresh';

CREATE FUNCTION pg_catalog.idem_lookup(key text,
                                       scope text DEFAULT '')
RETURNS TABLE (status text,
               token bigint,
               recovery_point text,
               response_code integer,
               response_body jsonb,
               claimed_at timestamptz,
               expires_at timestamptz,
               lease_expires_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION pg_catalog.idem_lookup(text, text) IS
'the calling role''s own live record of one idempotency key, for support work';

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

CREATE FUNCTION idempotency.stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION idempotency.stats_reset() IS
'zeroes the statistics of every database';

-- Lanes (see src/relocate.c)

CREATE FUNCTION idempotency.relocate_lanes(always boolean DEFAULT true)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_relocate_lanes'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.relocate_lanes(boolean) IS
'moves ledger rows written by 0.2.0 on a big-endian machine to the lanes 0.3.0 looks them up in';

-- Moving tenants between nodes (see src/transfer.c)

CREATE TYPE idempotency.key_record AS (
    role             name,
    digest           uuid,
    expires_at       timestamptz,
    status           text,
    token            bigint,
    claimed_at       timestamptz,
    lease_expires_at timestamptz,
    fingerprint      bytea,
    recovery_point   text,
    response_code    integer,
    response_body    jsonb
);

COMMENT ON TYPE idempotency.key_record IS
'one live idempotency key as idempotency.export_keys() gives it and idempotency.import_key() takes it';

CREATE TYPE idempotency.message_record AS (
    role       name,
    digest     uuid,
    expires_at timestamptz
);

COMMENT ON TYPE idempotency.message_record IS
'one consumed message id as idempotency.export_messages() gives it and idempotency.import_message() takes it';

CREATE FUNCTION idempotency.export_keys(scopes text[] DEFAULT NULL)
RETURNS SETOF idempotency.key_record
AS 'MODULE_PATHNAME', 'idem_export_keys'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_keys(text[]) IS
'the live idempotency keys of the given scopes (all if NULL), of every role, for idempotency.import_key() on another node';

CREATE FUNCTION idempotency.import_key(k record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_key'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_key(record) IS
'stores an exported idempotency key unless this node has a version at least as new: inserted, replaced, kept or expired';

CREATE FUNCTION idempotency.export_messages(consumers text[] DEFAULT NULL)
RETURNS SETOF idempotency.message_record
AS 'MODULE_PATHNAME', 'idem_export_messages'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_messages(text[]) IS
'the live consumed message ids of the given consumers (all if NULL), of every role, for idempotency.import_message() on another node';

CREATE FUNCTION idempotency.import_message(m record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_message'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_message(record) IS
'records an exported message id as consumed unless this node has it already: inserted, kept or expired';

-- Privileges.  Exactly the grants below, whatever default privileges
-- (ALTER DEFAULT PRIVILEGES FOR ROLE ...) gave the objects this script
-- made: every member of the extension is first taken back to its owner
-- alone.  Extension scripts run with search_path = pg_catalog, pg_temp;
-- the names here are qualified all the same.
DO $privileges$
DECLARE
    obj record;
    grantee oid;
BEGIN
    FOR obj IN
        SELECT pg_catalog.format('FUNCTION %s', p.oid::pg_catalog.regprocedure) AS name,
               COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner)) AS acl,
               p.proowner AS owner
          FROM pg_catalog.pg_proc AS p
         WHERE p.oid OPERATOR(pg_catalog.=) ANY (
               SELECT d.objid FROM pg_catalog.pg_depend AS d
                WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension AS e
                                                          WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
                  AND d.deptype OPERATOR(pg_catalog.=) 'e')
        UNION ALL
        SELECT pg_catalog.format('TABLE %s', c.oid::pg_catalog.regclass),
               COALESCE(c.relacl, pg_catalog.acldefault('r', c.relowner)),
               c.relowner
          FROM pg_catalog.pg_class AS c
         WHERE c.relkind OPERATOR(pg_catalog.=) 'v'
           AND c.oid OPERATOR(pg_catalog.=) ANY (
               SELECT d.objid FROM pg_catalog.pg_depend AS d
                WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension AS e
                                                          WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
                  AND d.deptype OPERATOR(pg_catalog.=) 'e')
        UNION ALL
        SELECT pg_catalog.format('TYPE %s', t.oid::pg_catalog.regtype),
               COALESCE(t.typacl, pg_catalog.acldefault('T', t.typowner)),
               t.typowner
          FROM pg_catalog.pg_type AS t
         WHERE t.oid OPERATOR(pg_catalog.=) ANY (
               SELECT d.objid FROM pg_catalog.pg_depend AS d
                WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
                  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                  AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension AS e
                                                          WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
                  AND d.deptype OPERATOR(pg_catalog.=) 'e')
        UNION ALL
        SELECT pg_catalog.format('SCHEMA %I', n.nspname),
               COALESCE(n.nspacl, pg_catalog.acldefault('n', n.nspowner)),
               n.nspowner
          FROM pg_catalog.pg_namespace AS n
         WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
    LOOP
        FOR grantee IN SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(obj.acl) AS a
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s CASCADE', obj.name,
                CASE WHEN grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grantee)) END);
        END LOOP;
        EXECUTE pg_catalog.format('GRANT ALL ON %s TO %I', obj.name,
                                  pg_catalog.pg_get_userbyid(obj.owner));
    END LOOP;
END
$privileges$;

-- The API: every role (see doc/security.md to restrict it)
GRANT EXECUTE ON FUNCTION
    pg_catalog.idem_consume_message(text, text, interval),
    pg_catalog.idem_consume_messages(text, text[], interval),
    pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean),
    pg_catalog.idem_complete(text, integer, jsonb, text, bigint),
    pg_catalog.idem_checkpoint(text, text, text, bigint),
    pg_catalog.idem_release(text, text, bigint),
    pg_catalog.idem_lookup(text, text)
  TO PUBLIC;
GRANT USAGE ON TYPE
    idempotency.claim_result,
    idempotency.key_record,
    idempotency.message_record
  TO PUBLIC;

-- Monitoring: the views and what they read, never the ledgers
GRANT USAGE ON SCHEMA idempotency TO pg_monitor;
GRANT SELECT ON idempotency.partitions, idempotency.stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION
    idempotency.partition_info(),
    idempotency.stats_info()
  TO pg_monitor;

-- Everything else (idem_maintain(), stats_reset(), relocate_lanes(),
-- export_keys(), import_key(), export_messages(), import_message()):
-- the extension's owner and superusers only, until granted.
