-- test/lib/sqlsmith_target.sql -- what the targeted pass of "make sqlsmith"
-- (SQLSMITH_PASSES=extension, test/release.sh) reads instead of the whole
-- catalog, so that most of its random queries call the extension's API with
-- random arguments.  Run by psql as a superuser in the database that
-- test/lib/sqlsmith_setup.sql made (and after the general pass, when it
-- runs), outside a transaction block.
--
-- sqlsmith (1.4, Debian's) learns the functions it may call from an
-- unqualified "SELECT ... FROM pg_proc" (and their argument types from
-- another); with schema sqlsmith_target (the superuser's) or
-- sqlsmith_target_user (sqlsmith_user's: only what it may execute) first in
-- its search_path, both read the materialized view below, which lists:
--   - the extension's functions sqlsmith can call as they are: those that
--     return a scalar or a named row type (idem_consume_message, idem_claim,
--     idem_sequence, idempotency.import_* and relocate_lanes);
--   - for the others, a wrapper of the same name in schema sqlsmith_target
--     that calls the extension's function with its arguments, unchanged:
--     sqlsmith never calls a function that returns void (idem_complete,
--     idem_checkpoint, idem_release, stats_reset: its type check refuses
--     the pseudo-type), a set (idem_consume_messages, idem_lookup,
--     idem_recover, the stream functions, the exports: it leaves out every
--     set-returning function) or an anonymous record (idem_maintain); the
--     wrappers return true, the rows as one jsonb or array, or one row of
--     an export, which sqlsmith can then pass to the other functions (the
--     few without parameters get one, ignored: sqlsmith picks a function
--     without parameters two times in three, and those would crowd out
--     the rest);
--   - a few functions of the catalog that build their arguments: text,
--     jsonb, interval, integers, bytea, arrays, timestamps, and a few
--     aggregates (none without parameters, for the same reason).
-- A materialized view, not a view: information_schema.tables, where
-- sqlsmith finds the tables it queries, does not list materialized views.
-- Types and operators stay those of the catalog: sqlsmith reads
-- pg_catalog.pg_operator by its qualified name, and it crashes at start when
-- an operator's, a column's or a function's type is missing from the types
-- it read.
--
-- The arguments: public.smith_args, a table whose columns have the types of
-- the API's parameters and whose rows are real keys, scopes, tokens,
-- consumers, message ids, streams and producers of the populated ledger
-- (those of sqlsmith_user and of the superuser), exported records as they
-- are and changed, and odd values (empty, long, negative, out of range,
-- NULL).  sqlsmith takes its non-constant values from table columns of the
-- wanted type (or from the functions above), so these rows are what its
-- calls mostly get.  The keys and message ids that release.sh checks at the
-- end (su-done-*, su-billing) are not among them.
--
-- sqlsmith's grammar puts a function call in about one query in five
-- whatever it is offered; the tables it queries are what makes most of its
-- queries call the API: views over the arguments that call it once per row
-- (below; the end of this file).
--
-- Queries that name the API (sqlsmith --dry-run, 2,000 queries, against
-- Debian's PostgreSQL 15): 21 % with the functions alone, 93 %
-- (sqlsmith_user) and 80 % (superuser) with the views; the general pass's,
-- about 5 % (make sqlsmith's count).

\set ON_ERROR_STOP 1

CREATE SCHEMA sqlsmith_target;
GRANT USAGE ON SCHEMA sqlsmith_target TO PUBLIC;

-- stream positions and producer sequences, for both roles, so that the
-- stream functions have state to work on
CREATE PROCEDURE public.sqlsmith_streams(tag text)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem_assign(tag || '-consumer', 'orders', ARRAY[0, 1, 2], 1);
	PERFORM idem_advance(tag || '-consumer', 'orders', p, 0, 9, 1) FROM generate_series(0, 2) p;
	PERFORM idem_sequence(tag || '-consumer', tag || '-producer', 1, s) FROM generate_series(1, 5) s;
	COMMIT;
	-- a few same-transaction and two-phase keys of this pass's own
	PERFORM idem_claim(tag || '-target-' || g, jsonb_build_object('g', g), scope => 'target',
	                   ttl => '1 day', lease => '10 minutes')
	  FROM generate_series(1, 10) g;
	COMMIT;
END
$$;
CALL public.sqlsmith_streams('su');
SET ROLE sqlsmith_user;
CALL public.sqlsmith_streams('user');
RESET ROLE;
DROP PROCEDURE public.sqlsmith_streams(text);

-- the wrappers (security invoker: each call runs as sqlsmith's role)
CREATE FUNCTION sqlsmith_target.idem_complete(key text, response_code integer, response_body jsonb,
                                              scope text, token bigint, response_headers jsonb,
                                              response_raw bytea)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.idem_complete(key, response_code, response_body, scope, token,
	                                 response_headers, response_raw);
	RETURN true;
END $$;
CREATE FUNCTION sqlsmith_target.idem_checkpoint(key text, recovery_point text, scope text, token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.idem_checkpoint(key, recovery_point, scope, token);
	RETURN true;
END $$;
CREATE FUNCTION sqlsmith_target.idem_release(key text, scope text, token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.idem_release(key, scope, token);
	RETURN true;
END $$;
CREATE FUNCTION sqlsmith_target.stats_reset(ignored boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idempotency.stats_reset();
	RETURN true;
END $$;
CREATE FUNCTION sqlsmith_target.idem_consume_messages(consumer text, message_ids text[], ttl interval, tenant text)
RETURNS text[] LANGUAGE plpgsql AS $$
BEGIN
	RETURN ARRAY(SELECT pg_catalog.idem_consume_messages(consumer, message_ids, ttl, tenant));
END $$;
CREATE FUNCTION sqlsmith_target.idem_lookup(key text, scope text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM pg_catalog.idem_lookup(key, scope) r);
END $$;
CREATE FUNCTION sqlsmith_target.idem_recover(lease interval, scope text, max_keys integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM pg_catalog.idem_recover(lease, scope, max_keys) r);
END $$;
CREATE FUNCTION sqlsmith_target.idem_maintain(ignored boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT to_jsonb(r) FROM pg_catalog.idem_maintain() r);
END $$;
CREATE FUNCTION sqlsmith_target.idem_assign(consumer text, stream text, parts integer[], generation bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM pg_catalog.idem_assign(consumer, stream, parts, generation) r);
END $$;
CREATE FUNCTION sqlsmith_target.idem_advance(consumer text, stream text, part integer, first_offset bigint,
                                             last_offset bigint, generation bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r))
	          FROM pg_catalog.idem_advance(consumer, stream, part, first_offset, last_offset, generation) r);
END $$;
CREATE FUNCTION sqlsmith_target.idem_positions(consumer text, stream text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM pg_catalog.idem_positions(consumer, stream) r);
END $$;
CREATE FUNCTION sqlsmith_target.partition_info(table_name text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM idempotency.partition_info() r
	         WHERE r.table_name = partition_info.table_name OR partition_info.table_name IS NULL);
END $$;
CREATE FUNCTION sqlsmith_target.filter_info(ignored boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM idempotency.filter_info() r);
END $$;
CREATE FUNCTION sqlsmith_target.stats_info(ignored boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT jsonb_agg(to_jsonb(r)) FROM idempotency.stats_info() r);
END $$;
-- one row of each export (the n-th), for the imports
CREATE FUNCTION sqlsmith_target.export_keys(scopes text[], n integer)
RETURNS idempotency.key_record LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT r FROM idempotency.export_keys(scopes) r OFFSET greatest(n, 0) LIMIT 1);
END $$;
CREATE FUNCTION sqlsmith_target.export_messages(consumers text[], n integer)
RETURNS idempotency.message_record LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT r FROM idempotency.export_messages(consumers) r OFFSET greatest(n, 0) LIMIT 1);
END $$;
CREATE FUNCTION sqlsmith_target.export_positions(consumers text[], n integer)
RETURNS idempotency.position_record LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT r FROM idempotency.export_positions(consumers) r OFFSET greatest(n, 0) LIMIT 1);
END $$;
CREATE FUNCTION sqlsmith_target.export_sequences(consumers text[], n integer)
RETURNS idempotency.sequence_record LANGUAGE plpgsql AS $$
BEGIN
	RETURN (SELECT r FROM idempotency.export_sequences(consumers) r OFFSET greatest(n, 0) LIMIT 1);
END $$;

-- The functions sqlsmith may call: the extension's own that it can call as
-- they are, the wrappers, and the argument builders (those a major lacks
-- are left out).
CREATE MATERIALIZED VIEW sqlsmith_target.pg_proc AS
SELECT p.oid, p.proname, p.pronamespace, p.prorettype, p.proretset, p.prokind, p.proargtypes
  FROM pg_catalog.pg_proc AS p
 WHERE p.pronamespace = 'sqlsmith_target'::regnamespace
    OR p.oid IN (SELECT to_regprocedure(f) FROM unnest(ARRAY[
        -- the extension's, called as they are
        'pg_catalog.idem_consume_message(text,text,interval)',
        'pg_catalog.idem_consume_message(text,text,interval,text)',
        'pg_catalog.idem_claim(text,jsonb,text,interval,interval,boolean,boolean)',
        'pg_catalog.idem_sequence(text,text,bigint,bigint,boolean)',
        'idempotency.relocate_lanes(boolean)',
        'idempotency.import_key(record)',
        'idempotency.import_message(record)',
        'idempotency.import_position(record)',
        'idempotency.import_sequence(record)',
        -- text
        'md5(text)', 'repeat(text,integer)', 'textcat(text,text)', 'lower(text)', 'upper(text)',
        'left(text,integer)', 'right(text,integer)', 'chr(integer)', 'to_hex(bigint)',
        'encode(bytea,text)', 'replace(text,text,text)', 'jsonb_typeof(jsonb)',
        -- jsonb
        'jsonb_object(text[])', 'jsonb_set(jsonb,text[],jsonb,boolean)', 'jsonb_strip_nulls(jsonb)',
        'jsonb_concat(jsonb,jsonb)', 'to_jsonb(anyelement)', 'jsonb_object_field(jsonb,text)',
        'jsonb_array_element(jsonb,integer)',
        -- interval and time
        'make_interval(integer,integer,integer,integer,integer,integer,double precision)',
        'justify_interval(interval)', 'interval_pl(interval,interval)', 'interval_mi(interval,interval)',
        'interval_um(interval)', 'interval_mul(interval,double precision)',
        'timestamptz_mi(timestamp with time zone,timestamp with time zone)',
        -- integers
        'int4pl(integer,integer)', 'int4mi(integer,integer)', 'int4mul(integer,integer)',
        'int4um(integer)', 'int8(integer)', 'int4(bigint)', 'int8mul(bigint,bigint)', 'int8um(bigint)',
        'length(text)', 'octet_length(bytea)',
        -- bytea
        'decode(text,text)', 'textsend(text)', 'sha256(bytea)', 'byteacat(bytea,bytea)',
        'set_byte(bytea,integer,integer)',
        -- arrays
        'string_to_array(text,text)', 'regexp_split_to_array(text,text)',
        'array_append(anycompatiblearray,anycompatible)', 'array_cat(anycompatiblearray,anycompatiblearray)',
        'array_remove(anycompatiblearray,anycompatible)',
        -- aggregates
        'string_agg(text,text)', 'jsonb_agg(anyelement)', 'array_agg(anynonarray)', 'max(text)',
        'bool_and(boolean)', 'sum(bigint)'
       ]) AS f);
-- sqlsmith_user's: those it may execute (a wrapper, when it may execute the
-- function of the same name that the wrapper calls)
CREATE SCHEMA sqlsmith_target_user;
GRANT USAGE ON SCHEMA sqlsmith_target_user TO sqlsmith_user;
CREATE MATERIALIZED VIEW sqlsmith_target_user.pg_proc AS
SELECT t.* FROM sqlsmith_target.pg_proc AS t
 WHERE CASE WHEN t.pronamespace = 'sqlsmith_target'::regnamespace
            THEN EXISTS (SELECT FROM pg_catalog.pg_proc AS w
                          WHERE w.proname = t.proname
                            AND w.pronamespace IN ('pg_catalog'::regnamespace, 'idempotency'::regnamespace)
                            AND has_function_privilege('sqlsmith_user', w.oid, 'EXECUTE'))
            ELSE has_function_privilege('sqlsmith_user', t.oid, 'EXECUTE') END;
GRANT SELECT ON sqlsmith_target_user.pg_proc TO sqlsmith_user;
-- sqlsmith writes every argument as cast(... AS type), the API's row types
-- (idempotency.claim_result, key_record, ...) included: sqlsmith_user may
-- name them.  USAGE on the schema gives nothing else: its tables and
-- functions keep their own privileges (none for PUBLIC but the API's).
GRANT USAGE ON SCHEMA idempotency TO sqlsmith_user;

-- The arguments.  The rows come in this order, which is the order a scan
-- of the table (and of the views below) meets them in: sqlsmith's queries
-- run in a transaction that is rolled back, so its own writes to the table
-- never stay.  First the real keys, each with its scope and token, then
-- rows of values the API takes, then rows of odd ones (empty, too long,
-- negative, out of range, NULL, where the API answers with an error): a
-- view's scan errs only once it reaches them, and a query that reads fewer
-- rows (LIMIT, WHERE, TABLESAMPLE, a join) gets through.
CREATE TABLE public.smith_args (
	key text, scope text, consumer text, message_id text, stream text, producer text,
	recovery_point text,
	request jsonb, response jsonb, headers jsonb,
	ttl interval, lease interval,
	token bigint, epoch bigint, seq bigint, first_offset bigint, last_offset bigint, generation bigint,
	code integer, part integer, parts integer[],
	raw bytea, ids text[], wait boolean,
	k idempotency.key_record, m idempotency.message_record,
	p idempotency.position_record, s idempotency.sequence_record);
GRANT ALL ON public.smith_args TO sqlsmith_user;

-- pick(values, g): the g-th of values, round the list
CREATE FUNCTION pg_temp.pick(anyarray, integer) RETURNS anyelement
LANGUAGE sql IMMUTABLE AS 'SELECT $1[1 + $2 % array_length($1, 1)]';

-- the real keys of both roles (keys are per role), with their tokens
CREATE TEMP TABLE tokens (key text, scope text, token bigint);
GRANT ALL ON tokens TO sqlsmith_user;
INSERT INTO tokens
SELECT k.key, k.scope, (SELECT token FROM idem_lookup(k.key, k.scope))
  FROM (VALUES ('su-2p-1', 'two-phase'), ('su-2p-2', 'two-phase'), ('su-2p-3', 'two-phase'),
               ('su-2p-5', 'two-phase'), ('su-lapsed-1', 'two-phase'), ('su-target-1', 'target'),
               ('su-target-2', 'target')) AS k (key, scope);
SET ROLE sqlsmith_user;
INSERT INTO tokens
SELECT k.key, k.scope, (SELECT token FROM idem_lookup(k.key, k.scope))
  FROM (VALUES ('user-2p-1', 'two-phase'), ('user-2p-2', 'two-phase'), ('user-2p-3', 'two-phase'),
               ('user-2p-5', 'two-phase'), ('user-lapsed-1', 'two-phase'), ('user-done-1', ''),
               ('user-target-1', 'target'), ('user-target-2', 'target')) AS k (key, scope);
RESET ROLE;

-- exported records, numbered: as they are first, then changed (another
-- token, status, expiry, digest, role, position, sequence)
CREATE TEMP TABLE records AS
WITH xk AS (SELECT r, row_number() OVER () AS n FROM idempotency.export_keys() r LIMIT 40),
     xm AS (SELECT r, row_number() OVER () AS n FROM idempotency.export_messages() r LIMIT 40),
     xp AS (SELECT r, row_number() OVER () AS n FROM idempotency.export_positions() r),
     xs AS (SELECT r, row_number() OVER () AS n FROM idempotency.export_sequences() r)
SELECT g AS n,
       (SELECT CASE WHEN g <= 25 THEN xk.r
                    WHEN g % 4 = 0 THEN ROW((xk.r).role, (xk.r).digest, (xk.r).expires_at, (xk.r).status,
                              (xk.r).token + 1, (xk.r).claimed_at, (xk.r).lease_expires_at, (xk.r).fingerprint,
                              (xk.r).recovery_point, (xk.r).response_code, (xk.r).response_body, (xk.r).kept_key,
                              (xk.r).kept_scope, (xk.r).request, (xk.r).response_headers,
                              (xk.r).response_raw)::idempotency.key_record
                    WHEN g % 4 = 1 THEN ROW((xk.r).role, (xk.r).digest, now() - interval '1 hour', 'completed',
                              (xk.r).token, (xk.r).claimed_at, NULL, (xk.r).fingerprint, (xk.r).recovery_point, 200,
                              '{}', (xk.r).kept_key, (xk.r).kept_scope, (xk.r).request, NULL,
                              NULL)::idempotency.key_record
                    WHEN g % 4 = 2 THEN ROW('sqlsmith_user', gen_random_uuid(), now() + interval '1 day', 'claimed', 1,
                              now(), now() + interval '1 minute', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                              NULL, NULL)::idempotency.key_record
                    ELSE ROW((xk.r).role, (xk.r).digest, (xk.r).expires_at, 'released', -5, (xk.r).claimed_at,
                             (xk.r).lease_expires_at, '\x00', (xk.r).recovery_point, 700, '[]', (xk.r).kept_key,
                             (xk.r).kept_scope, (xk.r).request, '{"h": 1}', '\xff')::idempotency.key_record END
          FROM xk WHERE xk.n = g) AS k,
       (SELECT CASE WHEN g <= 25 THEN xm.r
                    WHEN g % 2 = 0 THEN ROW((xm.r).role, (xm.r).digest, now() - interval '1 day')::idempotency.message_record
                    ELSE ROW('sqlsmith_user', gen_random_uuid(), now() + interval '1000 years')::idempotency.message_record END
          FROM xm WHERE xm.n = g) AS m,
       (SELECT CASE WHEN g <= 4 THEN xp.r
                    ELSE ROW((xp.r).role, (xp.r).consumer, (xp.r).stream, (xp.r).part, -1, (xp.r).generation + 1,
                             (xp.r).updated_at)::idempotency.position_record END
          FROM xp WHERE xp.n = g) AS p,
       (SELECT CASE WHEN g <= 1 THEN xs.r
                    ELSE ROW((xs.r).role, (xs.r).consumer, (xs.r).producer, (xs.r).epoch - 1, (xs.r).seq + 100,
                             (xs.r).updated_at)::idempotency.sequence_record END
          FROM xs WHERE xs.n = g) AS s
  FROM generate_series(1, 40) g;

INSERT INTO public.smith_args
SELECT CASE WHEN t.key IS NOT NULL THEN t.key
            WHEN NOT odd THEN pg_temp.pick(ARRAY['user-done-1', 'user-done-2', 'user-2p-1', 'user-2p-2',
                                                 'user-2p-3', 'user-lapsed-1', 'user-target-1', 'su-2p-1',
                                                 'su-2p-2', 'su-lapsed-2', 'su-target-1', 'new-key-' || g,
                                                 'ключ-✓', E'a\nb', ' ', 'user-short-done-1'], g)
            ELSE pg_temp.pick(ARRAY['', repeat('k', 3000), NULL], g) END,
       CASE WHEN t.key IS NOT NULL THEN t.scope
            WHEN NOT odd THEN pg_temp.pick(ARRAY['', 'two-phase', 'target', 'other', 'two-phase '], g)
            ELSE pg_temp.pick(ARRAY[repeat('s', 500), NULL], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['user-billing', 'user-batch', 'su-batch', 'user-consumer',
                                                 'su-consumer', 'new-consumer'], g)
            ELSE pg_temp.pick(ARRAY['', repeat('c', 2000), NULL], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['msg-1', 'msg-2', 'msg-50', 'b-1', 'b-499', 'new-msg-' || g,
                                                 E'\t'], g)
            ELSE pg_temp.pick(ARRAY['', NULL, repeat('m', 3000)], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['orders', 'payments'], g)
            ELSE pg_temp.pick(ARRAY['', repeat('t', 1000), NULL], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['user-producer', 'su-producer', 'new-producer'], g)
            ELSE pg_temp.pick(ARRAY['', repeat('p', 1000), NULL], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['step-1', 'step-2', ''], g)
            ELSE pg_temp.pick(ARRAY[repeat('r', 5000), NULL], g) END,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['{"n": 1}', '{"n": 1.0}', '{"n": 2}', '{}', '[]', 'null', '"s"',
                                                  '0', '{"a": {"b": [1, 2.50, {"c": null}]}, "d": "e"}', '{"g": 3}'], g)
             ELSE pg_temp.pick(ARRAY['123456789012345678901234567890.000000000001',
                                     repeat('[', 1000) || repeat(']', 1000),
                                     '{"big": "' || repeat('x', 100000) || '"}'], g) END)::jsonb,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['{"charge": 1}', '{}', 'null', '[1, 2, 3]', '"ok"', NULL], g)
             ELSE pg_temp.pick(ARRAY['{"big": "' || repeat('x', 100000) || '"}', '-0.0'], g) END)::jsonb,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['{"Content-Type": "application/json"}', '{}', '{"X-A": "1"}',
                                                  NULL], g)
             ELSE pg_temp.pick(ARRAY['[]', 'null', '{"a": 1}', '{"X-A": ["1", "2"]}', '"h"'], g) END)::jsonb,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[NULL, '1 second', '2 seconds', '10 seconds', '1 minute',
                                                  '1 hour', '1 day', '7 days'], g)
             ELSE pg_temp.pick(ARRAY['0', '-1 second', '1000 years', '-1000 years', '1 microsecond', '1 mon'],
                               g) END)::interval,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[NULL, '1 second', '10 seconds', '10 minutes', '1 day'], g)
             ELSE pg_temp.pick(ARRAY['0', '-1 second', '100 years'], g) END)::interval,
       CASE WHEN t.key IS NOT NULL THEN t.token
            WHEN NOT odd THEN pg_temp.pick((SELECT array_agg(token ORDER BY key) FROM tokens
                                             WHERE token IS NOT NULL) || NULL::bigint, g)
            ELSE pg_temp.pick(ARRAY[0, -1, 9223372036854775807, -9223372036854775808], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[1, 2, 3], g)
            ELSE pg_temp.pick(ARRAY[0, -1, 9223372036854775807], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[1, 5, 6, 7, 100], g)
            ELSE pg_temp.pick(ARRAY[0, -1, 9223372036854775807], g) END,
       -- first and last offsets paired (lists of one length)
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[0, 10, 10, 20, 100], g)
            ELSE pg_temp.pick(ARRAY[-1, 9223372036854775806], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[9, 10, 19, 29, 150], g)
            ELSE pg_temp.pick(ARRAY[-1, 5, 9223372036854775807], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[1, 2, 3], g)
            ELSE pg_temp.pick(ARRAY[0, -1, 9223372036854775807, NULL], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[200, 201, 204, 404, 500], g)
            ELSE pg_temp.pick(ARRAY[0, -1, 99, 600, 2147483647, -2147483648], g) END,
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[0, 1, 2, 3, 11], g)
            ELSE pg_temp.pick(ARRAY[-1, 2147483647], g) END,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['{0,1,2}', '{}', '{0,0}', '{3,4,5,6,7,8,9}'], g)
             ELSE pg_temp.pick(ARRAY['{-1}', '{2147483647}', '{1,NULL}', NULL], g) END)::integer[],
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[NULL, NULL, NULL, '\x00'::bytea, convert_to('hello', 'UTF8')], g)
            ELSE pg_temp.pick(ARRAY['\x'::bytea, decode(repeat('ff', 100000), 'hex')], g) END,
       (CASE WHEN NOT odd THEN pg_temp.pick(ARRAY['{}', '{a,b,a}', '{msg-1,msg-2,new-1}', '{b-1,b-2,b-3}', '{""}'], g)
             ELSE pg_temp.pick(ARRAY['{NULL}', NULL], g) END)::text[],
       CASE WHEN NOT odd THEN pg_temp.pick(ARRAY[true, false], g) END,
       r.k, r.m, r.p, r.s
  FROM (SELECT (row_number() OVER (ORDER BY t.key NULLS LAST, g))::integer AS g, t.key, t.scope, t.token, g > 45 AS odd
          FROM generate_series(1, 60) g
          LEFT JOIN (SELECT row_number() OVER (ORDER BY key) AS n, * FROM tokens) t ON t.n = g) AS a (g, key, scope, token, odd)
  LEFT JOIN tokens t ON t.key = a.key
  LEFT JOIN records r ON r.n = a.g
 ORDER BY a.g;

