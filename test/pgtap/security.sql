--
-- test/pgtap/security.sql -- the security contract of the idempotency
-- extension: role isolation of keys and messages, the storage schema closed
-- to ordinary roles, search_path attacks by an unprivileged role, and names
-- given by users kept out of DDL.  Everything runs in one transaction that
-- is rolled back (roles, look-alikes, partitions made here, rows); only
-- CREATE EXTENSION IF NOT EXISTS stays.
--
-- While an attacker's search_path is in effect, only the extension's
-- functions are called, and their results are kept in temporary tables:
-- pgTAP's own functions would resolve operators through that path.
--
CREATE EXTENSION IF NOT EXISTS idempotency;

BEGIN;
SELECT plan(61);

CREATE ROLE idem_pgtap_sec_alice;
CREATE ROLE idem_pgtap_sec_bob;
CREATE ROLE idem_pgtap_sec_mallory;
CREATE ROLE idem_pgtap_sec_monitor IN ROLE pg_monitor;

-- the storage tables exist from here on
SELECT lives_ok($$SELECT idem_maintain()$$, 'idem_maintain() makes the storage');

----------------------------------------------------------------------------
-- Role isolation
----------------------------------------------------------------------------

SET LOCAL ROLE idem_pgtap_sec_alice;
SELECT is(idem_consume_message('pgtap-sec', 'm-1'), true, 'alice: consumes m-1');
SELECT is((SELECT status FROM idem_claim('sec-done', '{"by": "alice"}')), 'claimed',
          'alice: claims sec-done');
SELECT lives_ok($$SELECT idem_complete('sec-done', 201, '{"by": "alice"}')$$,
                'alice: completes sec-done');
SELECT isnt((SELECT set_config('pgtap_sec.alice_token', token::text, true)
               FROM idem_claim('sec-held', lease => '1 hour')),
            NULL, 'alice: claims sec-held with a lease (token kept)');
SELECT lives_ok(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'sec-held', 'alice-step',
                       current_setting('pgtap_sec.alice_token')),
                'alice: checkpoints sec-held');
RESET ROLE;

SET LOCAL ROLE idem_pgtap_sec_bob;
SELECT is(idem_consume_message('pgtap-sec', 'm-1'), true,
          'bob: m-1 consumed by alice is new to bob');
SELECT is(idem_consume_message('pgtap-sec', 'm-1'), false, 'bob: ... and then his duplicate');
SELECT is((SELECT count(*)::int FROM idem_lookup('sec-done')), 0,
          'bob: does not see alice''s completed key');
SELECT is((SELECT count(*)::int FROM idem_lookup('sec-held')), 0,
          'bob: does not see alice''s claim in progress');
SELECT throws_ok(format('SELECT idem_complete(%L, 500, token => %s)', 'sec-held',
                        current_setting('pgtap_sec.alice_token')),
                 '55000', NULL, 'bob: cannot complete alice''s claim with her token');
SELECT throws_ok(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'sec-held', 'bob-step',
                        current_setting('pgtap_sec.alice_token')),
                 '55000', NULL, 'bob: cannot checkpoint alice''s claim with her token');
SELECT throws_ok(format('SELECT idem_release(%L, token => %s)', 'sec-held',
                        current_setting('pgtap_sec.alice_token')),
                 '55000', NULL, 'bob: cannot release alice''s claim with her token');
SELECT is((SELECT row(status, response_code)::text FROM idem_claim('sec-done', '{"by": "bob"}')),
          '(claimed,)', 'bob: the same key string is his own key, claimed afresh');
SELECT lives_ok($$SELECT idem_release('sec-done')$$, 'bob: releases his claim');
RESET ROLE;

-- membership is not identity: bob, a member of alice, acts as alice only
-- after SET ROLE
GRANT idem_pgtap_sec_alice TO idem_pgtap_sec_bob;
SET LOCAL ROLE idem_pgtap_sec_bob;
SELECT is((SELECT status FROM idem_lookup('sec-done')), 'released',
          'bob, member of alice: idem_lookup shows his own key');
SET LOCAL ROLE idem_pgtap_sec_alice;
SELECT is((SELECT row(status, response_code, response_body)::text FROM idem_lookup('sec-done')),
          '(completed,201,"{""by"": ""alice""}")',
          'bob as alice: idem_lookup shows alice''s key, untouched');
