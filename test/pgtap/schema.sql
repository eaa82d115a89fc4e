--
-- test/pgtap/schema.sql -- the SQL contract of the idempotency extension:
-- API functions and their properties, privileges, the storage schema and
-- table, settings, and role isolation.  Everything runs in one transaction
-- that is rolled back (the roles, the storage table if this test made it,
-- the consumed messages); only CREATE EXTENSION IF NOT EXISTS stays.
--
CREATE EXTENSION IF NOT EXISTS idempotency;

BEGIN;
SELECT plan(128);

-- Roles of this test: one ordinary role, two for isolation.
CREATE ROLE idem_pgtap_plain;
CREATE ROLE idem_pgtap_alice;
CREATE ROLE idem_pgtap_bob;

----------------------------------------------------------------------------
-- API functions
----------------------------------------------------------------------------

-- idem_consume_message(consumer text, message_id text, ttl interval DEFAULT NULL) RETURNS boolean
-- idem_consume_message(consumer text, message_id text, ttl interval, tenant text) RETURNS boolean
-- (0.4.0's function as it was, and an overload with no defaults for the
-- tenant: a defaulted fourth argument cost every call that left it out)
SELECT has_function('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval'],
                    'idem_consume_message(text, text, interval) is in pg_catalog');
SELECT has_function('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval', 'text'],
                    'idem_consume_message(text, text, interval, text) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_consume_message'), 2,
          'idem_consume_message has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_consume_message(text, text, interval)'::regprocedure),
          'consumer text, message_id text, ttl interval DEFAULT NULL::interval',
          'idem_consume_message argument names and defaults');
SELECT is(pg_get_function_arguments('pg_catalog.idem_consume_message(text, text, interval, text)'::regprocedure),
          'consumer text, message_id text, ttl interval, tenant text',
          'idem_consume_message with a tenant: argument names, no defaults');
SELECT function_returns('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval'], 'boolean',
                        'idem_consume_message returns boolean');
SELECT volatility_is('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval'], 'volatile',
                     'idem_consume_message is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval'],
                    'idem_consume_message is not SECURITY DEFINER');
SELECT isnt_strict('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval'],
                   'idem_consume_message is not STRICT (NULL arguments get a clean error)');
SELECT function_returns('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval', 'text'], 'boolean',
                        'idem_consume_message with a tenant returns boolean');
SELECT volatility_is('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval', 'text'], 'volatile',
                     'idem_consume_message with a tenant is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval', 'text'],
                    'idem_consume_message with a tenant is not SECURITY DEFINER');
SELECT isnt_strict('pg_catalog', 'idem_consume_message', ARRAY['text', 'text', 'interval', 'text'],
                   'idem_consume_message with a tenant is not STRICT (NULL arguments get a clean error)');

-- idem_consume_messages(consumer text, message_ids text[], ttl interval DEFAULT NULL) RETURNS SETOF text
-- idem_consume_messages(consumer text, message_ids text[], ttl interval, tenant text) RETURNS SETOF text
-- (0.4.0's function as it was, and an overload with no defaults for the
-- tenant: a defaulted fourth argument cost every call that left it out)
SELECT has_function('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval'],
                    'idem_consume_messages(text, text[], interval) is in pg_catalog');
SELECT has_function('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval', 'text'],
                    'idem_consume_messages(text, text[], interval, text) is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_consume_messages'), 2,
          'idem_consume_messages has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_consume_messages(text, text[], interval)'::regprocedure),
          'consumer text, message_ids text[], ttl interval DEFAULT NULL::interval',
          'idem_consume_messages argument names and defaults');
SELECT is(pg_get_function_arguments('pg_catalog.idem_consume_messages(text, text[], interval, text)'::regprocedure),
          'consumer text, message_ids text[], ttl interval, tenant text',
          'idem_consume_messages with a tenant: argument names, no defaults');
SELECT function_returns('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval'], 'setof text',
                        'idem_consume_messages returns SETOF text');
SELECT volatility_is('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval'], 'volatile',
                     'idem_consume_messages is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval'],
                    'idem_consume_messages is not SECURITY DEFINER');
SELECT isnt_strict('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval'],
                   'idem_consume_messages is not STRICT (NULL arguments get a clean error)');