-- Views that call the API, one call (or a handler's calls) per row of the
-- arguments: sqlsmith draws most of its FROM items from these (with their
-- WHERE, LIMIT and TABLESAMPLE, joins and subqueries), so that most queries
-- call the API even where its grammar puts no function call.  The plain
-- ones pass a row's values as they are (a key of the other role, a stale
-- token: an error, as a caller would get); the handler ones claim a row's
-- key first and go on with the token they got, as an application does, so
-- that completions, checkpoints and releases also succeed.  Security
-- invoker: the calls run as sqlsmith's role, on its own keys.  Those of
-- the functions that only a superuser may call are not granted to
-- sqlsmith_user (nor listed for it in information_schema.tables).
CREATE VIEW public.smith_claim WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.request, a.ttl, a.lease, a.wait, c.status, c.token, c.recovery_point,
       c.response_code, c.response_body, c.expires_at, c.response_headers, c.response_raw
  FROM public.smith_args a,
       LATERAL pg_catalog.idem_claim(a.key, a.request, a.scope, a.ttl,
                                     CASE WHEN a.lease <= coalesce(a.ttl, interval '1 minute') THEN a.lease END,
                                     a.wait, coalesce(a.wait, false) AND a.lease <= coalesce(a.ttl, interval '1 minute')) c;
