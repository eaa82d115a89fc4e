--
-- sql/security.sql -- roles, privileges and search_path.
--
--   1. role isolation: one role's keys and messages are invisible to
--      another, and the same key in two roles is two independent keys
--   2. the storage schema is closed to ordinary roles
--   3. search_path attacks by an unprivileged role: look-alike functions,
--      operators, types and tables earlier on the path are never called,
--      also not by the DDL the calls and idem_maintain() issue
--   4. names given by users are data: they never reach DDL
--
-- Runs in its own database, made here and dropped at the end (with the
-- roles it makes), so it neither depends on nor disturbs other test files.
--
\set regress_db :DBNAME
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_security;
CREATE DATABASE regress_idem_security;
\c regress_idem_security
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
RESET client_min_messages;

-- try(stmt) runs one statement and reports its SQLSTATE and message instead
-- of failing; token numbers and the times in partition names are masked
CREATE FUNCTION try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' ||
         regexp_replace(regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N'),
                        '_n?[0-9]+_f?[0-9]+_[0-9]{8}_[0-9]{6}(_[0-9]{6})?', '_L_N_T', 'g');
END $$;
GRANT EXECUTE ON FUNCTION try(text) TO PUBLIC;

CREATE ROLE regress_idem_sec_alice;
CREATE ROLE regress_idem_sec_bob;
CREATE ROLE regress_idem_sec_mallory;
CREATE ROLE regress_idem_sec_monitor IN ROLE pg_monitor;

----------------------------------------------------------------------------
-- 1. role isolation
----------------------------------------------------------------------------
SET ROLE regress_idem_sec_alice;
BEGIN;
SELECT status FROM idem_claim('shared', '{"by": "alice"}');
SELECT idem_complete('shared', 201, '{"by": "alice"}');
COMMIT;
SELECT token AS alice_token FROM idem_claim('held', lease => '1 hour') \gset
SELECT idem_checkpoint('held', 'alice-step', token => :alice_token);
SELECT token AS alice_released FROM idem_claim('released', lease => '1 hour') \gset
SELECT idem_release('released', token => :alice_released);
SELECT idem_consume_message('queue', 'm1') AS alice_m1;
SELECT * FROM idem_consume_messages('queue', ARRAY['m2', 'm3']);
RESET ROLE;

SET ROLE regress_idem_sec_bob;
-- alice's keys are not there for bob: no lookup, no complete, checkpoint or
-- release, even with her token
SELECT (SELECT count(*) FROM idem_lookup('shared')) AS shared,
       (SELECT count(*) FROM idem_lookup('held')) AS held,
       (SELECT count(*) FROM idem_lookup('released')) AS released;