SELECT function_returns('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval', 'text'], 'setof text',
                        'idem_consume_messages with a tenant returns SETOF text');
SELECT volatility_is('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval', 'text'], 'volatile',
                     'idem_consume_messages with a tenant is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval', 'text'],
                    'idem_consume_messages with a tenant is not SECURITY DEFINER');
SELECT isnt_strict('pg_catalog', 'idem_consume_messages', ARRAY['text', 'text[]', 'interval', 'text'],
                   'idem_consume_messages with a tenant is not STRICT (NULL arguments get a clean error)');

-- Which of the two a call resolves to: two or three arguments, positional,
-- named or unknown-typed literals, the three-argument function (no
-- ambiguity); four, the tenant's; a tenant without ttl, none.
CREATE TEMP VIEW idem_pgtap_calls AS
SELECT idem_consume_message('c', 'm') AS m2,
       idem_consume_message('c', 'm', '1 day') AS m3,
       idem_consume_message('c', 'm', ttl => '1 day') AS m3n,
       idem_consume_message(consumer => 'c', message_id => 'm') AS m2n,
       (SELECT count(*) FROM idem_consume_messages('c', '{m}')) AS s2,
       (SELECT count(*) FROM idem_consume_messages('c', '{m}', '1 day')) AS s3;
CREATE TEMP VIEW idem_pgtap_tenant_calls AS
SELECT idem_consume_message('c', 'm', NULL, 't') AS m4,
       idem_consume_message('c', 'm', ttl => NULL, tenant => 't') AS m4n,
       (SELECT count(*) FROM idem_consume_messages('c', '{m}', NULL, 't')) AS s4;
SELECT is((SELECT array_agg(DISTINCT d.refobjid::regprocedure::text ORDER BY d.refobjid::regprocedure::text)
             FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
            WHERE r.ev_class = 'idem_pgtap_calls'::regclass
              AND d.refclassid = 'pg_proc'::regclass
              AND d.refobjid::regprocedure::text LIKE 'idem_consume%'),
          ARRAY['idem_consume_message(text,text,interval)', 'idem_consume_messages(text,text[],interval)'],
          'calls with two or three arguments resolve to the three-argument functions');
SELECT is((SELECT array_agg(DISTINCT d.refobjid::regprocedure::text ORDER BY d.refobjid::regprocedure::text)
             FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
            WHERE r.ev_class = 'idem_pgtap_tenant_calls'::regclass
              AND d.refclassid = 'pg_proc'::regclass
              AND d.refobjid::regprocedure::text LIKE 'idem_consume%'),
          ARRAY['idem_consume_message(text,text,interval,text)', 'idem_consume_messages(text,text[],interval,text)'],
          'calls with a tenant resolve to the four-argument functions');
SELECT throws_ok($$SELECT idem_consume_message('c', 'm', tenant => 't')$$, '42883', NULL,
                 'a call that names the tenant without ttl finds no function');

-- idem_maintain(OUT partitions_created int, OUT partitions_dropped int) RETURNS record
SELECT has_function('pg_catalog', 'idem_maintain', ARRAY[]::name[],
                    'idem_maintain() is in pg_catalog');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname = 'idem_maintain'), 1,
          'idem_maintain has no other overload in any schema');
SELECT is(pg_get_function_arguments('pg_catalog.idem_maintain()'::regprocedure),
          'OUT partitions_created integer, OUT partitions_dropped integer',
          'idem_maintain OUT parameters');
SELECT function_returns('pg_catalog', 'idem_maintain', ARRAY[]::name[], 'record',
                        'idem_maintain returns record');
SELECT volatility_is('pg_catalog', 'idem_maintain', ARRAY[]::name[], 'volatile',
                     'idem_maintain is VOLATILE');
SELECT isnt_definer('pg_catalog', 'idem_maintain', ARRAY[]::name[],
                    'idem_maintain is not SECURITY DEFINER');
SELECT isnt_strict('pg_catalog', 'idem_maintain', ARRAY[]::name[],
                   'idem_maintain is not STRICT');