CREATE VIEW public.smith_complete WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.token, a.code,
       sqlsmith_target.idem_complete(a.key, a.code, a.response, a.scope, a.token, a.headers,
                                     CASE WHEN a.response IS NULL THEN a.raw END) AS completed
  FROM public.smith_args a;
CREATE VIEW public.smith_checkpoint WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.token, a.recovery_point,
       sqlsmith_target.idem_checkpoint(a.key, a.recovery_point, a.scope, a.token) AS checkpointed
  FROM public.smith_args a;
CREATE VIEW public.smith_release WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.token, sqlsmith_target.idem_release(a.key, a.scope, a.token) AS released
  FROM public.smith_args a;
-- a handler in the same transaction: claim, then complete (or release)
CREATE VIEW public.smith_handle WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.code, c.status, c.token,
       CASE WHEN c.status <> 'claimed' THEN NULL
            WHEN a.code >= 500 THEN sqlsmith_target.idem_release(a.key, a.scope, c.token)
            ELSE sqlsmith_target.idem_complete(a.key, a.code, a.response, a.scope, c.token, a.headers,
                                               CASE WHEN a.response IS NULL THEN a.raw END) END AS finished
  FROM public.smith_args a, LATERAL pg_catalog.idem_claim(a.key, a.request, a.scope, a.ttl) c;