SELECT is((SELECT row(status, recovery_point)::text FROM idem_lookup('sec-held')),
          '(in_progress,alice-step)', 'alice: her claim in progress is untouched');
RESET ROLE;
REVOKE idem_pgtap_sec_alice FROM idem_pgtap_sec_bob;

-- a SECURITY DEFINER function acts as its owner
CREATE SCHEMA idem_pgtap_alice AUTHORIZATION idem_pgtap_sec_alice;
SET LOCAL ROLE idem_pgtap_sec_alice;
GRANT USAGE ON SCHEMA idem_pgtap_alice TO idem_pgtap_sec_bob;
CREATE FUNCTION idem_pgtap_alice.lookup(k text) RETURNS text SECURITY DEFINER LANGUAGE sql
  AS $$ SELECT status || ' as ' || current_user FROM pg_catalog.idem_lookup(k) $$;
RESET ROLE;
SET LOCAL ROLE idem_pgtap_sec_bob;
SELECT is(idem_pgtap_alice.lookup('sec-held'), 'in_progress as idem_pgtap_sec_alice',
          'bob through alice''s SECURITY DEFINER function: alice''s key');
RESET ROLE;

SELECT is((SELECT array_agg(role::text || ':' || n ORDER BY role::text)
             FROM (SELECT role, count(*) AS n FROM idempotency.messages
                    WHERE role IN ('idem_pgtap_sec_alice'::regrole, 'idem_pgtap_sec_bob'::regrole)
                    GROUP BY role) s),
          ARRAY['idem_pgtap_sec_alice:1', 'idem_pgtap_sec_bob:1'],
          'each role has its own message row');

----------------------------------------------------------------------------
-- The storage schema is closed to ordinary roles
----------------------------------------------------------------------------

SELECT is(ARRAY(SELECT format('%s %s %s', r, c.oid::regclass, p)
                  FROM unnest(ARRAY['idem_pgtap_sec_mallory', 'idem_pgtap_sec_monitor', 'public']) AS r,
                       pg_class c,
                       unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                    'REFERENCES', 'TRIGGER']) AS p
                 WHERE (c.oid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
                        OR c.oid IN (SELECT inhrelid FROM pg_inherits
                                      WHERE inhparent IN ('idempotency.keys'::regclass,
                                                          'idempotency.messages'::regclass)))
                   AND has_table_privilege(r, c.oid, p)),
          ARRAY[]::text[],
          'no privilege on the ledgers or any partition for an ordinary role, pg_monitor or PUBLIC');
SELECT ok(NOT has_schema_privilege('idem_pgtap_sec_mallory', 'idempotency', 'USAGE')
          AND NOT has_schema_privilege('idem_pgtap_sec_mallory', 'idempotency', 'CREATE')
          AND NOT has_schema_privilege('idem_pgtap_sec_monitor', 'idempotency', 'CREATE'),
          'no USAGE on schema idempotency for an ordinary role, no CREATE for anyone but its owner');

SELECT min(inhrelid::regclass::text) AS p FROM pg_inherits
 WHERE inhparent = 'idempotency.keys'::regclass \gset key_
SELECT min(inhrelid::regclass::text) AS p FROM pg_inherits
 WHERE inhparent = 'idempotency.messages'::regclass \gset message_
SET LOCAL ROLE idem_pgtap_sec_mallory;
SELECT throws_ok($$SELECT count(*) FROM idempotency.keys$$, '42501', NULL,
                 'mallory: SELECT idempotency.keys is refused');
SELECT throws_ok($$INSERT INTO idempotency.messages (expires_at) VALUES (now())$$, '42501', NULL,
                 'mallory: INSERT INTO idempotency.messages is refused');
SELECT throws_ok($$UPDATE idempotency.keys SET response_code = 200$$, '42501', NULL,
                 'mallory: UPDATE idempotency.keys is refused');
SELECT throws_ok($$DELETE FROM idempotency.messages$$, '42501', NULL,
                 'mallory: DELETE FROM idempotency.messages is refused');
SELECT throws_ok($$TRUNCATE idempotency.keys$$, '42501', NULL,
                 'mallory: TRUNCATE idempotency.keys is refused');