-- the functions belong to the extension
SELECT is((SELECT array_agg(p.proname::text ORDER BY p.proname)
             FROM pg_depend d
             JOIN pg_proc p ON p.oid = d.objid
            WHERE d.classid = 'pg_proc'::regclass
              AND d.refclassid = 'pg_extension'::regclass
              AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
              AND d.deptype = 'e'
              AND p.pronamespace = 'pg_catalog'::regnamespace),
          ARRAY['idem_advance', 'idem_advance', 'idem_assign', 'idem_assign', 'idem_checkpoint',
                'idem_claim', 'idem_complete',
                'idem_consume_message', 'idem_consume_message', 'idem_consume_messages',
                'idem_consume_messages', 'idem_lookup', 'idem_maintain',
                'idem_outbox_ack', 'idem_outbox_ack', 'idem_outbox_dead_letter',
                'idem_outbox_dead_letter', 'idem_outbox_dead_letters', 'idem_outbox_next', 'idem_outbox_next',
                'idem_outbox_relays', 'idem_positions', 'idem_positions',
                'idem_publish', 'idem_publish',
                'idem_recover', 'idem_release', 'idem_sequence', 'idem_sequence'],
          'the API functions in pg_catalog are members of the extension');

-- privileges
SELECT ok(NOT has_function_privilege('public', 'pg_catalog.idem_maintain()', 'EXECUTE'),
          'PUBLIC cannot execute idem_maintain()');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_maintain()', 'EXECUTE'),
          'an ordinary role cannot execute idem_maintain()');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_consume_message(text, text, interval)', 'EXECUTE'),
          'an ordinary role can execute idem_consume_message()');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_consume_message(text, text, interval, text)', 'EXECUTE'),
          'an ordinary role can execute idem_consume_message() with a tenant');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_consume_messages(text, text[], interval)', 'EXECUTE'),
          'an ordinary role can execute idem_consume_messages()');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_consume_messages(text, text[], interval, text)', 'EXECUTE'),
          'an ordinary role can execute idem_consume_messages() with a tenant');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_assign(text, text, integer[], bigint, text)', 'EXECUTE'),
          'an ordinary role can execute idem_assign() with a tenant');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_advance(text, text, integer, bigint, bigint, bigint, text)', 'EXECUTE'),
          'an ordinary role can execute idem_advance() with a tenant');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_positions(text, text, text)', 'EXECUTE'),
          'an ordinary role can execute idem_positions() with a tenant');
SELECT is(pg_get_function_arguments('pg_catalog.idem_advance(text, text, integer, bigint, bigint, bigint, text)'::regprocedure),
          'consumer text, stream text, part integer, first_offset bigint, last_offset bigint, generation bigint, tenant text',
          'idem_advance() with a tenant: argument names, no defaults');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE proname IN ('idem_assign', 'idem_advance', 'idem_positions', 'idem_sequence')), 8,
          'idem_assign, idem_advance, idem_positions and idem_sequence have one overload each with a tenant, and no other');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_sequence(text, text, bigint, bigint, boolean, text)', 'EXECUTE'),
          'an ordinary role can execute idem_sequence() with a tenant');
SELECT throws_ok($$SELECT * FROM idem_advance('c', 's', 0, 0, 9, tenant => 't')$$, '42883', NULL,
                 'an advance that names the tenant without generation finds no function');
SELECT ok(to_regclass('idempotency.tenant_positions') IS NULL,
          'no idempotency.tenant_positions until citus_distribute() makes it');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_publish(text, jsonb, text, jsonb, bytea, text)', 'EXECUTE')
          AND has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_outbox_next(text, text, integer, bigint, text)', 'EXECUTE')
          AND has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_outbox_ack(text, text, bigint, bigint, text)', 'EXECUTE')
          AND has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_outbox_dead_letter(text, text, uuid, text, integer, text)', 'EXECUTE'),
          'an ordinary role can execute idem_publish(), idem_outbox_next(), idem_outbox_ack() and idem_outbox_dead_letter() with a tenant');
SELECT is(pg_get_function_arguments('pg_catalog.idem_publish(text, jsonb, text, jsonb, bytea, text)'::regprocedure),
          'topic text, payload jsonb, key text, headers jsonb, payload_raw bytea, tenant text',
          'idem_publish() with a tenant: argument names, no defaults');
