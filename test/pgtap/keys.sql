--
-- test/pgtap/keys.sql -- the SQL contract of the idempotency-key functions:
-- signatures and properties, privileges, the storage table idempotency.keys,
-- and role isolation.  Everything runs in one transaction that is rolled
-- back (the roles, the storage table if this test made it, the keys); only
-- CREATE EXTENSION IF NOT EXISTS stays.  (Same-transaction claims are never
-- committed here, so the check at COMMIT does not apply.)
--
CREATE EXTENSION IF NOT EXISTS idempotency;

BEGIN;
SELECT plan(93);

-- Roles of this test: one ordinary role, two for isolation.
CREATE ROLE idem_pgtap_keys_plain;
CREATE ROLE idem_pgtap_keys_alice;
CREATE ROLE idem_pgtap_keys_bob;

----------------------------------------------------------------------------
-- API functions
----------------------------------------------------------------------------

-- idem_claim(key text, request jsonb, scope text, ttl interval, lease interval, wait boolean,
--            keep_request boolean)
--   RETURNS (status, token, recovery_point, response_code, response_body, expires_at,
--            response_headers, response_raw)
SELECT has_function('pg_catalog', 'idem_claim',
                    ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'boolean', 'boolean'],
                    'idem_claim(text, jsonb, text, interval, interval, boolean, boolean) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_claim'), 1,
          'idem_claim has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean)'::regprocedure),
          'key text, request jsonb DEFAULT NULL::jsonb, scope text DEFAULT ''''::text, '
          'ttl interval DEFAULT NULL::interval, lease interval DEFAULT NULL::interval, '
          'wait boolean DEFAULT false, keep_request boolean DEFAULT false',
          'idem_claim argument names and defaults');
SELECT function_returns('pg_catalog', 'idem_claim',
                        ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'boolean', 'boolean'],
                        'idempotency.claim_result',
                        'idem_claim returns one idempotency.claim_result');
SELECT is(ARRAY(SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                  FROM pg_attribute a
                 WHERE a.attrelid = 'idempotency.claim_result'::regclass AND a.attnum > 0
                 ORDER BY a.attnum),
          ARRAY['status text', 'token bigint', 'recovery_point text', 'response_code integer',
                'response_body jsonb', 'expires_at timestamp with time zone',
                'response_headers jsonb', 'response_raw bytea'],
          'idem_claim answers status, token, recovery_point, response_code, response_body, expires_at, response_headers, response_raw');
SELECT is((SELECT proretset FROM pg_proc
            WHERE oid = 'pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean)'::regprocedure),
          false, 'idem_claim returns a single row, not a set');

-- idem_complete(key text, response_code int, response_body jsonb, scope text, token bigint,
--               response_headers jsonb, response_raw bytea) RETURNS void
SELECT has_function('pg_catalog', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'text', 'bigint', 'jsonb', 'bytea'],
                    'idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_complete'), 1,
          'idem_complete has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea)'::regprocedure),
          'key text, response_code integer, response_body jsonb DEFAULT NULL::jsonb, '
          'scope text DEFAULT ''''::text, token bigint DEFAULT NULL::bigint, '
          'response_headers jsonb DEFAULT NULL::jsonb, response_raw bytea DEFAULT NULL::bytea',
          'idem_complete argument names and defaults');
SELECT function_returns('pg_catalog', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'text', 'bigint', 'jsonb', 'bytea'],
                        'void', 'idem_complete returns void');