-- a two-phase handler: claim with a lease, checkpoint, then complete or
-- release with the token
CREATE VIEW public.smith_two_phase WITH (security_invoker = true) AS
SELECT a.key, a.scope, a.recovery_point, c.status, c.token,
       CASE WHEN c.status = 'claimed'
            THEN sqlsmith_target.idem_checkpoint(a.key, a.recovery_point, a.scope, c.token) END AS checkpointed,
       CASE WHEN c.status <> 'claimed' THEN NULL
            WHEN a.wait THEN sqlsmith_target.idem_release(a.key, a.scope, c.token)
            ELSE sqlsmith_target.idem_complete(a.key, a.code, a.response, a.scope, c.token, a.headers,
                                               CASE WHEN a.response IS NULL THEN a.raw END) END AS finished
  FROM public.smith_args a,
       LATERAL pg_catalog.idem_claim(a.key, a.request, a.scope, greatest(a.ttl, interval '1 minute'),
                                     least(coalesce(a.lease, interval '10 seconds'), interval '1 minute'),
                                     false, a.wait) c;
CREATE VIEW public.smith_lookup WITH (security_invoker = true) AS
SELECT a.key AS looked_up, a.scope AS in_scope, l.*
  FROM public.smith_args a, LATERAL pg_catalog.idem_lookup(a.key, a.scope) l;