SELECT ok(to_regclass('idempotency.tenant_events') IS NULL AND to_regclass('idempotency.tenant_relays') IS NULL,
          'no tenant outbox until citus_distribute() makes it');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'idempotency.citus_distribute(regclass)', 'EXECUTE'),
          'an ordinary role cannot execute idempotency.citus_distribute()');

----------------------------------------------------------------------------
-- Schema idempotency and its view
----------------------------------------------------------------------------

SELECT has_schema('idempotency', 'schema idempotency exists');
SELECT ok(NOT has_schema_privilege('idem_pgtap_plain', 'idempotency', 'USAGE'),
          'an ordinary role has no USAGE on schema idempotency');
SELECT ok(NOT has_schema_privilege('idem_pgtap_plain', 'idempotency', 'CREATE'),
          'an ordinary role has no CREATE on schema idempotency');
SELECT ok(has_schema_privilege('pg_monitor', 'idempotency', 'USAGE'),
          'pg_monitor has USAGE on schema idempotency');

SELECT has_view('idempotency', 'partitions', 'view idempotency.partitions exists');
SELECT is((SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = 'idempotency.partitions'::regclass AND attnum > 0 AND NOT attisdropped),
          ARRAY['table_name text', 'partition regclass', 'lanes integer', 'lane integer',
                'lower_bound timestamp with time zone', 'upper_bound timestamp with time zone',
                'droppable_at timestamp with time zone', 'expired boolean',
                'rows_estimate bigint', 'bytes bigint'],
          'idempotency.partitions has its columns, in order, with their types');
SELECT ok(has_table_privilege('pg_monitor', 'idempotency.partitions', 'SELECT'),
          'pg_monitor can read idempotency.partitions');
SELECT ok(NOT has_table_privilege('idem_pgtap_plain', 'idempotency.partitions', 'SELECT'),
          'an ordinary role cannot read idempotency.partitions');
SELECT has_function('idempotency', 'partition_info', ARRAY[]::name[],
                    'function idempotency.partition_info() exists');
SELECT ok(has_function_privilege('pg_monitor', 'idempotency.partition_info()', 'EXECUTE'),
          'pg_monitor can execute idempotency.partition_info()');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'idempotency.partition_info()', 'EXECUTE'),
          'an ordinary role cannot execute idempotency.partition_info()');
SELECT has_function('idempotency', 'filter_info', ARRAY[]::name[],
                    'function idempotency.filter_info() exists');
SELECT ok(has_function_privilege('pg_monitor', 'idempotency.filter_info()', 'EXECUTE'),
          'pg_monitor can execute idempotency.filter_info()');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'idempotency.filter_info()', 'EXECUTE'),
          'an ordinary role cannot execute idempotency.filter_info()');

----------------------------------------------------------------------------
-- The transactional outbox (0.5.0)
----------------------------------------------------------------------------

SELECT has_function('pg_catalog', 'idem_publish', ARRAY['text', 'jsonb', 'text', 'jsonb', 'bytea'],
                    'idem_publish(topic, payload, key, headers, payload_raw) exists');
SELECT function_returns('pg_catalog', 'idem_publish', ARRAY['text', 'jsonb', 'text', 'jsonb', 'bytea'], 'uuid',
                        'idem_publish returns uuid');
SELECT has_function('pg_catalog', 'idem_outbox_next', ARRAY['text', 'text', 'integer', 'bigint'],
                    'idem_outbox_next(relay, topic, max_events, generation) exists');
SELECT is((SELECT pg_get_function_result('pg_catalog.idem_outbox_next(text, text, integer, bigint)'::regprocedure)),
          'TABLE(batch bigint, event_id uuid, key text, payload jsonb, payload_raw bytea, headers jsonb, published_at timestamp with time zone)',
          'idem_outbox_next returns the SPEC''s columns');
SELECT has_function('pg_catalog', 'idem_outbox_ack', ARRAY['text', 'text', 'bigint', 'bigint'],
                    'idem_outbox_ack(relay, topic, batch, generation) exists');
SELECT is((SELECT pg_get_function_arguments('pg_catalog.idem_outbox_next(text, text, integer, bigint)'::regprocedure)),
          'relay text, topic text, max_events integer DEFAULT 100, generation bigint DEFAULT NULL::bigint',
          'idem_outbox_next has the SPEC''s arguments and defaults');