-- idem_checkpoint(key text, recovery_point text, scope text, token bigint) RETURNS void
SELECT has_function('pg_catalog', 'idem_checkpoint', ARRAY['text', 'text', 'text', 'bigint'],
                    'idem_checkpoint(text, text, text, bigint) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_checkpoint'), 1,
          'idem_checkpoint has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_checkpoint(text, text, text, bigint)'::regprocedure),
          'key text, recovery_point text, scope text DEFAULT ''''::text, token bigint DEFAULT NULL::bigint',
          'idem_checkpoint argument names and defaults');
SELECT function_returns('pg_catalog', 'idem_checkpoint', ARRAY['text', 'text', 'text', 'bigint'],
                        'void', 'idem_checkpoint returns void');

-- idem_release(key text, scope text, token bigint) RETURNS void
SELECT has_function('pg_catalog', 'idem_release', ARRAY['text', 'text', 'bigint'],
                    'idem_release(text, text, bigint) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_release'), 1,
          'idem_release has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_release(text, text, bigint)'::regprocedure),
          'key text, scope text DEFAULT ''''::text, token bigint DEFAULT NULL::bigint',
          'idem_release argument names and defaults');
SELECT function_returns('pg_catalog', 'idem_release', ARRAY['text', 'text', 'bigint'],
                        'void', 'idem_release returns void');