SELECT throws_ok(format('DELETE FROM %s', :'key_p'), '42501', NULL,
                 'mallory: DELETE FROM a key partition is refused');
SELECT throws_ok(format('TRUNCATE %s', :'message_p'), '42501', NULL,
                 'mallory: TRUNCATE of a message partition is refused');
SELECT throws_ok($$CREATE TABLE idempotency.keys_1_0_20000101_000000 (x int)$$, '42501', NULL,
                 'mallory: CREATE TABLE in schema idempotency is refused');
SELECT throws_ok($$CREATE FUNCTION idempotency.partition_info(int) RETURNS int LANGUAGE sql AS 'SELECT 1'$$,
                 '42501', NULL, 'mallory: CREATE FUNCTION in schema idempotency is refused');
RESET ROLE;
SET LOCAL ROLE idem_pgtap_sec_monitor;
SELECT lives_ok($$SELECT count(*) FROM idempotency.partitions$$,
                'pg_monitor member: reads the partitions view');
SELECT throws_ok($$SELECT count(*) FROM idempotency.keys$$, '42501', 'permission denied for table keys',
                 'pg_monitor member: cannot read idempotency.keys (refused by the table)');
SELECT throws_ok(format('SELECT count(*) FROM %s', :'message_p'), '42501', NULL,
                 'pg_monitor member: cannot read a message partition');
SELECT throws_ok($$DELETE FROM idempotency.messages$$, '42501', 'permission denied for table messages',
                 'pg_monitor member: cannot delete from idempotency.messages');
RESET ROLE;

----------------------------------------------------------------------------
-- search_path attacks by an unprivileged role
----------------------------------------------------------------------------

-- mallory's own schema, CREATE on public as in databases made before
-- PostgreSQL 15, and look-alikes that note every call in mallory.calls
CREATE SCHEMA idem_pgtap_mallory AUTHORIZATION idem_pgtap_sec_mallory;
GRANT CREATE ON SCHEMA public TO idem_pgtap_sec_mallory;
SET LOCAL ROLE idem_pgtap_sec_mallory;
GRANT USAGE ON SCHEMA idem_pgtap_mallory TO PUBLIC;
CREATE TABLE idem_pgtap_mallory.calls (what text);
GRANT INSERT ON idem_pgtap_mallory.calls TO PUBLIC;
CREATE FUNCTION idem_pgtap_mallory.note(what text) RETURNS boolean LANGUAGE sql
  AS $$ INSERT INTO idem_pgtap_mallory.calls VALUES (what) RETURNING true $$;
CREATE FUNCTION idem_pgtap_mallory.sha256(b bytea) RETURNS bytea LANGUAGE sql
  AS $$ SELECT pg_catalog.sha256(b) WHERE idem_pgtap_mallory.note('sha256') $$;
CREATE FUNCTION public.sha256(b bytea) RETURNS bytea LANGUAGE sql
  AS $$ SELECT pg_catalog.sha256(b) WHERE idem_pgtap_mallory.note('public.sha256') $$;
CREATE FUNCTION idem_pgtap_mallory.now() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE idem_pgtap_mallory.note('now') $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT '2000-01-01'::pg_catalog.timestamptz WHERE idem_pgtap_mallory.note('public.now') $$;
CREATE FUNCTION idem_pgtap_mallory.jsonb_build_object(a text, b text) RETURNS jsonb LANGUAGE sql
  AS $$ SELECT pg_catalog.jsonb_build_object(a, b) WHERE idem_pgtap_mallory.note('jsonb_build_object') $$;
CREATE FUNCTION idem_pgtap_mallory.partition_info() RETURNS SETOF record LANGUAGE sql
  AS $$ SELECT NULL::record WHERE idem_pgtap_mallory.note('partition_info') $$;
