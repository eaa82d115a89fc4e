/* idempotency--0.3.1--0.4.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- 0.4.0: waiting for two-phase holders (idempotency.wait_timeout, a
-- setting: nothing here), recovering lapsed two-phase work (keep_request,
-- idem_recover) and responses beyond JSON (response headers and raw
-- bytes).  Every existing call keeps its meaning: the new parameters come
-- last with defaults, the new result columns come last.
--
-- The key ledger, if it exists, gains its new columns (NULL in every
-- existing row: no rewrite) and the partial index idem_recover() scans.
-- Building that index reads each partition of the key ledger once, while
-- claims on it wait (see doc/operations.md, "Updating").

DO $ledger$
BEGIN
    IF pg_catalog.to_regclass('idempotency.keys') IS NOT NULL THEN
        -- keep in step with ledger_defs in src/storage.c
        ALTER TABLE idempotency.keys
            ADD COLUMN kept_key pg_catalog.text,
            ADD COLUMN kept_scope pg_catalog.text,
            ADD COLUMN kept_request pg_catalog.jsonb,
            ADD COLUMN recover_at pg_catalog.timestamptz,
            ADD COLUMN response_headers pg_catalog.jsonb,
            ADD COLUMN response_raw pg_catalog.bytea;
        CREATE INDEX keys_recover_idx ON idempotency.keys (role, recover_at)
            WHERE recover_at IS NOT NULL;
    END IF;
END
$ledger$;

-- Result and record types gain their trailing columns (ALTER TYPE keeps
-- their privileges).
ALTER TYPE idempotency.claim_result
    ADD ATTRIBUTE response_headers jsonb,
    ADD ATTRIBUTE response_raw bytea;

COMMENT ON TYPE idempotency.claim_result IS
'what idem_claim() answers: status, token, recovery_point, response_code, response_body, expires_at, response_headers, response_raw';

ALTER TYPE idempotency.key_record
    ADD ATTRIBUTE kept_key text,
    ADD ATTRIBUTE kept_scope text,
    ADD ATTRIBUTE request jsonb,
    ADD ATTRIBUTE response_headers jsonb,
    ADD ATTRIBUTE response_raw bytea;

-- Functions whose parameters or result change are made anew; the old ones
-- are renamed first, their privileges carried over below, then dropped.
ALTER FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean)
    RENAME TO idem_claim_before_0_4_0;
ALTER FUNCTION pg_catalog.idem_complete(text, integer, jsonb, text, bigint)
    RENAME TO idem_complete_before_0_4_0;
ALTER FUNCTION pg_catalog.idem_lookup(text, text)
    RENAME TO idem_lookup_before_0_4_0;

CREATE FUNCTION pg_catalog.idem_claim(key text,
                                      request jsonb DEFAULT NULL,
                                      scope text DEFAULT '',
                                      ttl interval DEFAULT NULL,
                                      lease interval DEFAULT NULL,
                                      wait boolean DEFAULT false,
                                      keep_request boolean DEFAULT false)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409) or mismatch (422)';

CREATE FUNCTION pg_catalog.idem_complete(key text,
                                         response_code integer,
                                         response_body jsonb DEFAULT NULL,
                                         scope text DEFAULT '',
                                         token bigint DEFAULT NULL,
                                         response_headers jsonb DEFAULT NULL,
                                         response_raw bytea DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea) IS
'stores the response (JSON body or raw bytes, and headers) of a claimed idempotency key and marks it completed';

CREATE FUNCTION pg_catalog.idem_lookup(key text,
                                       scope text DEFAULT '')
RETURNS TABLE (status text,
               token bigint,
               recovery_point text,
               response_code integer,
               response_body jsonb,
               claimed_at timestamptz,
               expires_at timestamptz,
               lease_expires_at timestamptz,
               response_headers jsonb,
               response_raw bytea,
               request jsonb)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION pg_catalog.idem_lookup(text, text) IS
'the calling role''s own live record of one idempotency key, for support work';

CREATE FUNCTION pg_catalog.idem_recover(lease interval,
                                        scope text DEFAULT NULL,
                                        max_keys integer DEFAULT 10)
RETURNS TABLE (key text,
               scope text,
               token bigint,
               recovery_point text,
               request jsonb,
               lapsed_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_recover'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_recover(interval, text, integer) IS
'takes over the calling role''s lapsed two-phase claims made with keep_request, each by exactly one caller, oldest lapse first';

-- Privileges of the functions made here: each replacing function gets
-- exactly the privileges of the function it replaces (a DBA who revoked
-- EXECUTE on idem_claim() from PUBLIC and granted it to one role keeps
-- that), and idem_recover() those of a fresh install, EXECUTE to PUBLIC;
-- whatever the default privileges of the role running this script added
-- is taken back.  Names are qualified: see the install script.
DO $privileges$
DECLARE
    f record;
    item record;
BEGIN
    FOR f IN
        SELECT n.oid::pg_catalog.regprocedure AS fn, n.proowner, n.proacl AS newacl,
               o.proacl AS oldacl, o.oid IS NOT NULL AS replaces
          FROM (VALUES
                ('pg_catalog.idem_claim(text,jsonb,text,interval,interval,boolean,boolean)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_claim_before_0_4_0(text,jsonb,text,interval,interval,boolean)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_complete(text,integer,jsonb,text,bigint,jsonb,bytea)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_complete_before_0_4_0(text,integer,jsonb,text,bigint)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_lookup(text,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_lookup_before_0_4_0(text,text)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_recover(interval,text,integer)'::pg_catalog.regprocedure,
                 NULL)) AS v (newfn, oldfn)
          JOIN pg_catalog.pg_proc AS n ON n.oid OPERATOR(pg_catalog.=) v.newfn
          LEFT JOIN pg_catalog.pg_proc AS o ON o.oid OPERATOR(pg_catalog.=) v.oldfn
    LOOP
        -- the built-in default on both sides: nothing to do
        CONTINUE WHEN f.oldacl IS NULL AND f.newacl IS NULL;
        -- start from nothing but the owner's privileges
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC CASCADE', f.fn);
        FOR item IN
            SELECT DISTINCT a.grantee
              FROM pg_catalog.aclexplode(f.newacl) AS a
             WHERE a.grantee OPERATOR(pg_catalog.<>) f.proowner
               AND a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %I CASCADE', f.fn,
                                      pg_catalog.pg_get_userbyid(item.grantee));
        END LOOP;
        -- then what the function it replaces had (NULL: the built-in
        -- default, EXECUTE to PUBLIC), or what a fresh install gives
        IF f.oldacl IS NULL THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f.fn);
        ELSE
            FOR item IN
                SELECT a.grantee, a.privilege_type, a.is_grantable
                  FROM pg_catalog.aclexplode(f.oldacl) AS a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) f.proowner
            LOOP
                EXECUTE pg_catalog.format('GRANT %s ON FUNCTION %s TO %s%s',
                                          item.privilege_type, f.fn,
                                          CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                               ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
                                          CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$privileges$;

DROP FUNCTION pg_catalog.idem_claim_before_0_4_0(text, jsonb, text, interval, interval, boolean);
DROP FUNCTION pg_catalog.idem_complete_before_0_4_0(text, integer, jsonb, text, bigint);
DROP FUNCTION pg_catalog.idem_lookup_before_0_4_0(text, text);