-- idem_lookup(key text, scope text) RETURNS TABLE (...)
SELECT has_function('pg_catalog', 'idem_lookup', ARRAY['text', 'text'],
                    'idem_lookup(text, text) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_lookup'), 1,
          'idem_lookup has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_lookup(text, text)'::regprocedure),
          'key text, scope text DEFAULT ''''::text',
          'idem_lookup argument names and defaults');
SELECT is(pg_get_function_result('pg_catalog.idem_lookup(text, text)'::regprocedure),
          'TABLE(status text, token bigint, recovery_point text, response_code integer, '
          'response_body jsonb, claimed_at timestamp with time zone, '
          'expires_at timestamp with time zone, lease_expires_at timestamp with time zone, '
          'response_headers jsonb, response_raw bytea, request jsonb)',
          'idem_lookup returns a table of its columns');
SELECT function_returns('pg_catalog', 'idem_lookup', ARRAY['text', 'text'], 'setof record',
                        'idem_lookup returns SETOF record');

-- idem_recover(lease interval, scope text, max_keys int) RETURNS TABLE (...)
SELECT has_function('pg_catalog', 'idem_recover', ARRAY['interval', 'text', 'integer'],
                    'idem_recover(interval, text, integer) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_recover'), 1,
          'idem_recover has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_recover(interval, text, integer)'::regprocedure),
          'lease interval, scope text DEFAULT NULL::text, max_keys integer DEFAULT 10',
          'idem_recover argument names and defaults');
SELECT is(pg_get_function_result('pg_catalog.idem_recover(interval, text, integer)'::regprocedure),
          'TABLE(key text, scope text, token bigint, recovery_point text, request jsonb, '
          'lapsed_at timestamp with time zone)',
          'idem_recover returns a table of its columns');
SELECT function_returns('pg_catalog', 'idem_recover', ARRAY['interval', 'text', 'integer'], 'setof record',
                        'idem_recover returns SETOF record');

-- properties shared by all six: VOLATILE, PARALLEL UNSAFE, not SECURITY
-- DEFINER, not STRICT, no SET clause, C language, members of the extension,
-- executable by an ordinary role
CREATE TEMP TABLE key_functions (fn regprocedure PRIMARY KEY);
INSERT INTO key_functions VALUES
  ('pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean)'),
  ('pg_catalog.idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea)'),
  ('pg_catalog.idem_checkpoint(text, text, text, bigint)'),
  ('pg_catalog.idem_release(text, text, bigint)'),
  ('pg_catalog.idem_lookup(text, text)'),
  ('pg_catalog.idem_recover(interval, text, integer)');

SELECT volatility_is('pg_catalog', 'idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'boolean', 'boolean'],
                     'volatile', 'idem_claim is VOLATILE');
SELECT volatility_is('pg_catalog', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'text', 'bigint', 'jsonb', 'bytea'],
                     'volatile', 'idem_complete is VOLATILE');
SELECT volatility_is('pg_catalog', 'idem_checkpoint', ARRAY['text', 'text', 'text', 'bigint'],
                     'volatile', 'idem_checkpoint is VOLATILE');
SELECT volatility_is('pg_catalog', 'idem_release', ARRAY['text', 'text', 'bigint'],
                     'volatile', 'idem_release is VOLATILE');
SELECT volatility_is('pg_catalog', 'idem_lookup', ARRAY['text', 'text'],
                     'volatile', 'idem_lookup is VOLATILE');
SELECT volatility_is('pg_catalog', 'idem_recover', ARRAY['interval', 'text', 'integer'],
                     'volatile', 'idem_recover is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_claim', ARRAY['text', 'jsonb', 'text', 'interval', 'interval', 'boolean', 'boolean'],
                    'idem_claim is not SECURITY DEFINER');
SELECT isnt_definer('pg_catalog', 'idem_complete', ARRAY['text', 'integer', 'jsonb', 'text', 'bigint', 'jsonb', 'bytea'],
                    'idem_complete is not SECURITY DEFINER');
SELECT isnt_definer('pg_catalog', 'idem_checkpoint', ARRAY['text', 'text', 'text', 'bigint'],
                    'idem_checkpoint is not SECURITY DEFINER');
SELECT isnt_definer('pg_catalog', 'idem_release', ARRAY['text', 'text', 'bigint'],
                    'idem_release is not SECURITY DEFINER');
SELECT isnt_definer('pg_catalog', 'idem_lookup', ARRAY['text', 'text'],
                    'idem_lookup is not SECURITY DEFINER');
SELECT isnt_definer('pg_catalog', 'idem_recover', ARRAY['interval', 'text', 'integer'],
                    'idem_recover is not SECURITY DEFINER');
SELECT is(ARRAY(SELECT fn::text FROM key_functions k JOIN pg_proc p ON p.oid = k.fn
                 WHERE p.proisstrict ORDER BY 1),
          ARRAY[]::text[], 'none of the key functions is STRICT (NULL arguments get a clean error)');
SELECT is(ARRAY(SELECT fn::text FROM key_functions k JOIN pg_proc p ON p.oid = k.fn
                 WHERE p.proparallel <> 'u' ORDER BY 1),
          ARRAY[]::text[], 'every key function is PARALLEL UNSAFE');
SELECT is(ARRAY(SELECT fn::text FROM key_functions k JOIN pg_proc p ON p.oid = k.fn
                 WHERE p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
                    OR p.proconfig IS NOT NULL ORDER BY 1),
          ARRAY[]::text[], 'every key function is in C, with no SET clause');
SELECT is(ARRAY(SELECT fn::text FROM key_functions k JOIN pg_proc p ON p.oid = k.fn
                 WHERE p.pronamespace <> 'pg_catalog'::regnamespace ORDER BY 1),
          ARRAY[]::text[], 'every key function is in pg_catalog');
SELECT is((SELECT count(*)::int FROM key_functions k
             JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = k.fn
            WHERE d.refclassid = 'pg_extension'::regclass
              AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
              AND d.deptype = 'e'),
          6, 'the six key functions are members of the extension');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean)', 'EXECUTE'),
          'an ordinary role can execute idem_claim()');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea)', 'EXECUTE'),
          'an ordinary role can execute idem_complete()');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_checkpoint(text, text, text, bigint)', 'EXECUTE'),
          'an ordinary role can execute idem_checkpoint()');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_release(text, text, bigint)', 'EXECUTE'),
          'an ordinary role can execute idem_release()');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_lookup(text, text)', 'EXECUTE'),
          'an ordinary role can execute idem_lookup()');
SELECT ok(has_function_privilege('idem_pgtap_keys_plain', 'pg_catalog.idem_recover(interval, text, integer)', 'EXECUTE'),
          'an ordinary role can execute idem_recover()');

----------------------------------------------------------------------------
-- Storage table, made on first use (here by an ordinary role's first claim)
----------------------------------------------------------------------------

SET LOCAL ROLE idem_pgtap_keys_alice;
SELECT is((SELECT status FROM idem_claim('same', '{"who": "alice"}')), 'claimed',
          'alice: a first claim of (scope '''', key same) is claimed');