CREATE FUNCTION idem_pgtap_mallory.text_eq(a text, b text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN idem_pgtap_mallory.note('=(text,text)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR idem_pgtap_mallory.= (LEFTARG = text, RIGHTARG = text, FUNCTION = idem_pgtap_mallory.text_eq);
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = idem_pgtap_mallory.text_eq);
CREATE FUNCTION idem_pgtap_mallory.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN idem_pgtap_mallory.note('=(uuid,uuid)') THEN a OPERATOR(pg_catalog.=) b END $$;
CREATE OPERATOR idem_pgtap_mallory.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = idem_pgtap_mallory.uuid_eq);
CREATE FUNCTION idem_pgtap_mallory.regrole_eq(a regrole, b regrole) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN idem_pgtap_mallory.note('=(regrole,regrole)') THEN a::oid OPERATOR(pg_catalog.=) b::oid END $$;
CREATE OPERATOR idem_pgtap_mallory.= (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = idem_pgtap_mallory.regrole_eq);
CREATE FUNCTION idem_pgtap_mallory.ts_le(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE sql
  AS $$ SELECT CASE WHEN idem_pgtap_mallory.note('<=(timestamptz,timestamptz)') THEN a OPERATOR(pg_catalog.<=) b END $$;
CREATE OPERATOR idem_pgtap_mallory.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = idem_pgtap_mallory.ts_le);
CREATE OPERATOR public.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = idem_pgtap_mallory.ts_le);
CREATE DOMAIN idem_pgtap_mallory.timestamptz AS pg_catalog.timestamptz CHECK (VALUE IS NULL);
CREATE DOMAIN idem_pgtap_mallory.uuid AS pg_catalog.uuid CHECK (VALUE IS NULL);
CREATE TABLE idem_pgtap_mallory.keys (LIKE pg_catalog.pg_class);
CREATE TABLE idem_pgtap_mallory.messages (LIKE pg_catalog.pg_class);
RESET ROLE;
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.calls), 0,
          'no look-alike has been called yet');

-- mallory, her schema first: every function, with ttls that make partitions
-- on the spot (DDL as the extension's owner) while her path is in effect
SET LOCAL ROLE idem_pgtap_sec_mallory;
SET LOCAL search_path = idem_pgtap_mallory, public, pg_catalog;
CREATE TEMP TABLE sp_results AS
SELECT idem_consume_message('pgtap-sec', 'sp-1', '20 days') AS consumed,
       (SELECT count(*) FROM idem_consume_messages('pgtap-sec', ARRAY['sp-2', 'sp-3', 'sp-2'], '20 days')) AS batch,
       (SELECT status FROM idem_claim('sp-key', '{"b": 1, "a": 2}', 'tenant', '10 days', '1 hour')) AS claim;
UPDATE sp_results SET claim = claim || ' ' || (SELECT token FROM idem_lookup('sp-key', 'tenant'));
CREATE TEMP TABLE sp_steps AS
SELECT idem_checkpoint('sp-key', 'step-1', 'tenant', split_part(claim, ' ', 2)::bigint) IS NULL AS done
  FROM sp_results;
INSERT INTO sp_steps
SELECT idem_complete('sp-key', 201, '{"done": true}', 'tenant', split_part(claim, ' ', 2)::bigint) IS NULL
  FROM sp_results;
CREATE TEMP TABLE sp_after AS
SELECT (SELECT status FROM idem_claim('sp-key', '{"a": 2, "b": 1}', 'tenant')) AS same_request,
       (SELECT status FROM idem_claim('sp-key', '{"a": 3}', 'tenant')) AS other_request,
       (SELECT recovery_point FROM idem_lookup('sp-key', 'tenant')) AS recovery_point,
       idem_consume_message('pgtap-sec', 'sp-1') AS consumed_again;
RESET search_path;
RESET ROLE;

SELECT is((SELECT row(consumed, batch, split_part(claim, ' ', 1))::text FROM sp_results),
          '(t,2,claimed)', 'mallory, her path first: consume, batch and claim work');
SELECT is((SELECT row(same_request, other_request, recovery_point, consumed_again)::text FROM sp_after),
          '(completed,mismatch,step-1,f)',
          'mallory, her path first: replay, mismatch, recovery point and duplicate as usual');
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.calls), 0,
          'no look-alike was called by mallory''s calls');
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.keys) + (SELECT count(*)::int FROM idem_pgtap_mallory.messages),
          0, 'nothing was written to the look-alike tables');
SELECT is((SELECT fingerprint FROM idempotency.keys
            WHERE role = 'idem_pgtap_sec_mallory'::regrole AND state = 'c'),
          pg_catalog.sha256(convert_to('{"a": 2, "b": 1}', 'UTF8')),
          'the fingerprint is SHA-256 of the canonical request');
