/* idempotency--0.3.0--0.3.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.1'" to load this file. \quit

-- 0.3.1 is a security release (see CHANGELOG.md): no object changes
-- shape.  Default privileges of the extension's owner were applied to the
-- ledger tables and to the extension's objects, so that a reporting role,
-- say, could read every role's stored responses, fingerprints and
-- digests, call idempotency.export_keys() and import_key(), or create
-- tables in schema idempotency.  This script takes back every privilege on
-- the ledger tables and their partitions from everyone but their owner
-- (the library's maintenance keeps them that way from now on), and every
-- privilege on the extension's objects that the default privileges of
-- their owner account for and a fresh install does not give.  It grants
-- nothing: a privilege you took away stays away, and one you granted on
-- purpose stays too (unless your default privileges give the same).
-- Later update scripts do this only for the objects they make.

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

-- Privileges.  PostgreSQL applies the default privileges of the role that
-- runs this script (ALTER DEFAULT PRIVILEGES FOR ROLE ... GRANT ...) to
-- every object it makes: take back each privilege on a member of the
-- extension that those default privileges account for and the statements
-- of the install script do not give, so that every member has exactly the
-- privileges of a fresh install in a plain database.  A privilege the
-- default privileges do not account for (one you granted on purpose,
-- GRANT EXECUTE ON FUNCTION idem_maintain() TO ..., say) stays, and
-- nothing is ever granted here.  Extension scripts run with
-- search_path = pg_catalog, pg_temp; the names are qualified all the same.
DO $privileges$
DECLARE
    item record;
BEGIN
    FOR item IN
        WITH members (kind, objid, name, acl, owner, nsp) AS (
            SELECT 'f', p.oid, pg_catalog.format('FUNCTION %s', p.oid::pg_catalog.regprocedure),
                   p.proacl, p.proowner, p.pronamespace
              FROM pg_catalog.pg_proc AS p
            UNION ALL
            SELECT 'r', c.oid, pg_catalog.format('TABLE %s', c.oid::pg_catalog.regclass),
                   c.relacl, c.relowner, c.relnamespace
              FROM pg_catalog.pg_class AS c
            UNION ALL
            SELECT 'T', t.oid, pg_catalog.format('TYPE %s', t.oid::pg_catalog.regtype),
                   t.typacl, t.typowner, t.typnamespace
              FROM pg_catalog.pg_type AS t
        ),
        extension_members AS (
            SELECT m.*
              FROM members AS m
              JOIN pg_catalog.pg_depend AS d
                ON d.objid OPERATOR(pg_catalog.=) m.objid
               AND d.classid OPERATOR(pg_catalog.=) CASE m.kind
                       WHEN 'f' THEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                       WHEN 'r' THEN 'pg_catalog.pg_class'::pg_catalog.regclass
                       ELSE 'pg_catalog.pg_type'::pg_catalog.regclass END
             WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
               AND d.refobjid OPERATOR(pg_catalog.=)
                   (SELECT e.oid FROM pg_catalog.pg_extension AS e
                     WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
               AND d.deptype OPERATOR(pg_catalog.=) 'e'
            UNION ALL
            SELECT 'n', n.oid, pg_catalog.format('SCHEMA %I', n.nspname), n.nspacl, n.nspowner,
                   0::pg_catalog.oid
              FROM pg_catalog.pg_namespace AS n
             WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'
        ),
        expected (kind, objid, grantee, privilege) AS (VALUES
            ('f', 'pg_catalog.idem_consume_message(text,text,interval)'::pg_catalog.regprocedure::pg_catalog.oid, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_consume_messages(text,text[],interval)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_claim(text,jsonb,text,interval,interval,boolean)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_complete(text,integer,jsonb,text,bigint)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_checkpoint(text,text,text,bigint)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_release(text,text,bigint)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'pg_catalog.idem_lookup(text,text)'::pg_catalog.regprocedure, 'PUBLIC', 'EXECUTE'),
            ('f', 'idempotency.partition_info()'::pg_catalog.regprocedure, 'pg_monitor', 'EXECUTE'),
            ('f', 'idempotency.stats_info()'::pg_catalog.regprocedure, 'pg_monitor', 'EXECUTE'),
            ('r', 'idempotency.partitions'::pg_catalog.regclass, 'pg_monitor', 'SELECT'),
            ('r', 'idempotency.stats'::pg_catalog.regclass, 'pg_monitor', 'SELECT'),
            ('T', 'idempotency.claim_result'::pg_catalog.regtype, 'PUBLIC', 'USAGE'),
            ('T', 'idempotency.key_record'::pg_catalog.regtype, 'PUBLIC', 'USAGE'),
            ('T', 'idempotency.message_record'::pg_catalog.regtype, 'PUBLIC', 'USAGE'),
            ('n', 'idempotency'::pg_catalog.regnamespace, 'pg_monitor', 'USAGE'))
        SELECT m.name, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
          FROM extension_members AS m,
               pg_catalog.aclexplode(m.acl) AS a
         WHERE a.grantee OPERATOR(pg_catalog.<>) m.owner
           AND EXISTS (
               SELECT FROM pg_catalog.pg_default_acl AS da,
                           pg_catalog.aclexplode(da.defaclacl) AS g
                WHERE da.defaclrole OPERATOR(pg_catalog.=) m.owner
                  AND da.defaclobjtype OPERATOR(pg_catalog.=) m.kind::pg_catalog."char"
                  AND da.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0, m.nsp]::pg_catalog.oid[])
                  AND g.grantee OPERATOR(pg_catalog.=) a.grantee
                  AND g.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
           AND NOT EXISTS (
               SELECT FROM expected AS x
                WHERE x.kind OPERATOR(pg_catalog.=) m.kind
                  AND x.objid OPERATOR(pg_catalog.=) m.objid
                  AND x.privilege OPERATOR(pg_catalog.=) a.privilege_type
                  AND x.grantee OPERATOR(pg_catalog.=)
                      CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                           ELSE pg_catalog.pg_get_userbyid(a.grantee)::pg_catalog.text END)
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE',
                                  item.privilege_type, item.name, item.grantee);
    END LOOP;
END
$privileges$;