SELECT lives_ok($$SELECT idem_complete('same', 201, '{"by": "alice"}')$$,
                'alice: completes her claim in the same transaction');
SELECT is((SELECT row(status, token IS NULL, response_code, response_body)::text
             FROM idem_claim('same', '{"who": "alice"}')),
          '(completed,t,201,"{""by"": ""alice""}")',
          'alice: a second claim replays her response');
RESET ROLE;

SELECT is_partitioned('idempotency', 'keys',
                      'idempotency.keys exists after the first claim and is partitioned');
SELECT is((SELECT partstrat::text FROM pg_partitioned_table
            WHERE partrelid = 'idempotency.keys'::regclass),
          'r', 'idempotency.keys is partitioned by RANGE');
SELECT is((SELECT array_agg(a.attname ORDER BY k.ord)
             FROM pg_partitioned_table pt
             CROSS JOIN LATERAL unnest(pt.partattrs::int2[]) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.attnum
            WHERE pt.partrelid = 'idempotency.keys'::regclass),
          ARRAY['lane', 'expires_at']::name[],
          'idempotency.keys partition key is (lane, expires_at), as for idempotency.messages');
SELECT is((SELECT partdefid FROM pg_partitioned_table
            WHERE partrelid = 'idempotency.keys'::regclass),
          0::oid, 'idempotency.keys has no DEFAULT partition');
SELECT is((SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod)
                            || CASE WHEN attnotnull THEN ' not null' ELSE '' END ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = 'idempotency.keys'::regclass AND attnum > 0 AND NOT attisdropped),
          ARRAY['expires_at timestamp with time zone not null', 'digest uuid not null',
                'role regrole not null', 'lane smallint not null',
                'state "char" not null', 'token bigint not null',
                'claimed_at timestamp with time zone not null',
                'lease_until timestamp with time zone', 'fingerprint bytea',
                'recovery_point text', 'response_code integer', 'response_body jsonb',
                'kept_key text', 'kept_scope text', 'kept_request jsonb',
                'recover_at timestamp with time zone', 'response_headers jsonb',
                'response_raw bytea'],
          'idempotency.keys has its columns');
SELECT is((SELECT relowner FROM pg_class WHERE oid = 'idempotency.keys'::regclass),
          (SELECT extowner FROM pg_extension WHERE extname = 'idempotency'),
          'idempotency.keys is owned by the extension owner, not by the role whose claim made it');
SELECT cmp_ok((SELECT count(*)::int FROM pg_inherits
                WHERE inhparent = 'idempotency.keys'::regclass), '>', 0,
              'the first claim made at least one partition');
SELECT is((SELECT count(*)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.keys'::regclass
              AND c.relowner <> (SELECT extowner FROM pg_extension WHERE extname = 'idempotency')),
          0, 'every partition of idempotency.keys is owned by the extension owner');
SELECT is((SELECT count(*)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.keys'::regclass
              AND (c.relnamespace <> 'idempotency'::regnamespace
                   OR c.relname !~ '^keys_n[0-9]+_f?[0-9]+_[0-9]{8}_[0-9]{6}(_[0-9]{6})?$')),
          0, 'partitions are named idempotency.keys_n<lanes>_<lane>_<yyyymmdd_hhmmss>');
SELECT is((SELECT count(*)::int FROM idempotency.partitions WHERE table_name = 'keys'),
          (SELECT count(*)::int FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass),
          'idempotency.partitions lists every partition of idempotency.keys');