SELECT ok((SELECT expires_at - claimed_at = interval '10 days'
                  AND claimed_at BETWEEN pg_catalog.now() AND pg_catalog.clock_timestamp()
             FROM idempotency.keys WHERE role = 'idem_pgtap_sec_mallory'::regrole AND state = 'c'),
          'claim time and expiry come from the real clock');
SELECT ok((SELECT count(*) > 0 FROM idempotency.partitions
            WHERE table_name = 'messages' AND upper_bound > pg_catalog.now() + interval '19 days'),
          'partitions were made during mallory''s calls');
SELECT is((SELECT count(*)::int
             FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
             JOIN pg_type t ON t.oid = a.atttypid
            WHERE i.inhparent IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
              AND (c.relowner <> (SELECT extowner FROM pg_extension WHERE extname = 'idempotency')
                   OR c.relnamespace <> 'idempotency'::regnamespace
                   OR t.typnamespace <> 'pg_catalog'::regnamespace)),
          0, 'every partition is the extension owner''s, in schema idempotency, with pg_catalog types');

-- the same ids, consumed by alice with a clean path, have the same digests
SET LOCAL ROLE idem_pgtap_sec_alice;
SELECT is(idem_consume_message('pgtap-sec', 'sp-1', '20 days'), true, 'alice: consumes sp-1 too');
RESET ROLE;
SELECT is((SELECT count(DISTINCT digest)::int FROM idempotency.messages
            WHERE role IN ('idem_pgtap_sec_mallory'::regrole, 'idem_pgtap_sec_alice'::regrole)
              AND expires_at > pg_catalog.now() + interval '19 days'),
          3, 'mallory''s digests (sp-1, sp-2, sp-3) are those of a clean path (alice''s sp-1 is among them)');

-- a superuser with public and mallory's schema before pg_catalog runs
-- idem_maintain() for a new layout: the DDL it issues calls no look-alike
SET LOCAL idempotency.partition_interval = '12h';
SET LOCAL search_path = public, idem_pgtap_mallory, pg_catalog;
CREATE TEMP TABLE maintained AS SELECT * FROM idem_maintain();
RESET search_path;
SET LOCAL idempotency.partition_interval = '1d';
SELECT ok((SELECT partitions_created > 0 FROM maintained),
          'a superuser with a careless path: idem_maintain() made partitions of a new layout');
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.calls), 0,
          'no look-alike was called by idem_maintain()');

-- look-alikes of the API, with the same argument types, in public: the
-- default path has pg_catalog first; pg_catalog-qualified calls ignore the path
SET LOCAL ROLE idem_pgtap_sec_mallory;
CREATE FUNCTION public.idem_consume_message(consumer text, message_id text) RETURNS boolean
  LANGUAGE sql AS $$ SELECT idem_pgtap_mallory.note('public.idem_consume_message') $$;
CREATE FUNCTION public.idem_maintain() RETURNS record
  LANGUAGE sql AS $$ SELECT ROW(0, 0) WHERE idem_pgtap_mallory.note('public.idem_maintain') $$;
CREATE FUNCTION idem_pgtap_mallory.idem_consume_message(consumer text, message_id text) RETURNS boolean
  LANGUAGE sql AS $$ SELECT idem_pgtap_mallory.note('idem_pgtap_mallory.idem_consume_message') $$;
RESET ROLE;
SET LOCAL ROLE idem_pgtap_sec_alice;
SELECT is(idem_consume_message('pgtap-sec', 'lookalike-1'), true,
          'alice, default path: consumes lookalike-1');
SET LOCAL search_path = idem_pgtap_mallory, public, pg_catalog;
CREATE TEMP TABLE qualified AS
SELECT pg_catalog.idem_consume_message('pgtap-sec', 'lookalike-2') AS consumed;
RESET search_path;
SELECT is(idem_consume_message('pgtap-sec', 'lookalike-1') OR idem_consume_message('pgtap-sec', 'lookalike-2'),
          false, 'alice: both were consumed by the real function');
RESET ROLE;
SELECT lives_ok($$SELECT partitions_created FROM idem_maintain()$$,
                'superuser, default path: idem_maintain() is the real one');
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.calls), 0,
          'no look-alike of the API was called');

----------------------------------------------------------------------------
-- Names given by users are data
----------------------------------------------------------------------------