CREATE VIEW public.smith_recover WITH (security_invoker = true) AS
SELECT a.lease AS after, a.part AS max_keys, r.*
  FROM public.smith_args a,
       LATERAL pg_catalog.idem_recover(coalesce(a.lease, interval '1 second'), a.scope, a.part) r;
CREATE VIEW public.smith_consume WITH (security_invoker = true) AS
SELECT a.consumer, a.message_id, a.ttl, pg_catalog.idem_consume_message(a.consumer, a.message_id, a.ttl) AS first
  FROM public.smith_args a;
CREATE VIEW public.smith_consume_batch WITH (security_invoker = true) AS
SELECT a.consumer, a.ids, a.ttl, n.id AS new_id
  FROM public.smith_args a, LATERAL pg_catalog.idem_consume_messages(a.consumer, a.ids, a.ttl) n (id);
CREATE VIEW public.smith_assign WITH (security_invoker = true) AS
SELECT a.consumer, a.stream, a.parts, a.generation AS assigned_generation, s.*
  FROM public.smith_args a, LATERAL pg_catalog.idem_assign(a.consumer, a.stream, a.parts, a.generation) s;
CREATE VIEW public.smith_advance WITH (security_invoker = true) AS
SELECT a.consumer, a.stream, a.part, a.generation, s.first_offset, s.last_offset
  FROM public.smith_args a,
       LATERAL pg_catalog.idem_advance(a.consumer, a.stream, a.part, a.first_offset, a.last_offset,
                                       a.generation) s;