SELECT ok(has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_publish(text, jsonb, text, jsonb, bytea)', 'EXECUTE')
          AND has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_outbox_next(text, text, integer, bigint)', 'EXECUTE')
          AND has_function_privilege('idem_pgtap_plain', 'pg_catalog.idem_outbox_ack(text, text, bigint, bigint)', 'EXECUTE'),
          'an ordinary role can publish and relay');
SELECT ok(has_table_privilege('pg_monitor', 'idempotency.outbox_relay_lag', 'SELECT')
          AND has_table_privilege('pg_monitor', 'idempotency.outbox_stats', 'SELECT'),
          'pg_monitor can read the outbox''s views');
SELECT ok(NOT has_table_privilege('idem_pgtap_plain', 'idempotency.outbox_relay_lag', 'SELECT')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.outbox_relay_info()', 'EXECUTE'),
          'an ordinary role cannot read every role''s relays');
SELECT is((SELECT count(*)::int FROM pg_class AS c, aclexplode(c.relacl) AS a
            WHERE c.relnamespace = 'idempotency'::regnamespace
              AND c.relname IN ('outbox_event_seq', 'outbox_segments', 'outbox_relays',
                                'outbox_dead_letters', 'outbox_xid_base')
              AND a.grantee <> c.relowner), 0,
          'the outbox''s tables and sequence are granted to nobody');

SELECT ok(to_regprocedure('idempotency.export_events(text[])') IS NOT NULL
          AND to_regprocedure('idempotency.import_event(record)') IS NOT NULL
          AND to_regprocedure('idempotency.export_relays(text[])') IS NOT NULL
          AND to_regprocedure('idempotency.import_relay(record)') IS NOT NULL
          AND to_regtype('idempotency.event_record') IS NOT NULL
          AND to_regtype('idempotency.relay_record') IS NOT NULL,
          'the outbox''s export and import functions and records exist');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'idempotency.export_events(text[])', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.import_event(record)', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.export_relays(text[])', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.import_relay(record)', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.export_dead_letters(text[])', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.import_dead_letter(record)', 'EXECUTE'),
          'an ordinary role can neither export nor import events, relays and dead letters');
SELECT is((SELECT array_agg(part || ':' || format ORDER BY import_order)
             FROM idempotency.export_manifest()),
          ARRAY['keys:2', 'messages:2', 'positions:2', 'sequences:2',
                'outbox_relays:2', 'outbox_events:2', 'outbox_dead_letters:2', 'key_memory:2',
                'message_memory:2'],
          'the export manifest names its parts, the key memory''s two, in format 2');

-- Moving the key memory (0.5.0): executable by superusers and grantees only
SELECT has_function('idempotency', 'export_key_memory', ARRAY['text[]'],
                    'idempotency.export_key_memory(text[]) exists');
SELECT has_function('idempotency', 'import_key_memory', ARRAY['record'],
                    'idempotency.import_key_memory(record) exists');
SELECT has_function('idempotency', 'export_message_memory', ARRAY['text[]'],
                    'idempotency.export_message_memory(text[]) exists');
SELECT has_function('idempotency', 'import_message_memory', ARRAY['record'],
                    'idempotency.import_message_memory(record) exists');
SELECT has_type('idempotency', 'memory_record', 'type idempotency.memory_record exists');
SELECT ok(NOT has_function_privilege('idem_pgtap_plain', 'idempotency.export_key_memory(text[])', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.import_key_memory(record)', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.export_message_memory(text[])', 'EXECUTE')
          AND NOT has_function_privilege('idem_pgtap_plain', 'idempotency.import_message_memory(record)', 'EXECUTE'),
          'an ordinary role cannot export or import the key memory');

-- idempotency.role_ref (0.5.0): the role column of the tables
-- citus_distribute() distributes; stored as an oid, copied by name
SELECT has_type('idempotency', 'role_ref', 'type idempotency.role_ref exists');
SELECT is((SELECT typlen::int || ' ' || typbyval || ' ' || typalign::text || ' ' || typstorage::text
                  || ' ' || typinput::text || ' ' || typoutput::text || ' ' || typreceive::text
                  || ' ' || typsend::text
             FROM pg_type WHERE oid = 'idempotency.role_ref'::regtype),
          '4 true i p idempotency.role_ref_in idempotency.role_ref_out idempotency.role_ref_recv idempotency.role_ref_send',
          'idempotency.role_ref is an oid''s four bytes, by value, with I/O of its own');
