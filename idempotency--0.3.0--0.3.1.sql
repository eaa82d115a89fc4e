/* idempotency--0.3.0--0.3.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.1'" to load this file. \quit

-- 0.3.1 is a security release (see CHANGELOG.md): no object changes
-- shape.  This script gives every member of the extension exactly the
-- privileges a fresh install has, and takes back every privilege on the
-- ledger tables and their partitions from everyone but their owner:
-- default privileges of the extension's owner were applied to both by
-- 0.3.0, so roles such as a reporting role could read every role's
-- stored responses, fingerprints and digests.  The library's maintenance
-- keeps the ledgers that way from now on.

DO $ledgers$
DECLARE
    t record;
    grantee oid;
BEGIN
    FOR t IN
        SELECT c.oid::pg_catalog.regclass AS rel, c.relacl, c.relowner
          FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog."char"[])
           AND c.relacl IS NOT NULL
    LOOP
        FOR grantee IN
            SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(t.relacl) AS a
             WHERE a.grantee OPERATOR(pg_catalog.<>) t.relowner
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM %s CASCADE', t.rel,
                CASE WHEN grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grantee)) END);
        END LOOP;
    END LOOP;
END
$ledgers$;

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