SELECT is((SELECT array_agg(DISTINCT c.relname::text ORDER BY c.relname::text)
             FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.keys'::regclass
              AND ARRAY(SELECT regexp_replace(pg_get_indexdef(x.indexrelid), '^.* USING ', '')
                               || CASE WHEN x.indisvalid THEN '' ELSE ' (invalid)' END
                          FROM pg_index x WHERE x.indrelid = c.oid ORDER BY 1)
                  IS DISTINCT FROM ARRAY['btree (role, digest) WITH (deduplicate_items=off)',
                                         'btree (role, recover_at) WHERE (recover_at IS NOT NULL)']),
          NULL,
          'every partition of idempotency.keys has two valid indexes: (role, digest), without deduplication, and (role, recover_at) for kept requests');

-- an ordinary role can neither read nor write the storage
SELECT is(ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                           'REFERENCES', 'TRIGGER']) AS p
                 WHERE has_table_privilege('idem_pgtap_keys_plain', 'idempotency.keys', p)),
          ARRAY[]::text[],
          'an ordinary role has no privilege on idempotency.keys');
SELECT is(ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p
                 WHERE has_any_column_privilege('idem_pgtap_keys_plain', 'idempotency.keys', p)),
          ARRAY[]::text[],
          'an ordinary role has no column privilege on idempotency.keys');
SELECT is((SELECT count(*)::int FROM pg_inherits i
            WHERE i.inhparent = 'idempotency.keys'::regclass
              AND (has_table_privilege('idem_pgtap_keys_plain', i.inhrelid, 'SELECT')
                   OR has_table_privilege('idem_pgtap_keys_plain', i.inhrelid, 'INSERT')
                   OR has_table_privilege('idem_pgtap_keys_plain', i.inhrelid, 'UPDATE')
                   OR has_table_privilege('idem_pgtap_keys_plain', i.inhrelid, 'DELETE')
                   OR has_table_privilege('idem_pgtap_keys_plain', i.inhrelid, 'TRUNCATE'))),
          0, 'an ordinary role has no privilege on any partition of idempotency.keys');
SELECT is((SELECT array_agg(a.grantee::regrole::text || ':' || a.privilege_type)
             FROM pg_class c, aclexplode(c.relacl) AS a
            WHERE c.oid = 'idempotency.keys'::regclass AND a.grantee <> c.relowner),
          NULL, 'idempotency.keys is granted to nobody but its owner (not even PUBLIC)');
SET LOCAL ROLE idem_pgtap_keys_alice;
SELECT throws_ok($$SELECT count(*) FROM idempotency.keys$$, '42501', NULL,
                 'alice, whose claim made it, cannot read idempotency.keys');
SELECT throws_ok($$UPDATE idempotency.keys SET response_code = 500$$, '42501', NULL,
                 'alice cannot update idempotency.keys');
SELECT throws_ok($$DELETE FROM idempotency.keys$$, '42501', NULL,
                 'alice cannot delete from idempotency.keys');
RESET ROLE;

-- not an extension member (pg_dump carries it), but DROP EXTENSION takes it
SELECT is((SELECT count(*)::int FROM pg_depend
            WHERE classid = 'pg_class'::regclass
              AND objid = 'idempotency.keys'::regclass
              AND refclassid = 'pg_extension'::regclass
              AND deptype = 'e'),
          0, 'idempotency.keys is not an extension member');