SELECT is((SELECT array_agg(castsource::regtype::text || '>' || casttarget::regtype::text || ':'
                            || castmethod::text || castcontext::text ORDER BY castsource::regtype::text, casttarget::regtype::text)
             FROM pg_cast WHERE 'idempotency.role_ref'::regtype IN (castsource, casttarget)),
          ARRAY['idempotency.role_ref>oid:bi', 'idempotency.role_ref>regrole:bi',
                'oid>idempotency.role_ref:ba', 'regrole>idempotency.role_ref:ba'],
          'idempotency.role_ref casts to oid and regrole implicitly, from them on assignment, binary coercible');
SELECT is((SELECT count(*)::int FROM pg_depend d
            WHERE d.refclassid = 'pg_extension'::regclass
              AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
              AND d.deptype = 'e'
              AND ((d.classid = 'pg_type'::regclass AND d.objid = 'idempotency.role_ref'::regtype)
                   OR (d.classid = 'pg_cast'::regclass
                       AND d.objid IN (SELECT oid FROM pg_cast
                                        WHERE 'idempotency.role_ref'::regtype IN (castsource, casttarget)))
                   OR (d.classid = 'pg_proc'::regclass
                       AND d.objid IN ('idempotency.role_ref_in(cstring)'::regprocedure,
                                       'idempotency.role_ref_out(idempotency.role_ref)'::regprocedure,
                                       'idempotency.role_ref_recv(internal)'::regprocedure,
                                       'idempotency.role_ref_send(idempotency.role_ref)'::regprocedure)))),
          9, 'idempotency.role_ref, its four I/O functions and its four casts are members of the extension (made on every node by CREATE EXTENSION)');
SELECT ok(has_type_privilege('idem_pgtap_plain', 'idempotency.role_ref', 'USAGE')
          AND has_function_privilege('idem_pgtap_plain', 'idempotency.role_ref_out(idempotency.role_ref)', 'EXECUTE'),
          'idempotency.role_ref and its I/O are usable by every role, as regrole''s');

----------------------------------------------------------------------------
-- Storage table, made on first use
----------------------------------------------------------------------------

SELECT is(idem_consume_message('pgtap-schema', 'first-' || gen_random_uuid()), true,
          'a first idem_consume_message call succeeds and reports a new message');

SELECT is_partitioned('idempotency', 'messages',
                      'idempotency.messages exists after the first call and is partitioned');
SELECT is((SELECT partstrat::text FROM pg_partitioned_table
            WHERE partrelid = 'idempotency.messages'::regclass),
          'r', 'idempotency.messages is partitioned by RANGE');
SELECT is((SELECT array_agg(a.attname ORDER BY k.ord)
             FROM pg_partitioned_table pt
             CROSS JOIN LATERAL unnest(pt.partattrs::int2[]) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.attnum
            WHERE pt.partrelid = 'idempotency.messages'::regclass),
          ARRAY['lane', 'expires_at']::name[],
          'idempotency.messages partition key is (lane, expires_at)');
SELECT is((SELECT partdefid FROM pg_partitioned_table
            WHERE partrelid = 'idempotency.messages'::regclass),
          0::oid, 'idempotency.messages has no DEFAULT partition');
SELECT is((SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod)
                            || CASE WHEN attnotnull THEN ' not null' ELSE '' END ORDER BY attnum)
             FROM pg_attribute
            WHERE attrelid = 'idempotency.messages'::regclass AND attnum > 0 AND NOT attisdropped),
          ARRAY['expires_at timestamp with time zone not null', 'digest uuid not null',
                'role regrole not null', 'lane smallint not null'],
          'idempotency.messages has its columns');

SELECT is((SELECT relowner FROM pg_class WHERE oid = 'idempotency.messages'::regclass),
          (SELECT extowner FROM pg_extension WHERE extname = 'idempotency'),
          'idempotency.messages is owned by the extension owner');