CREATE TABLE idem_pgtap_victim (x int);
CREATE TEMP TABLE relations_before AS SELECT oid FROM pg_class;
CREATE TEMP TABLE names (name text);
INSERT INTO names VALUES
  ($$x'; DROP TABLE idem_pgtap_victim; --$$),
  ($$x"; DROP TABLE idem_pgtap_victim; --$$),
  ($$"quoted"$$),
  ($$idempotency.keys$$),
  ($$keys_1_0_20000101_000000$$),
  ($$%s %I %L$$),
  ($n$$$ DROP TABLE idem_pgtap_victim; $$$n$),
  (E'line\nbreak'),
  ('ключ 🔑 鍵'),
  (repeat('x', 255));
GRANT SELECT ON names TO idem_pgtap_sec_mallory;
SET LOCAL ROLE idem_pgtap_sec_mallory;
SELECT is((SELECT count(*)::int FROM pg_temp.names WHERE idem_consume_message(name, name, '25 days')), 10,
          'mallory: every odd name is a new message id of a consumer of that name');
SELECT is((SELECT count(*)::int
             FROM pg_temp.names, LATERAL idem_claim(name, pg_catalog.jsonb_build_object('name', name), name,
                                                   '11 days', '1 hour') c
            WHERE c.status = 'claimed'), 10,
          'mallory: every odd name is a new key in a scope of that name');
SELECT is((SELECT count(*)::int
             FROM pg_temp.names, LATERAL idem_lookup(name, name) l
            WHERE l.status = 'in_progress'), 10,
          'mallory: ... and is looked up by it');
SELECT is((SELECT count(*)::int FROM pg_temp.names WHERE idem_consume_message(name, name)), 0,
          'mallory: ... and every message id is a duplicate the second time');
RESET ROLE;
SELECT has_table('public', 'idem_pgtap_victim', 'the victim table is still there');
-- ledger partitions, told apart by what they are attached to (which ones
-- the calls above make depends on the date), and their indexes: the digest
-- index the extension makes, and the partitions of the ledger's own
-- partitioned indexes
CREATE TEMP VIEW ledger_partitions AS
  SELECT c.oid, c.relname
    FROM pg_class c JOIN pg_inherits h ON h.inhrelid = c.oid
   WHERE h.inhparent IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
     AND c.relkind = 'r'
     AND c.relnamespace = 'idempotency'::regnamespace
     AND c.relname ~ '^(keys|messages)_n[0-9]+_f?[0-9]+_[0-9]{8}_[0-9]{6}(_[0-9]{6})?$';
SELECT is(ARRAY(SELECT c.relnamespace::regnamespace || '.' || c.relname
                  FROM pg_class c
                 WHERE c.oid NOT IN (SELECT oid FROM relations_before)
                   AND c.relnamespace <> 'pg_toast'::regnamespace
                   AND c.relpersistence <> 't'
                   AND c.oid NOT IN (SELECT oid FROM ledger_partitions)
                   AND NOT EXISTS (SELECT FROM pg_index i JOIN ledger_partitions p ON p.oid = i.indrelid
                                    WHERE i.indexrelid = c.oid
                                      AND c.relnamespace = 'idempotency'::regnamespace
                                      AND (c.relname = p.relname || '_role_digest_idx'
                                           OR EXISTS (SELECT FROM pg_inherits hi
                                                        JOIN pg_index pi ON pi.indexrelid = hi.inhparent
                                                       WHERE hi.inhrelid = c.oid
                                                         AND pi.indrelid IN ('idempotency.keys'::regclass,
                                                                             'idempotency.messages'::regclass))))),
          ARRAY[]::text[],
          'the only new relations are ledger partitions, named by the extension, and their indexes');
SELECT ok((SELECT count(*) > 0 FROM pg_class c
            WHERE c.oid NOT IN (SELECT oid FROM relations_before)
              AND c.relnamespace = 'idempotency'::regnamespace),
          '... and the odd names made some (their ttls needed new partitions)');
SELECT is((SELECT count(*)::int FROM relations_before b
            WHERE NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = b.oid)),
          0, 'no relation was dropped');
SELECT is((SELECT count(*)::int FROM idem_pgtap_mallory.calls), 0,
          'no look-alike was called at all');

SELECT * FROM finish();
ROLLBACK;