CREATE VIEW public.smith_positions WITH (security_invoker = true) AS
SELECT a.consumer, a.stream AS of_stream, s.*
  FROM public.smith_args a, LATERAL pg_catalog.idem_positions(a.consumer, a.stream) s;
CREATE VIEW public.smith_sequence WITH (security_invoker = true) AS
SELECT a.consumer, a.producer, a.epoch, a.seq,
       pg_catalog.idem_sequence(a.consumer, a.producer, a.epoch, a.seq, false) AS answer
  FROM public.smith_args a;
GRANT SELECT ON public.smith_claim, public.smith_complete, public.smith_checkpoint, public.smith_release,
                public.smith_handle, public.smith_two_phase, public.smith_lookup, public.smith_recover,
                public.smith_consume, public.smith_consume_batch, public.smith_assign, public.smith_advance,
                public.smith_positions, public.smith_sequence
   TO sqlsmith_user;
-- the superuser's
CREATE VIEW public.smith_maintain AS
SELECT * FROM pg_catalog.idem_maintain();
CREATE VIEW public.smith_relocate AS
SELECT a.wait AS always, idempotency.relocate_lanes(a.wait) AS moved
  FROM public.smith_args a WHERE a.wait IS NOT NULL LIMIT 2;
CREATE VIEW public.smith_import WITH (security_invoker = true) AS
SELECT a.k, a.m, a.p, a.s,
       idempotency.import_key(a.k) AS key_outcome, idempotency.import_message(a.m) AS message_outcome,
       idempotency.import_position(a.p) AS position_outcome, idempotency.import_sequence(a.s) AS sequence_outcome
  FROM public.smith_args a;
CREATE VIEW public.smith_export_keys AS
SELECT * FROM idempotency.export_keys((SELECT ids FROM public.smith_args ORDER BY random() LIMIT 1));
CREATE VIEW public.smith_export_messages AS
SELECT * FROM idempotency.export_messages((SELECT ids FROM public.smith_args ORDER BY random() LIMIT 1));
CREATE VIEW public.smith_export_streams AS
SELECT p.role, p.consumer, p.stream AS name, p.next_offset AS position, p.updated_at
  FROM idempotency.export_positions((SELECT ids FROM public.smith_args ORDER BY random() LIMIT 1)) p
UNION ALL
SELECT s.role, s.consumer, s.producer, s.seq, s.updated_at
  FROM idempotency.export_sequences((SELECT ids FROM public.smith_args ORDER BY random() LIMIT 1)) s;
ANALYZE public.smith_args;