SELECT label, try(stmt) FROM (VALUES
  ('complete held with her token', format('SELECT idem_complete(%L, 200, token => %s)', 'held', :alice_token)),
  ('checkpoint held, her token',   format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', 'bob', :alice_token)),
  ('release held with her token',  format('SELECT idem_release(%L, token => %s)', 'held', :alice_token)),
  ('complete shared',              $$SELECT idem_complete('shared', 500)$$),
  ('release shared',               $$SELECT idem_release('shared')$$)
) AS t(label, stmt);
-- the same key strings are bob's own, independent keys: claimed, not a
-- replay nor a mismatch nor in progress
SELECT status, token IS NOT NULL AS has_token, recovery_point, response_code
  FROM idem_claim('held', '{"by": "bob"}', lease => '1 hour');
BEGIN;
SELECT status, response_code FROM idem_claim('shared', '{"by": "bob"}');
SELECT idem_complete('shared', 202, '{"by": "bob"}');
COMMIT;
SELECT status, response_code, response_body FROM idem_claim('shared', '{"by": "bob"}');
-- a message alice consumed is new to bob
SELECT idem_consume_message('queue', 'm1') AS bob_m1;
SELECT * FROM idem_consume_messages('queue', ARRAY['m1', 'm2', 'm3', 'm4']);
RESET ROLE;

SET ROLE regress_idem_sec_alice;
-- alice's records are untouched by bob's
SELECT status, token = :alice_token AS same_token, recovery_point, response_code, response_body
  FROM idem_lookup('held');
SELECT status, response_code, response_body FROM idem_claim('shared', '{"by": "alice"}');
SELECT status FROM idem_lookup('released');
SELECT idem_consume_message('queue', 'm1') AS alice_m1_again;
SELECT count(*) AS alice_m4_new FROM idem_consume_messages('queue', ARRAY['m4']);
SELECT idem_complete('held', 200, token => :alice_token);
RESET ROLE;

-- the identity is current_user, not role membership: bob, a member of
-- alice, sees her keys only after SET ROLE alice
GRANT regress_idem_sec_alice TO regress_idem_sec_bob;
SET ROLE regress_idem_sec_bob;
SELECT status, response_code FROM idem_lookup('shared');
SET ROLE regress_idem_sec_alice;
SELECT status, response_code FROM idem_lookup('shared');
RESET ROLE;
REVOKE regress_idem_sec_alice FROM regress_idem_sec_bob;

-- one row per (role, key) and per (role, message)
SELECT role, state, count(*) FROM idempotency.keys GROUP BY role, state ORDER BY role::text, state;
SELECT role, count(*) FROM idempotency.messages GROUP BY role ORDER BY role::text;

----------------------------------------------------------------------------
-- 2. the storage schema is closed to ordinary roles
----------------------------------------------------------------------------
SELECT min(inhrelid::regclass::text) AS key_partition FROM pg_inherits
 WHERE inhparent = 'idempotency.keys'::regclass \gset
SELECT min(inhrelid::regclass::text) AS message_partition FROM pg_inherits
 WHERE inhparent = 'idempotency.messages'::regclass \gset
ANALYZE idempotency.keys, idempotency.messages;
SET ROLE regress_idem_sec_mallory;
SELECT label, try(stmt) FROM (VALUES
  ('SELECT keys',            $$SELECT count(*) FROM idempotency.keys$$),
  ('INSERT keys',            $$INSERT INTO idempotency.keys (expires_at) VALUES (now())$$),
  ('UPDATE keys',            $$UPDATE idempotency.keys SET response_code = 500$$),
  ('DELETE keys',            $$DELETE FROM idempotency.keys$$),
  ('TRUNCATE keys',          $$TRUNCATE idempotency.keys$$),
  ('LOCK keys',              $$LOCK TABLE idempotency.keys$$),
  ('ALTER keys',             $$ALTER TABLE idempotency.keys ADD COLUMN x int$$),
  ('DROP keys',              $$DROP TABLE idempotency.keys$$),
  ('SELECT messages',        $$SELECT count(*) FROM idempotency.messages$$),
  ('INSERT messages',        $$INSERT INTO idempotency.messages (expires_at) VALUES (now())$$),
  ('DELETE messages',        $$DELETE FROM idempotency.messages$$),
  ('TRUNCATE messages',      $$TRUNCATE idempotency.messages$$),
  ('SELECT key partition',   format('SELECT count(*) FROM %s', :'key_partition')),
  ('UPDATE key partition',   format('UPDATE %s SET state = %L', :'key_partition', 'c')),
  ('DELETE key partition',   format('DELETE FROM %s', :'key_partition')),
  ('TRUNCATE key partition', format('TRUNCATE %s', :'key_partition')),
  ('SELECT message partition', format('SELECT count(*) FROM %s', :'message_partition')),
  ('INSERT message partition', format('INSERT INTO %s (expires_at) VALUES (now())', :'message_partition')),
  ('TRUNCATE message partition', format('TRUNCATE %s', :'message_partition')),
  ('CREATE TABLE in schema', $$CREATE TABLE idempotency.keys_evil (x int)$$),
  ('CREATE FUNCTION in schema', $$CREATE FUNCTION idempotency.f() RETURNS int LANGUAGE sql AS 'SELECT 1'$$),
  ('CREATE VIEW in schema',  $$CREATE VIEW idempotency.v AS SELECT 1$$),
  ('partitions view',        $$SELECT count(*) FROM idempotency.partitions$$),
  ('partition_info()',       $$SELECT count(*) FROM idempotency.partition_info()$$),
  ('idem_maintain()',        $$SELECT idem_maintain()$$)
) AS t(label, stmt);
\set VERBOSITY sqlstate
COPY idempotency.keys TO STDOUT;
\set VERBOSITY default
-- nor do the planner's statistics of the ledgers show their values
SELECT count(*) AS ledger_stats_visible FROM pg_stats WHERE schemaname = 'idempotency';
RESET ROLE;
SELECT count(*) > 0 AS ledger_stats_exist FROM pg_stats WHERE schemaname = 'idempotency';
-- no privilege on the parents or any partition for anyone but the owner
SELECT c.oid::regclass AS granted_relation, a.grantee::regrole, a.privilege_type
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
   AND a.grantee <> c.relowner;
-- nor on any of their columns: a grant on some columns (enough for INSERT
-- and COPY FROM of those) is taken back by maintenance like a table's
GRANT INSERT (expires_at, digest, role, lane) ON idempotency.messages TO regress_idem_sec_mallory;
SELECT try(format('GRANT SELECT (digest), UPDATE (state) ON %s TO regress_idem_sec_bob',
                  :'key_partition')) AS granted_on_a_partition;
CREATE TEMP VIEW ledger_column_grants AS
SELECT c.oid::regclass::text ~ '_[0-9]{8}_' AS on_partition, a.attname,
       g.grantee::regrole, g.privilege_type
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid
  CROSS JOIN LATERAL aclexplode(a.attacl) g
 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
   AND g.grantee <> c.relowner;
SELECT * FROM ledger_column_grants ORDER BY 1, 2, 3, 4;
SELECT has_column_privilege('regress_idem_sec_mallory', 'idempotency.messages', 'digest', 'INSERT')
       AS mallory_may_insert_digests;
SELECT partitions_created >= 0 AS superuser_maintain FROM idem_maintain();
SELECT count(*) AS column_grants_left FROM ledger_column_grants;
SELECT has_column_privilege('regress_idem_sec_mallory', 'idempotency.messages', 'digest', 'INSERT')
       AS mallory_may_insert_digests;
-- pg_monitor reads the partitions view, not the ledgers: with USAGE on the
-- schema, the tables' own privileges refuse it
SET ROLE regress_idem_sec_monitor;
SELECT count(*) > 0 AS monitor_sees_partitions FROM idempotency.partitions;
SELECT label, try(stmt) FROM (VALUES
  ('SELECT keys',            $$SELECT count(*) FROM idempotency.keys$$),
  ('UPDATE keys',            $$UPDATE idempotency.keys SET response_code = 500$$),
  ('DELETE keys',            $$DELETE FROM idempotency.keys$$),
  ('TRUNCATE keys',          $$TRUNCATE idempotency.keys$$),
  ('SELECT messages',        $$SELECT count(*) FROM idempotency.messages$$),
  ('INSERT messages',        $$INSERT INTO idempotency.messages (expires_at) VALUES (now())$$),
  ('SELECT key partition',   format('SELECT count(*) FROM %s', :'key_partition')),
  ('DELETE key partition',   format('DELETE FROM %s', :'key_partition')),
  ('TRUNCATE key partition', format('TRUNCATE %s', :'key_partition')),
  ('SELECT message partition', format('SELECT count(*) FROM %s', :'message_partition')),
  ('INSERT message partition', format('INSERT INTO %s (expires_at) VALUES (now())', :'message_partition')),
  ('CREATE TABLE in schema', $$CREATE TABLE idempotency.keys_evil (x int)$$)
) AS t(label, stmt);
RESET ROLE;

----------------------------------------------------------------------------
-- 3. search_path attacks by an unprivileged role
----------------------------------------------------------------------------
-- mallory gets a schema of her own and, as in databases made before
-- PostgreSQL 15, CREATE on public.  Every look-alike she makes notes its
-- call in mallory.calls (and returns what the real one would).
CREATE SCHEMA mallory AUTHORIZATION regress_idem_sec_mallory;
GRANT CREATE ON SCHEMA public TO regress_idem_sec_mallory;
SET ROLE regress_idem_sec_mallory;
GRANT USAGE ON SCHEMA mallory TO PUBLIC;
CREATE TABLE mallory.calls (what text);
GRANT INSERT ON mallory.calls TO PUBLIC;
CREATE FUNCTION mallory.note(what text) RETURNS boolean LANGUAGE sql
  AS $$ INSERT INTO mallory.calls VALUES (what) RETURNING true $$;

-- functions the extension might be thought to use, in both schemas
CREATE FUNCTION mallory.sha256(b bytea) RETURNS bytea LANGUAGE sql
  AS $$ SELECT pg_catalog.sha256(b) WHERE mallory.note('sha256') $$;
CREATE FUNCTION public.sha256(b bytea) RETURNS bytea LANGUAGE sql
  AS $$ SELECT pg_catalog.sha256(b) WHERE mallory.note('public.sha256') $$;
CREATE FUNCTION mallory.now() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE mallory.note('now') $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE mallory.note('public.now') $$;
CREATE FUNCTION mallory.clock_timestamp() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE mallory.note('clock_timestamp') $$;
CREATE FUNCTION mallory.jsonb_build_object(a text, b text) RETURNS jsonb LANGUAGE sql
  AS $$ SELECT pg_catalog.jsonb_build_object(a, b) WHERE mallory.note('jsonb_build_object') $$;
CREATE FUNCTION public.jsonb_build_object(a text, b text) RETURNS jsonb LANGUAGE sql
  AS $$ SELECT pg_catalog.jsonb_build_object(a, b) WHERE mallory.note('public.jsonb_build_object') $$;
CREATE FUNCTION mallory.quote_ident(t text) RETURNS text LANGUAGE sql
  AS $$ SELECT pg_catalog.quote_ident(t) WHERE mallory.note('quote_ident') $$;
CREATE FUNCTION mallory.format(f text, VARIADIC a text[]) RETURNS text LANGUAGE sql
  AS $$ SELECT pg_catalog.format(f, VARIADIC a) WHERE mallory.note('format') $$;
CREATE FUNCTION mallory.gen_random_uuid() RETURNS uuid LANGUAGE sql
  AS $$ SELECT pg_catalog.gen_random_uuid() WHERE mallory.note('gen_random_uuid') $$;
CREATE FUNCTION mallory.hashtext(t text) RETURNS int LANGUAGE sql
  AS $$ SELECT pg_catalog.hashtext(t) WHERE mallory.note('hashtext') $$;
-- ... and named like the extension's own: its SQL function, its C helpers
CREATE FUNCTION mallory.partition_info() RETURNS SETOF record LANGUAGE sql
  AS $$ SELECT NULL::record WHERE mallory.note('partition_info') $$;
CREATE FUNCTION public.partition_info() RETURNS SETOF record LANGUAGE sql
  AS $$ SELECT NULL::record WHERE mallory.note('public.partition_info') $$;
CREATE FUNCTION mallory.idem_compute_digest(a text, b text) RETURNS uuid LANGUAGE sql
  AS $$ SELECT NULL::uuid WHERE mallory.note('idem_compute_digest') $$;
CREATE FUNCTION mallory.idem_fingerprint(r jsonb) RETURNS bytea LANGUAGE sql
  AS $$ SELECT NULL::bytea WHERE mallory.note('idem_fingerprint') $$;

-- operators on every type the ledgers compare
CREATE FUNCTION mallory.text_eq(a text, b text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(text,text)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR mallory.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mallory.text_eq);
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mallory.text_eq);
CREATE FUNCTION mallory.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(uuid,uuid)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR mallory.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = mallory.uuid_eq);
CREATE FUNCTION mallory.bytea_eq(a bytea, b bytea) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(bytea,bytea)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR mallory.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = mallory.bytea_eq);
CREATE FUNCTION mallory.regrole_eq(a regrole, b regrole) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(regrole,regrole)') THEN a::oid OPERATOR(pg_catalog.=) b::oid END $$;
CREATE OPERATOR mallory.= (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = mallory.regrole_eq);
CREATE FUNCTION mallory.int2_eq(a int2, b int2) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(int2,int2)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR mallory.= (LEFTARG = int2, RIGHTARG = int2, FUNCTION = mallory.int2_eq);
CREATE FUNCTION mallory.jsonb_eq(a jsonb, b jsonb) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('=(jsonb,jsonb)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR mallory.= (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = mallory.jsonb_eq);
CREATE FUNCTION mallory.ts_le(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('<=(timestamptz,timestamptz)') THEN a OPERATOR(pg_catalog.<=) b END $$;
CREATE OPERATOR mallory.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = mallory.ts_le);
CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = mallory.ts_le);
CREATE FUNCTION mallory.ts_lt(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN mallory.note('<(timestamptz,timestamptz)') THEN a OPERATOR(pg_catalog.<) b END $$;
CREATE OPERATOR mallory.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = mallory.ts_lt);
CREATE FUNCTION mallory.ts_pl(a timestamptz, b interval) RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE mallory.note('+(timestamptz,interval)') $$;
CREATE OPERATOR mallory.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = mallory.ts_pl);