SELECT cmp_ok((SELECT count(*)::int FROM pg_inherits
                WHERE inhparent = 'idempotency.messages'::regclass), '>', 0,
              'the first call made at least one partition');
SELECT is((SELECT count(*)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.messages'::regclass
              AND c.relowner <> (SELECT extowner FROM pg_extension WHERE extname = 'idempotency')),
          0, 'every partition is owned by the extension owner');
SELECT is((SELECT count(*)::int FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.messages'::regclass
              AND (c.relnamespace <> 'idempotency'::regnamespace
                   OR c.relname !~ '^messages_n[0-9]+_f?[0-9]+_[0-9]{8}_[0-9]{6}(_[0-9]{6})?$')),
          0, 'partitions are named idempotency.messages_n<lanes>_<lane>_<yyyymmdd_hhmmss>');

-- an ordinary role can neither read nor write the storage
SELECT is(ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE',
                                           'REFERENCES', 'TRIGGER']) AS p
                 WHERE has_table_privilege('idem_pgtap_plain', 'idempotency.messages', p)),
          ARRAY[]::text[],
          'an ordinary role has no privilege on idempotency.messages');
SELECT is((SELECT count(*)::int FROM pg_inherits i
            WHERE i.inhparent = 'idempotency.messages'::regclass
              AND (has_table_privilege('idem_pgtap_plain', i.inhrelid, 'SELECT')
                   OR has_table_privilege('idem_pgtap_plain', i.inhrelid, 'INSERT')
                   OR has_table_privilege('idem_pgtap_plain', i.inhrelid, 'UPDATE')
                   OR has_table_privilege('idem_pgtap_plain', i.inhrelid, 'DELETE')
                   OR has_table_privilege('idem_pgtap_plain', i.inhrelid, 'TRUNCATE'))),
          0, 'an ordinary role has no privilege on any partition');
SET LOCAL ROLE idem_pgtap_plain;
SELECT throws_ok($$SELECT count(*) FROM idempotency.messages$$, '42501', NULL,
                 'an ordinary role reading idempotency.messages is refused');
SELECT throws_ok($$SELECT idem_maintain()$$, '42501', 'permission denied for function idem_maintain',
                 'an ordinary role calling idem_maintain() is refused');
RESET ROLE;

-- not an extension member (pg_dump carries it), but DROP EXTENSION takes it
SELECT is((SELECT count(*)::int FROM pg_depend
            WHERE classid = 'pg_class'::regclass
              AND objid = 'idempotency.messages'::regclass
              AND refclassid = 'pg_extension'::regclass
              AND deptype = 'e'),
          0, 'idempotency.messages is not an extension member');