SELECT is((SELECT array_agg(deptype::text) FROM pg_depend
            WHERE classid = 'pg_class'::regclass
              AND objid = 'idempotency.keys'::regclass
              AND refclassid = 'pg_extension'::regclass
              AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')),
          ARRAY['a'],
          'idempotency.keys has one AUTO dependency on the extension');

----------------------------------------------------------------------------
-- Role isolation: a key claimed and completed by alice is absent for bob
----------------------------------------------------------------------------

SET LOCAL ROLE idem_pgtap_keys_alice;
SELECT is((SELECT status FROM idem_claim('held', lease => '1 hour')), 'claimed',
          'alice: claims (held) with a lease');
SELECT isnt((SELECT set_config('pgtap_keys.alice_token', token::text, true) FROM idem_lookup('held')),
            NULL, 'alice: idem_lookup shows the token of her claim (kept for later)');
SELECT is((SELECT count(*)::int FROM idem_lookup('same')), 1, 'alice: looks up her key (same)');
RESET ROLE;

SET LOCAL ROLE idem_pgtap_keys_bob;
SELECT is((SELECT count(*)::int FROM idem_lookup('same')), 0,
          'bob: idem_lookup does not show alice''s key (same)');
SELECT is((SELECT count(*)::int FROM idem_lookup('held')), 0,
          'bob: idem_lookup does not show alice''s claim (held)');
SELECT is((SELECT row(status, token IS NOT NULL, response_code)::text
             FROM idem_claim('same', '{"who": "bob"}')),
          '(claimed,t,)',
          'bob: (same) is claimed, not a replay of alice''s response nor a mismatch');
SELECT is((SELECT row(status, response_code)::text FROM idem_lookup('same')),
          '(in_progress,)',
          'bob: idem_lookup shows bob''s own claim only');
SELECT lives_ok($$SELECT idem_complete('same', 202, '{"by": "bob"}')$$,
                'bob: completes his own claim of (same)');
SELECT is((SELECT row(status, response_code, response_body)::text FROM idem_lookup('same')),
          '(completed,202,"{""by"": ""bob""}")',
          'bob: idem_lookup shows bob''s response');
SELECT is((SELECT row(status, response_code, response_body)::text
             FROM idem_claim('same', '{"who": "bob"}')),
          '(completed,202,"{""by"": ""bob""}")',
          'bob: a second claim replays bob''s response');
SELECT throws_ok(format('SELECT idem_complete(%L, 200, token => %s)', 'held',
                        current_setting('pgtap_keys.alice_token')),
                 '55000', 'idempotency key "held" is not claimed',
                 'bob: cannot complete alice''s claim, even with her token');
SELECT throws_ok(format('SELECT idem_release(%L, token => %s)', 'held',
                        current_setting('pgtap_keys.alice_token')),
                 '55000', 'idempotency key "held" is not claimed',
                 'bob: cannot release alice''s claim, even with her token');
SELECT throws_ok(format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', 'x',
                        current_setting('pgtap_keys.alice_token')),
                 '55000', 'idempotency key "held" is not claimed',
                 'bob: cannot checkpoint alice''s claim, even with her token');
SELECT is((SELECT status FROM idem_claim('held', lease => '1 hour')), 'claimed',
          'bob: (held) is his to claim, alice''s lease does not matter');
RESET ROLE;

SET LOCAL ROLE idem_pgtap_keys_alice;
SELECT is((SELECT row(status, response_code, response_body)::text FROM idem_lookup('same')),
          '(completed,201,"{""by"": ""alice""}")',
          'alice: still sees her own response after bob''s');
SELECT is((SELECT row(status, response_code)::text FROM idem_claim('same', '{"who": "alice"}')),
          '(completed,201)',
          'alice: her claim still replays her response');
SELECT is((SELECT token::text FROM idem_lookup('held')),
          current_setting('pgtap_keys.alice_token'),
          'alice: her claim of (held) is untouched by bob''s');
SELECT lives_ok(format('SELECT idem_complete(%L, 200, token => %s)', 'held',
                       current_setting('pgtap_keys.alice_token')),
                'alice: completes (held) with her token');
RESET ROLE;

SELECT is((SELECT array_agg(role::text || ':' || n ORDER BY role::text)
             FROM (SELECT role, count(*) AS n FROM idempotency.keys
                    WHERE role IN ('idem_pgtap_keys_alice'::regrole, 'idem_pgtap_keys_bob'::regrole)
                    GROUP BY role) s),
          ARRAY['idem_pgtap_keys_alice:2', 'idem_pgtap_keys_bob:2'],
          'each role has its own rows, one per key');

SELECT * FROM finish();
ROLLBACK;