-- types and tables named like the ledgers' (a value of the domains is never
-- valid, so a table made with them could not hold a row)
CREATE DOMAIN mallory.timestamptz AS pg_catalog.timestamptz CHECK (VALUE IS NULL);
CREATE DOMAIN mallory.uuid AS pg_catalog.uuid CHECK (VALUE IS NULL);
CREATE DOMAIN mallory.int2 AS pg_catalog.int2 CHECK (VALUE IS NULL);
CREATE TABLE mallory.keys (LIKE pg_catalog.pg_class);
CREATE TABLE mallory.messages (LIKE pg_catalog.pg_class);
CREATE TABLE public.keys (x int);
RESET ROLE;

-- 3a. mallory calls every function with her path first.  The ttls need
-- partitions nobody has made yet, so the calls make them (DDL run as the
-- extension's owner) while her path is in effect.
SET ROLE regress_idem_sec_mallory;
SET search_path = mallory, public, pg_catalog;
SELECT idem_consume_message('queue', 'sp-1', '20 days');
SELECT * FROM idem_consume_messages('queue', ARRAY['sp-2', 'sp-3', 'sp-2'], '20 days');
SELECT status FROM idem_claim('sp-key', '{"b": [1, 2], "a": "x"}', 'tenant', '10 days', '1 hour');
SELECT token AS mallory_token FROM idem_lookup('sp-key', 'tenant') \gset
SELECT idem_checkpoint('sp-key', 'step-1', 'tenant', :mallory_token);
SELECT idem_complete('sp-key', 201, '{"done": true}', 'tenant', :mallory_token);
SELECT status, response_code, response_body FROM idem_claim('sp-key', '{"a": "x", "b": [1, 2]}', 'tenant');
SELECT status FROM idem_claim('sp-key', '{"a": "y"}', 'tenant');
SELECT status, recovery_point, response_code FROM idem_lookup('sp-key', 'tenant');
BEGIN;
SELECT status FROM idem_claim('sp-released', scope => 'tenant', ttl => '10 days');
SELECT idem_release('sp-released', 'tenant');
COMMIT;
RESET search_path;
RESET ROLE;

-- alice does the same with a clean path
SET ROLE regress_idem_sec_alice;
SELECT idem_consume_message('queue', 'sp-1', '20 days');
BEGIN;
SELECT status FROM idem_claim('sp-key', '{"a": "x", "b": [1, 2]}', 'tenant', '10 days');
SELECT idem_complete('sp-key', 201, '{"done": true}', 'tenant');
COMMIT;
RESET ROLE;

-- no look-alike was called, nothing went into the look-alike tables
SELECT count(*) AS lookalike_calls FROM mallory.calls;
SELECT (SELECT count(*) FROM mallory.keys) + (SELECT count(*) FROM mallory.messages)
       + (SELECT count(*) FROM public.keys) AS rows_in_lookalike_tables;
-- the results are those of a clean path: the same digests as alice's rows
-- for the same ids, the fingerprint of the canonical request, expiries from
-- the real clock
SELECT count(*) AS rows, count(DISTINCT digest) AS digests, count(DISTINCT role) AS roles
  FROM idempotency.messages
 WHERE role IN ('regress_idem_sec_mallory'::regrole, 'regress_idem_sec_alice'::regrole)
   AND expires_at > now() + interval '19 days';
SELECT count(*) AS rows, count(DISTINCT digest) AS digests, count(DISTINCT role) AS roles
  FROM idempotency.keys
 WHERE role IN ('regress_idem_sec_mallory'::regrole, 'regress_idem_sec_alice'::regrole)
   AND fingerprint IS NOT NULL AND expires_at > now() + interval '9 days';
SELECT state, response_code, recovery_point,
       fingerprint = sha256(convert_to('{"a": "x", "b": [1, 2]}', 'UTF8')) AS canonical_fingerprint,
       expires_at - claimed_at AS ttl,
       claimed_at BETWEEN now() - interval '1 hour' AND clock_timestamp() AS claimed_now
  FROM idempotency.keys WHERE role = 'regress_idem_sec_mallory'::regrole AND state = 'c';
SELECT count(*) AS mallory_rows FROM idempotency.messages
 WHERE role = 'regress_idem_sec_mallory'::regrole;
-- the partitions made during mallory's calls are the extension's: owned by
-- its owner, in schema idempotency, with pg_catalog column types
SELECT count(*) > 0 AS partitions_over_19_days FROM idempotency.partitions
 WHERE table_name = 'messages' AND upper_bound > now() + interval '19 days';
SELECT count(*) AS foreign_owned_or_typed
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
  LEFT JOIN pg_type t ON t.oid = a.atttypid
 WHERE i.inhparent IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
   AND (c.relowner <> (SELECT extowner FROM pg_extension WHERE extname = 'idempotency')
        OR c.relnamespace <> 'idempotency'::regnamespace
        OR t.typnamespace <> 'pg_catalog'::regnamespace);

-- 3b. a superuser with a careless path (public and mallory's schema before
-- pg_catalog) runs idem_maintain(), which makes partitions of a new layout
-- and drops expired ones.  First partitions to drop: one-second ones, made
-- by idem_maintain() with a clean path, and waited out.
SET idempotency.partition_interval = '1s';
SET idempotency.key_ttl = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.premake = 0;
SELECT partitions_created > 0 AS short_partitions_made FROM idem_maintain();
RESET idempotency.key_ttl;
RESET idempotency.message_ttl;
RESET idempotency.premake;
DO $$
BEGIN
  WHILE clock_timestamp() < (SELECT max(upper_bound) FROM idempotency.partitions
                              WHERE upper_bound - lower_bound <= interval '1 second') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT count(*) AS partitions_before FROM idempotency.partitions \gset
SELECT count(*) FILTER (WHERE expired) > 0 AS some_expired FROM idempotency.partitions;
SET idempotency.partition_interval = '12h';
SET search_path = public, mallory, pg_catalog;
SELECT partitions_created, partitions_dropped FROM idem_maintain() \gset
RESET search_path;
RESET idempotency.partition_interval;
SELECT :partitions_created > 0 AS maintain_created, :partitions_dropped > 0 AS maintain_dropped,
       (SELECT count(*) FROM idempotency.partitions)
         = :partitions_before + :partitions_created - :partitions_dropped AS partitions_add_up,
       (SELECT count(*) FROM idempotency.partitions WHERE expired) AS expired_left;
SELECT count(*) AS lookalike_calls FROM mallory.calls;

-- 3c. look-alikes of the API itself, with the same argument types, in public:
-- with the default path pg_catalog comes first, so they are never called;
-- and a call qualified with pg_catalog ignores any path
SET ROLE regress_idem_sec_mallory;
CREATE FUNCTION public.idem_consume_message(consumer text, message_id text) RETURNS boolean
  LANGUAGE sql AS $$ SELECT mallory.note('public.idem_consume_message') $$;
CREATE FUNCTION public.idem_claim(key text) RETURNS record
  LANGUAGE sql AS $$ SELECT ROW('claimed') WHERE mallory.note('public.idem_claim') $$;
CREATE FUNCTION public.idem_lookup(key text) RETURNS SETOF record
  LANGUAGE sql AS $$ SELECT NULL::record WHERE mallory.note('public.idem_lookup') $$;
CREATE FUNCTION public.idem_maintain() RETURNS record
  LANGUAGE sql AS $$ SELECT ROW(0, 0) WHERE mallory.note('public.idem_maintain') $$;
CREATE FUNCTION mallory.idem_consume_message(consumer text, message_id text) RETURNS boolean
  LANGUAGE sql AS $$ SELECT mallory.note('mallory.idem_consume_message') $$;
RESET ROLE;
SHOW search_path;
SET ROLE regress_idem_sec_alice;
SELECT idem_consume_message('queue', 'lookalike-1') AS alice_consume;
BEGIN;
SELECT status FROM idem_claim('lookalike-key');
SELECT status FROM idem_lookup('lookalike-key');
SELECT idem_release('lookalike-key');
COMMIT;
SET search_path = mallory, public, pg_catalog;
SELECT pg_catalog.idem_consume_message('queue', 'lookalike-2') AS alice_qualified;
RESET search_path;
RESET ROLE;
SELECT partitions_created >= 0 AS superuser_maintain FROM idem_maintain();
SELECT count(*) AS lookalike_calls FROM mallory.calls;
-- the real functions did the work: both messages are consumed
SET ROLE regress_idem_sec_alice;
SELECT idem_consume_message('queue', 'lookalike-1') OR
       idem_consume_message('queue', 'lookalike-2') AS alice_consume_again;
RESET ROLE;

----------------------------------------------------------------------------
-- 4. names given by users are data: they never reach DDL
----------------------------------------------------------------------------
CREATE TABLE victim (x int);
GRANT SELECT ON victim TO PUBLIC;
-- every relation there is now, to compare with afterwards
CREATE TEMP TABLE relations_before AS
  SELECT c.oid, c.relnamespace, c.relname FROM pg_class c;
SET ROLE regress_idem_sec_mallory;
CREATE TEMP TABLE names (name text);
INSERT INTO names VALUES
  ($$x'; DROP TABLE victim; --$$),
  ($$x"; DROP TABLE victim; --$$),
  ($$"quoted"$$),
  ($$victim$$),
  ($$idempotency.keys$$),
  ($$keys_1_0_20000101_000000$$),
  ($$%s %I %L$$),
  ($n$$$ DROP TABLE victim; $$$n$),
  (E'line\nbreak\ttab'),
  ('ключ 🔑 鍵'),
  (repeat('ü', 127)),
  (repeat('x', 255));
-- as consumer and message id, as key and scope; with ttls that make
-- partitions on the spot
SELECT count(*) FILTER (WHERE idem_consume_message(name, name, '25 days')) AS new_messages
  FROM names;
SELECT count(*) AS new_in_batch FROM idem_consume_messages($$'); DROP TABLE victim; --$$,
                                                           ARRAY(SELECT name FROM names), '26 days');
BEGIN;
SELECT count(*) FILTER (WHERE c.status = 'claimed') AS claimed
  FROM names, LATERAL idem_claim(name, pg_catalog.jsonb_build_object('name', name), name, '11 days') c;
SELECT count(*) AS completed
  FROM names, LATERAL idem_complete(name, 200, pg_catalog.jsonb_build_object('name', name), name);
COMMIT;
-- stored as data, and given back exactly
SELECT count(*) AS round_trips
  FROM names, LATERAL idem_claim(name, pg_catalog.jsonb_build_object('name', name), name) c
 WHERE c.status = 'completed' AND c.response_body ->> 'name' = name;
SELECT count(*) FILTER (WHERE idem_consume_message(name, name)) AS new_again FROM names;
RESET ROLE;
SELECT to_regclass('victim') IS NOT NULL AS victim_still_there;
-- the only new relations are partitions of the ledgers, named by the
-- extension, with their indexes (the digest index the extension makes, and
-- the partitions of the ledger's own partitioned indexes) and TOAST tables.
-- Told apart by what they are attached to, not by their names alone: which
-- partitions the calls above make depends on the date they run on.
CREATE TEMP VIEW ledger_partitions AS
  SELECT c.oid, c.relname
    FROM pg_class c JOIN pg_inherits h ON h.inhrelid = c.oid
   WHERE h.inhparent IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
     AND c.relkind = 'r'
     AND c.relnamespace = 'idempotency'::regnamespace
     AND c.relname ~ '^(keys|messages)_n?[0-9]+_f?[0-9]+_[0-9]{8}_[0-9]{6}(_[0-9]{6})?$';
SELECT c.relnamespace::regnamespace, c.relname, c.relkind
  FROM pg_class c
 WHERE c.oid NOT IN (SELECT oid FROM relations_before)
   AND NOT (c.relnamespace = 'pg_toast'::regnamespace)
   AND c.oid NOT IN (SELECT oid FROM ledger_partitions)
   AND NOT EXISTS (SELECT FROM pg_index i JOIN ledger_partitions p ON p.oid = i.indrelid
                    WHERE i.indexrelid = c.oid
                      AND c.relnamespace = 'idempotency'::regnamespace
                      AND (c.relname = p.relname || '_role_digest_idx'
                           OR EXISTS (SELECT FROM pg_inherits hi
                                        JOIN pg_index pi ON pi.indexrelid = hi.inhparent
                                       WHERE hi.inhrelid = c.oid
                                         AND pi.indrelid IN ('idempotency.keys'::regclass,
                                                             'idempotency.messages'::regclass))))
   AND c.relpersistence <> 't';
SELECT count(*) > 0 AS partitions_made
  FROM pg_class c WHERE c.oid NOT IN (SELECT oid FROM relations_before)
   AND c.relnamespace = 'idempotency'::regnamespace;
-- ... and none is gone
SELECT count(*) AS relations_gone FROM relations_before b
 WHERE NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = b.oid);
SELECT count(*) AS lookalike_calls FROM mallory.calls;

----------------------------------------------------------------------------
-- clean up
----------------------------------------------------------------------------
\c :regress_db
SET client_min_messages = warning;
DROP DATABASE regress_idem_security;
DROP ROLE regress_idem_sec_alice;
DROP ROLE regress_idem_sec_bob;
DROP ROLE regress_idem_sec_mallory;
DROP ROLE regress_idem_sec_monitor;
RESET client_min_messages;