SELECT is((SELECT array_agg(deptype::text) FROM pg_depend
            WHERE classid = 'pg_class'::regclass
              AND objid = 'idempotency.messages'::regclass
              AND refclassid = 'pg_extension'::regclass
              AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')),
          ARRAY['a'],
          'idempotency.messages has an AUTO dependency on the extension');

-- every partition has exactly one index, on (role, digest) (since 0.4.0:
-- a role's probe never reads another role's entry)
SELECT ok(EXISTS (SELECT 1 FROM pg_index x
                   WHERE x.indrelid = 'idempotency.messages'::regclass
                     AND x.indnatts = 2
                     AND x.indkey[0] = (SELECT attnum FROM pg_attribute
                                         WHERE attrelid = 'idempotency.messages'::regclass
                                           AND attname = 'role')
                     AND x.indkey[1] = (SELECT attnum FROM pg_attribute
                                         WHERE attrelid = 'idempotency.messages'::regclass
                                           AND attname = 'digest')),
          'idempotency.messages has an index on (role, digest)');
SELECT is((SELECT array_agg(DISTINCT c.relname::text ORDER BY c.relname::text)
             FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idempotency.messages'::regclass
              AND (SELECT array_agg(regexp_replace(pg_get_indexdef(x.indexrelid), '^.* USING ', '')
                                    || CASE WHEN x.indisvalid THEN '' ELSE ' (invalid)' END)
                     FROM pg_index x WHERE x.indrelid = c.oid)
                  IS DISTINCT FROM ARRAY['btree (role, digest) WITH (deduplicate_items=off)']),
          NULL,
          'every partition has exactly one valid index, on (role, digest), without deduplication');

----------------------------------------------------------------------------
-- Settings (the library is loaded by the call above)
----------------------------------------------------------------------------

SELECT is((SELECT concat_ws(' ', vartype, boot_val, unit, context) FROM pg_settings
            WHERE name = 'idempotency.message_ttl'),
          'integer 604800 s superuser', 'idempotency.message_ttl: 7 days, in seconds, superuser (it sizes partitions)');
SELECT is((SELECT concat_ws(' ', vartype, boot_val, unit, context) FROM pg_settings
            WHERE name = 'idempotency.key_ttl'),
          'integer 86400 s superuser', 'idempotency.key_ttl: 24 hours, in seconds, superuser (it sizes partitions)');
SELECT is((SELECT concat_ws(' ', vartype, boot_val, unit, context) FROM pg_settings
            WHERE name = 'idempotency.max_ttl'),
          'integer 2592000 s superuser', 'idempotency.max_ttl: 30 days, in seconds, superuser');
SELECT is((SELECT concat_ws(' ', vartype, boot_val, unit, context) FROM pg_settings
            WHERE name = 'idempotency.partition_interval'),
          'integer 86400 s superuser', 'idempotency.partition_interval: 1 day, in seconds, superuser');
SELECT is((SELECT concat_ws(' ', vartype, boot_val, coalesce(unit, '-'), context) FROM pg_settings
            WHERE name = 'idempotency.premake'),
          'integer 1 - superuser', 'idempotency.premake: 1, no unit, superuser');
SELECT is((SELECT concat_ws(' ', vartype, boot_val, coalesce(unit, '-'), context) FROM pg_settings
            WHERE name = 'idempotency.max_key_length'),
          'integer 255 - superuser', 'idempotency.max_key_length: 255 (bytes), no unit, superuser');
SELECT is((SELECT min_val FROM pg_settings WHERE name = 'idempotency.partition_interval'),
          '1', 'idempotency.partition_interval can be set down to 1 second');
SELECT throws_ok($$SET idempotency.x = 1$$, '42602',
                 'invalid configuration parameter name "idempotency.x"',
                 'the idempotency. prefix is reserved: unknown settings are refused');
SELECT throws_ok($$SET LOCAL idempotency.message_ttl = 'forever'$$, '22023', NULL,
                 'an invalid setting value is refused');

----------------------------------------------------------------------------
-- Role isolation: a message id consumed by one role is new to another
----------------------------------------------------------------------------

SET LOCAL ROLE idem_pgtap_alice;
SELECT is(idem_consume_message('c', 'same'), true, 'alice: first delivery of (c, same) is new');
SELECT is(idem_consume_message('c', 'same'), false, 'alice: second delivery of (c, same) is a duplicate');
RESET ROLE;
SET LOCAL ROLE idem_pgtap_bob;
SELECT is(idem_consume_message('c', 'same'), true, 'bob: (c, same) is new although alice consumed it');
SELECT is(idem_consume_message('c', 'same'), false, 'bob: second delivery of (c, same) is a duplicate');
SELECT is(ARRAY(SELECT idem_consume_messages('c', ARRAY['same', 'other'])), ARRAY['other'],
          'bob: the batch form sees bob''s own messages only');
RESET ROLE;
SET LOCAL ROLE idem_pgtap_alice;
SELECT is(idem_consume_message('c', 'same'), false, 'alice: still a duplicate after bob consumed it');
SELECT is(ARRAY(SELECT idem_consume_messages('c', ARRAY['other', 'same'])), ARRAY['other'],
          'alice: (c, other) consumed by bob is new to alice');
RESET ROLE;
SELECT is((SELECT array_agg(role::text || ':' || n ORDER BY role::text)
             FROM (SELECT role, count(*) AS n FROM idempotency.messages
                    WHERE role IN ('idem_pgtap_alice'::regrole, 'idem_pgtap_bob'::regrole)
                    GROUP BY role) s),
          ARRAY['idem_pgtap_alice:2', 'idem_pgtap_bob:2'],
          'each role has its own rows, one per message consumed');

SELECT * FROM finish();
ROLLBACK;
