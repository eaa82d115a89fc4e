--
-- sql/misuse.sql -- a catalogue of misuses of the idempotency extension.
--
-- Every misuse gets a clean error with its SQLSTATE (never XX000), and a
-- failing call writes nothing: the ledgers are compared, row for row and
-- version for version, before and after each group of failing calls.
--
-- Runs in its own database, made here and dropped at the end (with the
-- roles it makes), so it neither depends on nor disturbs other test files.
-- Tokens and timestamps change from run to run: they are never printed.
--
\set regress_db :DBNAME
SET client_min_messages = warning;
DROP DATABASE IF EXISTS regress_idem_misuse;
CREATE DATABASE regress_idem_misuse;
\c regress_idem_misuse
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
-- the settings exist once the library is loaded; calls load it too
LOAD 'idempotency';
-- both ledgers, made once so that the helpers below can read them
SELECT partitions_created > 0 AS storage_made FROM idem_maintain();
RESET client_min_messages;

-- try(stmt) runs one statement and reports its SQLSTATE and message instead
-- of failing (also for cancels: statement and lock timeouts); token numbers
-- in messages are masked.
-- PostgreSQL 17 gives the unit in a setting's valid range ("1 s .. 2 s");
-- it is masked so that one expected output serves every major
CREATE FUNCTION try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS OR query_canceled THEN
  RETURN SQLSTATE || ': ' ||
         regexp_replace(regexp_replace(SQLERRM, 'token -?[0-9]+', 'token N'),
                        '\(([-0-9]+) [a-z]+ \.\. ([-0-9]+) [a-z]+\)', '(\1 .. \2)');
END $$;

-- ledger_rows() counts the rows of both ledgers; ledger_state() is a digest
-- of every row with its physical version (ctid, xmin), so an UPDATE shows
CREATE FUNCTION ledger_rows() RETURNS text LANGUAGE sql AS $$
  SELECT format('keys %s, messages %s',
                (SELECT count(*) FROM idempotency.keys),
                (SELECT count(*) FROM idempotency.messages))
$$;
CREATE FUNCTION ledger_state() RETURNS text LANGUAGE sql AS $$
  SELECT md5(coalesce((SELECT string_agg(k::text || k.ctid::text || k.xmin::text, ','
                                         ORDER BY k.tableoid, k.ctid)
                         FROM idempotency.keys k), '')
             || '|' ||
             coalesce((SELECT string_agg(m::text || m.ctid::text || m.xmin::text, ','
                                         ORDER BY m.tableoid, m.ctid)
                         FROM idempotency.messages m), ''))
$$;

-- fixtures: a consumed message, a completed key, a committed two-phase
-- claim (token in :held), a released key
SELECT idem_consume_message('c', 'consumed') AS consumed;
BEGIN;
SELECT status FROM idem_claim('done', '{"v": 1}');
SELECT idem_complete('done', 200, '"done"');
COMMIT;
SELECT token AS held FROM idem_claim('held', lease => '1 hour') \gset
SELECT token AS released FROM idem_claim('released', lease => '1 hour') \gset
SELECT idem_release('released', token => :released);
SELECT ledger_rows();
SELECT ledger_state() AS state_before \gset

----------------------------------------------------------------------------
-- 1. NULL in every argument position of every function
----------------------------------------------------------------------------
-- Run in a transaction that is rolled back: the positions that accept NULL
-- (request, ttl, lease, response_body, token, response_headers,
-- response_raw, scope of idem_recover) succeed and write.  The keys of the
-- complete/checkpoint/release rows that succeed are claimed first.
BEGIN;
SELECT count(*) AS claimed FROM (VALUES ('n-body'), ('n-ctoken'), ('n-kptoken'), ('n-rtoken'), ('n-headers'), ('n-raw')) k(k),
       LATERAL idem_claim(k) c WHERE c.status = 'claimed';
CREATE TEMP TABLE null_cases (fn text, arg text, stmt text);
INSERT INTO null_cases VALUES
  ('idem_consume_message',  'consumer',       $$SELECT idem_consume_message(NULL, 'm')$$),
  ('idem_consume_message',  'message_id',     $$SELECT idem_consume_message('c', NULL)$$),
  ('idem_consume_message',  'ttl',            $$SELECT idem_consume_message('c', 'n-ttl', NULL)$$),
  ('idem_consume_messages', 'consumer',       $$SELECT idem_consume_messages(NULL, ARRAY['m'])$$),
  ('idem_consume_messages', 'message_ids',    $$SELECT idem_consume_messages('c', NULL)$$),
  ('idem_consume_messages', 'ttl',            $$SELECT idem_consume_messages('c', ARRAY['n-ttl-batch'], NULL)$$),
  -- a NULL tenant is refused only where the message ledger is distributed
  -- by Citus (test/t/038_citus_ledgers.pl)
  ('idem_consume_message',  'tenant',         $$SELECT idem_consume_message('c', 'n-tenant', NULL, NULL)$$),
  ('idem_consume_messages', 'tenant',         $$SELECT idem_consume_messages('c', ARRAY['n-tenant-batch'], NULL, NULL)$$),
  ('idem_claim',            'key',            $$SELECT idem_claim(NULL, '{}', '', '1 hour', '1 minute', false)$$),
  ('idem_claim',            'request',        $$SELECT idem_claim('n-request', NULL, '', '1 hour', '1 minute', false)$$),
  ('idem_claim',            'scope',          $$SELECT idem_claim('n-scope', '{}', NULL, '1 hour', '1 minute', false)$$),
  ('idem_claim',            'ttl',            $$SELECT idem_claim('n-ttl', '{}', '', NULL, '1 minute', false)$$),
  ('idem_claim',            'lease',          $$SELECT idem_claim('n-lease', '{}', '', '1 hour', NULL, false)$$),
  ('idem_claim',            'wait',           $$SELECT idem_claim('n-wait', '{}', '', '1 hour', '1 minute', NULL)$$),
  ('idem_claim',            'keep_request',   $$SELECT idem_claim('n-keep', '{}', '', '1 hour', '1 minute', false, NULL)$$),
  ('idem_complete',         'key',            $$SELECT idem_complete(NULL, 200, '{}', '', NULL)$$),
  ('idem_complete',         'response_code',  $$SELECT idem_complete('n-body', NULL, '{}', '', NULL)$$),
  ('idem_complete',         'response_body',  $$SELECT idem_complete('n-body', 200, NULL, '', NULL)$$),
  ('idem_complete',         'scope',          $$SELECT idem_complete('n-ctoken', 200, '{}', NULL, NULL)$$),
  ('idem_complete',         'token',          $$SELECT idem_complete('n-ctoken', 200, '{}', '', NULL)$$),
  ('idem_complete',         'response_headers', $$SELECT idem_complete('n-headers', 200, '{}', '', NULL, NULL)$$),
  ('idem_complete',         'response_raw',   $$SELECT idem_complete('n-raw', 200, NULL, '', NULL, NULL, NULL)$$),
  ('idem_checkpoint',       'key',            $$SELECT idem_checkpoint(NULL, 'step', '', NULL)$$),
  ('idem_checkpoint',       'recovery_point', $$SELECT idem_checkpoint('n-kptoken', NULL, '', NULL)$$),
  ('idem_checkpoint',       'scope',          $$SELECT idem_checkpoint('n-kptoken', 'step', NULL, NULL)$$),
  ('idem_checkpoint',       'token',          $$SELECT idem_checkpoint('n-kptoken', 'step', '', NULL)$$),
  ('idem_release',          'key',            $$SELECT idem_release(NULL, '', NULL)$$),
  ('idem_release',          'scope',          $$SELECT idem_release('n-rtoken', NULL, NULL)$$),
  ('idem_release',          'token',          $$SELECT idem_release('n-rtoken', '', NULL)$$),
  ('idem_lookup',           'key',            $$SELECT * FROM idem_lookup(NULL, '')$$),
  ('idem_lookup',           'scope',          $$SELECT * FROM idem_lookup('done', NULL)$$),
  ('idem_recover',          'lease',          $$SELECT * FROM idem_recover(NULL)$$),
  ('idem_recover',          'scope',          $$SELECT * FROM idem_recover('1 minute', NULL)$$),
  ('idem_recover',          'max_keys',       $$SELECT * FROM idem_recover('1 minute', NULL, NULL)$$),
  ('idem_assign',           'consumer',       $$SELECT * FROM idem_assign(NULL, 's', ARRAY[0], 1)$$),
  ('idem_assign',           'stream',         $$SELECT * FROM idem_assign('c', NULL, ARRAY[0], 1)$$),
  ('idem_assign',           'parts',          $$SELECT * FROM idem_assign('c', 's', NULL, 1)$$),
  ('idem_assign',           'generation',     $$SELECT * FROM idem_assign('c', 's', ARRAY[0], NULL)$$),
  ('idem_advance',          'consumer',       $$SELECT * FROM idem_advance(NULL, 's', 0, 0, 1)$$),
  ('idem_advance',          'stream',         $$SELECT * FROM idem_advance('c', NULL, 0, 0, 1)$$),
  ('idem_advance',          'part',           $$SELECT * FROM idem_advance('c', 's', NULL, 0, 1)$$),
  ('idem_advance',          'first_offset',   $$SELECT * FROM idem_advance('c', 's', 0, NULL, 1)$$),
  ('idem_advance',          'last_offset',    $$SELECT * FROM idem_advance('c', 's', 0, 0, NULL)$$),
  ('idem_advance',          'generation',     $$SELECT * FROM idem_advance('c', 's', 0, 0, 1, NULL)$$),
  ('idem_positions',        'consumer',       $$SELECT * FROM idem_positions(NULL, 's')$$),
  ('idem_positions',        'stream',         $$SELECT * FROM idem_positions('c', NULL)$$),
  -- a NULL tenant is refused only where the positions are distributed
  -- by Citus (sql/stream_tenant.sql; not used otherwise)
  ('idem_assign',           'tenant',         $$SELECT * FROM idem_assign('c', 's-tenant', ARRAY[0], 1, NULL)$$),
  ('idem_advance',          'tenant',         $$SELECT * FROM idem_advance('c', 's-tenant-advance', 0, 0, 1, NULL, NULL)$$),
  ('idem_positions',        'tenant',         $$SELECT count(*) FROM idem_positions('c', 's-tenant', NULL)$$),
  ('idem_sequence',         'tenant',         $$SELECT idem_sequence('c', 'p-tenant', 0, 0, false, NULL)$$),
  ('idem_sequence',         'consumer',       $$SELECT idem_sequence(NULL, 'p', 0, 0)$$),
  ('idem_sequence',         'producer',       $$SELECT idem_sequence('c', NULL, 0, 0)$$),
  ('idem_sequence',         'epoch',          $$SELECT idem_sequence('c', 'p', NULL, 0)$$),
  ('idem_sequence',         'seq',            $$SELECT idem_sequence('c', 'p', 0, NULL)$$),
  ('idem_sequence',         'strict',         $$SELECT idem_sequence('c', 'p', 0, 0, NULL)$$),
  ('idem_publish',          'topic',          $$SELECT idem_publish(NULL)$$),
  ('idem_publish',          'payload',        $$SELECT idem_publish('t', NULL) IS NOT NULL$$),
  ('idem_publish',          'key',            $$SELECT idem_publish('t', '{}', NULL) IS NOT NULL$$),
  ('idem_publish',          'headers',        $$SELECT idem_publish('t', '{}', 'k', NULL) IS NOT NULL$$),
  ('idem_publish',          'payload_raw',    $$SELECT idem_publish('t', '{}', 'k', '{}', NULL) IS NOT NULL$$),
  ('idem_publish',          'tenant',         $$SELECT idem_publish('t', '{}', 'k', '{}', NULL, NULL) IS NOT NULL$$),
  ('idem_outbox_next',      'relay',          $$SELECT * FROM idem_outbox_next(NULL, 't')$$),
  ('idem_outbox_next',      'topic',          $$SELECT * FROM idem_outbox_next('r', NULL)$$),
  ('idem_outbox_next',      'max_events',     $$SELECT * FROM idem_outbox_next('r', 't', NULL)$$),
  ('idem_outbox_next',      'generation',     $$SELECT count(*) FROM idem_outbox_next('r', 't', 1, NULL)$$),
  ('idem_outbox_next',      'tenant',         $$SELECT count(*) FROM idem_outbox_next('r', 't', 1, NULL, NULL)$$),
  ('idem_outbox_ack',       'relay',          $$SELECT idem_outbox_ack(NULL, 't', 1)$$),
  ('idem_outbox_ack',       'topic',          $$SELECT idem_outbox_ack('r', NULL, 1)$$),
  ('idem_outbox_ack',       'batch',          $$SELECT idem_outbox_ack('r', 't', NULL)$$),
  ('idem_outbox_ack',       'generation',     $$SELECT idem_outbox_ack('r', 't', 1, NULL)$$),
  ('idem_outbox_ack',       'tenant',         $$SELECT idem_outbox_ack('r', 't', 1, NULL, NULL)$$),
  ('idem_outbox_dead_letter', 'relay',        $$SELECT idem_outbox_dead_letter(NULL, 't', gen_random_uuid())$$),
  ('idem_outbox_dead_letter', 'topic',        $$SELECT idem_outbox_dead_letter('r', NULL, gen_random_uuid())$$),
  ('idem_outbox_dead_letter', 'event_id',     $$SELECT idem_outbox_dead_letter('r', 't', NULL)$$),
  ('idem_outbox_dead_letter', 'reason',       $$SELECT idem_outbox_dead_letter('r', 't', '00000000-0000-7000-8000-000000000000', NULL)$$),
  ('idem_outbox_dead_letter', 'attempts',     $$SELECT idem_outbox_dead_letter('r', 't', '00000000-0000-7000-8000-000000000000', 'x', NULL)$$),
  ('idem_outbox_dead_letter', 'tenant',       $$SELECT idem_outbox_dead_letter('r', 't', '00000000-0000-7000-8000-000000000000', 'x', 1, NULL)$$),
  ('idem_outbox_dead_letters', 'relay',       $$SELECT count(*) FROM idem_outbox_dead_letters(NULL)$$),
  ('idem_outbox_dead_letters', 'topic',       $$SELECT count(*) FROM idem_outbox_dead_letters('r', NULL)$$);
SELECT fn, arg, try(stmt) FROM null_cases;
-- the table covers every input argument of every idem_* function
SELECT p.proname, a.name AS argument_not_covered
  FROM pg_proc p,
       unnest(p.proargnames[1:p.pronargs]) AS a(name)
 WHERE p.proname LIKE 'idem\_%' AND p.pronamespace = 'pg_catalog'::regnamespace
   AND (p.proname, a.name) NOT IN (SELECT fn, arg FROM null_cases);
ROLLBACK;
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 2. empty strings and arrays
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('empty consumer',          $$SELECT idem_consume_message('', 'm')$$),
  ('empty message id',        $$SELECT idem_consume_message('c', '')$$),
  ('empty batch consumer',    $$SELECT idem_consume_messages('', ARRAY['m'])$$),
  ('empty id in a batch',     $$SELECT idem_consume_messages('c', ARRAY['m', ''])$$),
  ('empty key: claim',        $$SELECT idem_claim('')$$),
  ('empty key: complete',     $$SELECT idem_complete('', 200)$$),
  ('empty key: checkpoint',   $$SELECT idem_checkpoint('', 'step')$$),
  ('empty key: release',      $$SELECT idem_release('')$$),
  ('empty key: lookup',       $$SELECT * FROM idem_lookup('')$$),
  ('empty recovery point',    format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', '', :held)),
  -- not misuses: an empty scope is a scope, an empty batch records nothing
  ('empty scope: lookup',     $$SELECT * FROM idem_lookup('done', '')$$),
  ('empty batch',             $$SELECT idem_consume_messages('c', ARRAY[]::text[])$$),
  ('empty batch, literal',    $$SELECT idem_consume_messages('c', '{}')$$)
) AS t(label, stmt);
-- batches: array containing NULL, multi-dimensional arrays (even 1 x 1)
SELECT label, try(stmt) FROM (VALUES
  ('NULL element',            $$SELECT idem_consume_messages('c', ARRAY['a', NULL, 'b'])$$),
  ('only a NULL element',     $$SELECT idem_consume_messages('c', ARRAY[NULL]::text[])$$),
  ('two dimensions',          $$SELECT idem_consume_messages('c', ARRAY[['a', 'b'], ['c', 'd']])$$),
  ('two dimensions, 1 x 1',   $$SELECT idem_consume_messages('c', ARRAY[['a']])$$),
  ('three dimensions',        $$SELECT idem_consume_messages('c', '{{{a}}}')$$)
) AS t(label, stmt);
-- an array with lower bound other than 1 is an ordinary batch
BEGIN;
SELECT * FROM idem_consume_messages('c', '[5:7]={x5,x6,x5}');
ROLLBACK;
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 3. lengths: idempotency.max_key_length (255 bytes) for consumer, message
--    id, key, scope and recovery point; huge values (1 MB)
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('consumer 256 bytes',         $$SELECT idem_consume_message(repeat('c', 256), 'm')$$),
  ('message id 256 bytes',       $$SELECT idem_consume_message('c', repeat('m', 256))$$),
  ('message id 128 x 2 bytes',   $$SELECT idem_consume_message('c', repeat('é', 128))$$),
  ('message id 1 MB',            $$SELECT idem_consume_message('c', repeat('m', 1024 * 1024))$$),
  ('batch: one id of 1 MB',      $$SELECT idem_consume_messages('c', ARRAY['ok', repeat('m', 1024 * 1024)])$$),
  ('key 1 MB: claim',            $$SELECT idem_claim(repeat('k', 1024 * 1024))$$),
  ('key 1 MB: complete',         $$SELECT idem_complete(repeat('k', 1024 * 1024), 200)$$),
  ('key 1 MB: checkpoint',       $$SELECT idem_checkpoint(repeat('k', 1024 * 1024), 'step')$$),
  ('key 1 MB: release',          $$SELECT idem_release(repeat('k', 1024 * 1024))$$),
  ('key 1 MB: lookup',           $$SELECT * FROM idem_lookup(repeat('k', 1024 * 1024))$$),
  ('scope 1 MB: claim',          $$SELECT idem_claim('k', scope => repeat('s', 1024 * 1024))$$),
  ('scope 1 MB: lookup',         $$SELECT * FROM idem_lookup('k', repeat('s', 1024 * 1024))$$),
  ('recovery point 256 bytes',   format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', repeat('r', 256), :held)),
  ('recovery point 10 MB',       format('SELECT idem_checkpoint(%L, repeat(%L, 10 * 1024 * 1024), token => %s)', 'held', 'r', :held))
) AS t(label, stmt);
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

-- a superuser may raise the limit up to 1 MB: then a 1 MB key and scope
-- work, and round-trip
SET idempotency.max_key_length = 1048576;
BEGIN;
SELECT status FROM idem_claim(repeat('k', 1024 * 1024), scope => repeat('s', 1024 * 1024));
SELECT idem_complete(repeat('k', 1024 * 1024), 200, '"big key"', scope => repeat('s', 1024 * 1024));
COMMIT;
SELECT status, response_body FROM idem_lookup(repeat('k', 1024 * 1024), repeat('s', 1024 * 1024));
SELECT status, response_body FROM idem_claim(repeat('k', 1024 * 1024), scope => repeat('s', 1024 * 1024));
-- ... and are refused again once it is lowered (the row stays, unreachable)
RESET idempotency.max_key_length;
SELECT try($$SELECT * FROM idem_lookup(repeat('k', 1024 * 1024), repeat('s', 1024 * 1024))$$);
-- a held two-phase claim whose key is over a lowered limit cannot be
-- finished until the limit is raised again
SELECT token AS long_token FROM idem_claim(repeat('L', 200), lease => '1 hour') \gset
SET idempotency.max_key_length = 100;
SELECT try(format('SELECT idem_complete(%L, 200, token => %s)', repeat('L', 200), :long_token));
RESET idempotency.max_key_length;
SELECT idem_complete(repeat('L', 200), 200, token => :long_token);
SELECT ledger_rows();
SELECT ledger_state() AS state_before \gset

----------------------------------------------------------------------------
-- 4. huge response bodies and requests: a response over
--    idempotency.max_response_bytes (1MB by default) is refused and nothing
--    is stored; under a raised bound they are stored out of line, and
--    returned verbatim; requests (as fingerprints) have no bound
----------------------------------------------------------------------------
CREATE TABLE big (body jsonb);
INSERT INTO big SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 300000) g;
SELECT pg_column_size(body) > 10 * 1000 * 1000 AS body_over_10mb FROM big;
BEGIN;
SELECT status FROM idem_claim('big', (SELECT body FROM big));
SELECT idem_complete('big', 200, body) FROM big;
ROLLBACK;
SELECT * FROM idem_lookup('big');
SET idempotency.max_response_bytes = '16MB';
BEGIN;
SELECT status FROM idem_claim('big', (SELECT body FROM big));
-- the body comes straight from a table: a TOAST pointer into "big"
SELECT idem_complete('big', 200, body) FROM big;
COMMIT;
-- gone from "big": the ledger has its own copy
DELETE FROM big;
INSERT INTO big SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 300000) g;
SELECT status, response_code, response_body = (SELECT body FROM big) AS body_verbatim
  FROM idem_claim('big', (SELECT body FROM big));
SELECT status, response_body = (SELECT body FROM big) AS body_verbatim FROM idem_lookup('big');
-- a different huge request is a mismatch
SELECT status FROM idem_claim('big', (SELECT body || '"x"' FROM big));
RESET idempotency.max_response_bytes;
DROP TABLE big;
SELECT ledger_rows();
SELECT ledger_state() AS state_before \gset

----------------------------------------------------------------------------
-- 5. ttl and lease: not positive, over idempotency.max_ttl (30 days), out
--    of the timestamp range, a lease longer than the ttl
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('message ttl 0',              $$SELECT idem_consume_message('c', 'ttl', '0')$$),
  ('message ttl negative',       $$SELECT idem_consume_message('c', 'ttl', '-1 second')$$),
  ('message ttl 31 days',        $$SELECT idem_consume_message('c', 'ttl', '31 days')$$),
  ('message ttl 30 days 1 us',   $$SELECT idem_consume_message('c', 'ttl', '30 days 00:00:00.000001')$$),
  ('batch ttl 0',                $$SELECT idem_consume_messages('c', ARRAY['ttl'], '0')$$),
  ('batch ttl 0, empty batch',   $$SELECT idem_consume_messages('c', ARRAY[]::text[], '0')$$),
  ('key ttl 0',                  $$SELECT idem_claim('ttl', ttl => '0')$$),
  ('key ttl negative',           $$SELECT idem_claim('ttl', ttl => '-1 day')$$),
  ('key ttl 31 days',            $$SELECT idem_claim('ttl', ttl => '31 days')$$),
  ('ttl past the timestamp range', $$SELECT idem_claim('ttl', ttl => '178000000 years')$$),
  ('message ttl past the range', $$SELECT idem_consume_message('c', 'ttl', '178000000 years')$$),
  ('batch ttl past the range',   $$SELECT idem_consume_messages('c', ARRAY['ttl'], '178000000 years')$$),
  ('ttl before the range',       $$SELECT idem_claim('ttl', ttl => '-178000000 years')$$),
  ('ttl of hours past the range', $$SELECT idem_claim('ttl', ttl => '2562047000 hours')$$),
  ('ttl of days past the range', $$SELECT idem_consume_message('c', 'ttl', '2000000000 days')$$),
  ('ttl of parts that cancel',   $$SELECT idem_claim('ttl', ttl => '3000 years -1095000 days')$$),
  ('ttl of parts that cancel, negative', $$SELECT idem_claim('ttl', ttl => '3000 years -1096000 days')$$),
  ('ttl 1 month -40 days',       $$SELECT idem_claim('ttl', ttl => '1 month -40 days')$$),
  ('lease 0',                    $$SELECT idem_claim('ttl', lease => '0')$$),
  ('lease negative',             $$SELECT idem_claim('ttl', lease => '-1 second')$$),
  ('lease over the default ttl', $$SELECT idem_claim('ttl', lease => '25 hours')$$),
  ('lease over the given ttl',   $$SELECT idem_claim('ttl', ttl => '1 minute', lease => '61 seconds')$$),
  ('lease past the range',       $$SELECT idem_claim('ttl', lease => '178000000 years')$$),
  ('lease before the range',     $$SELECT idem_claim('ttl', lease => '-178000000 years')$$),
  ('ttl not an interval',        $$SELECT idem_claim('ttl', ttl => 'soon')$$)
) AS t(label, stmt);
-- infinite intervals: PostgreSQL 17 has them, and a ttl or lease refuses
-- them like any other too long or not positive one; before 17 the literal
-- is not an interval at all
SELECT label,
       try(stmt) = CASE WHEN current_setting('server_version_num')::int >= 170000
                        THEN since_17
                        ELSE '22007: invalid input syntax for type interval: "' || lit || '"'
                   END AS as_this_major_answers
  FROM (VALUES
  ('key ttl infinity',      'infinity',  $$SELECT idem_claim('ttl', ttl => 'infinity')$$,
                            '22023: ttl exceeds "idempotency.max_ttl"'),
  ('key ttl -infinity',     '-infinity', $$SELECT idem_claim('ttl', ttl => '-infinity')$$,
                            '22023: ttl must be a positive interval'),
  ('message ttl infinity',  'infinity',  $$SELECT idem_consume_message('c', 'ttl', 'infinity')$$,
                            '22023: ttl exceeds "idempotency.max_ttl"'),
  ('lease infinity',        'infinity',  $$SELECT idem_claim('ttl', lease => 'infinity')$$,
                            '22023: lease must not be longer than the key''s ttl'),
  ('lease -infinity',       '-infinity', $$SELECT idem_claim('ttl', lease => '-infinity')$$,
                            '22023: lease must be a positive interval')
) AS t(label, lit, stmt, since_17);
-- a default ttl over max_ttl: key_ttl and message_ttl are user settings,
-- max_ttl is not
SET idempotency.key_ttl = '40d';
SET idempotency.message_ttl = '31d';
SELECT try($$SELECT idem_claim('ttl')$$);
SELECT try($$SELECT idem_consume_message('c', 'ttl')$$);
SELECT try($$SELECT idem_consume_messages('c', ARRAY['ttl'])$$);
RESET idempotency.key_ttl;
RESET idempotency.message_ttl;
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 6. response_code and response_body
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('response_code 99',           format('SELECT idem_complete(%L, 99, token => %s)', 'held', :held)),
  ('response_code 600',          format('SELECT idem_complete(%L, 600, token => %s)', 'held', :held)),
  ('response_code 0',            format('SELECT idem_complete(%L, 0, token => %s)', 'held', :held)),
  ('response_code -200',         format('SELECT idem_complete(%L, -200, token => %s)', 'held', :held)),
  ('response_code 2^31 - 1',     format('SELECT idem_complete(%L, 2147483647, token => %s)', 'held', :held)),
  ('response_code NULL',         format('SELECT idem_complete(%L, NULL, token => %s)', 'held', :held)),
  ('response_body not json',     format('SELECT idem_complete(%L, 200, %L, token => %s)', 'held', '{oops', :held))
) AS t(label, stmt);
-- the boundaries, a JSON null body and an SQL NULL body are accepted
BEGIN;
SELECT string_agg(c.status, ',') AS claims
  FROM (VALUES ('rc-100'), ('rc-599'), ('rc-json-null'), ('rc-sql-null')) k(k), LATERAL idem_claim(k) c;
SELECT idem_complete('rc-100', 100), idem_complete('rc-599', 599),
       idem_complete('rc-json-null', 200, 'null'), idem_complete('rc-sql-null', 204, NULL);
SELECT k, response_code, response_body, response_body IS NULL AS sql_null
  FROM (VALUES ('rc-100'), ('rc-599'), ('rc-json-null'), ('rc-sql-null')) k(k), LATERAL idem_lookup(k);
ROLLBACK;
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 7. complete, checkpoint and release without a live claim, after
--    completion, with a stale token, in another scope
----------------------------------------------------------------------------
SELECT token AS expiring FROM idem_claim('expiring', ttl => '1 second', lease => '1 second') \gset
SELECT ledger_rows();
SELECT ledger_state() AS state_before \gset
SELECT label, try(stmt) FROM (VALUES
  ('never claimed: complete',      $$SELECT idem_complete('never', 200)$$),
  ('never claimed: checkpoint',    $$SELECT idem_checkpoint('never', 'step')$$),
  ('never claimed: release',       $$SELECT idem_release('never')$$),
  ('never claimed, with a token',  $$SELECT idem_complete('never', 200, token => 1)$$),
  ('released: complete',           format('SELECT idem_complete(%L, 200, token => %s)', 'released', :released)),
  ('released: checkpoint',         format('SELECT idem_checkpoint(%L, %L, token => %s)', 'released', 'step', :released)),
  ('released: release',            format('SELECT idem_release(%L, token => %s)', 'released', :released)),
  ('completed: complete',          $$SELECT idem_complete('done', 200)$$),
  ('completed: checkpoint',        $$SELECT idem_checkpoint('done', 'step')$$),
  ('completed: release',           $$SELECT idem_release('done')$$),
  ('held, no token: complete',     $$SELECT idem_complete('held', 200)$$),
  ('held, no token: checkpoint',   $$SELECT idem_checkpoint('held', 'step')$$),
  ('held, no token: release',      $$SELECT idem_release('held')$$),
  ('stale token - 1: complete',    format('SELECT idem_complete(%L, 200, token => %s)', 'held', :held - 1)),
  ('stale token + 1: checkpoint',  format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', 'step', :held + 1)),
  ('token 0: release',             format('SELECT idem_release(%L, token => %s)', 'held', 0)),
  ('token -1: complete',           format('SELECT idem_complete(%L, 200, token => %s)', 'held', -1)),
  ('token of another key',         format('SELECT idem_complete(%L, 200, token => %s)', 'done', :held)),
  ('right token, other scope',     format('SELECT idem_complete(%L, 200, scope => %L, token => %s)', 'held', 'other', :held))
) AS t(label, stmt);
-- expired (the ttl of 1 second has passed): no live claim any more
SELECT set_config('misuse.expiring', :'expiring', false) IS NOT NULL AS noted;
DO $$
BEGIN
  WHILE clock_timestamp() <= (SELECT expires_at FROM idempotency.keys k
                               WHERE k.token = current_setting('misuse.expiring')::bigint) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT label, try(stmt) FROM (VALUES
  ('expired: complete',   format('SELECT idem_complete(%L, 200, token => %s)', 'expiring', :expiring)),
  ('expired: checkpoint', format('SELECT idem_checkpoint(%L, %L, token => %s)', 'expiring', 'step', :expiring)),
  ('expired: release',    format('SELECT idem_release(%L, token => %s)', 'expiring', :expiring))
) AS t(label, stmt);
SELECT count(*) AS expired_lookup FROM idem_lookup('expiring');
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

-- in the claiming transaction: twice, after release, with a wrong token,
-- another scope; and a failed complete rolled back to a savepoint leaves the
-- claim unresolved, so COMMIT refuses it
BEGIN;
SELECT status FROM idem_claim('own');
SELECT label, try(stmt) FROM (VALUES
  ('own claim, wrong token',       $$SELECT idem_complete('own', 200, token => 1)$$),
  ('own claim, other scope',       $$SELECT idem_complete('own', 200, scope => 'other')$$),
  ('own claim, bad code',          $$SELECT idem_complete('own', 700)$$),
  ('complete',                     $$SELECT idem_complete('own', 200)$$),
  ('complete again',               $$SELECT idem_complete('own', 201)$$),
  ('release after complete',       $$SELECT idem_release('own')$$),
  ('checkpoint after complete',    $$SELECT idem_checkpoint('own', 'step')$$)
) AS t(label, stmt);
ROLLBACK;
BEGIN;
SELECT status FROM idem_claim('own');
SELECT idem_release('own');
SELECT try($$SELECT idem_complete('own', 200)$$) AS complete_after_release;
SELECT try($$SELECT idem_release('own')$$) AS release_twice;
ROLLBACK;
\set VERBOSITY sqlstate
BEGIN;
SELECT status FROM idem_claim('own');
SAVEPOINT s;
SELECT idem_complete('own', 700);
ROLLBACK TO SAVEPOINT s;
SELECT idem_complete('own', 200);
ROLLBACK TO SAVEPOINT s;
COMMIT;
\set VERBOSITY default
SELECT count(*) AS own_rows FROM idem_lookup('own');
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 8. transaction states: read-only, aborted, prepared, parallel mode,
--    claims resolved too late (deferred trigger, holdable cursor)
----------------------------------------------------------------------------
BEGIN READ ONLY;
SELECT label, try(stmt) FROM (VALUES
  ('consume',     $$SELECT idem_consume_message('c', 'ro')$$),
  ('batch',       $$SELECT idem_consume_messages('c', ARRAY['ro'])$$),
  ('empty batch', $$SELECT idem_consume_messages('c', ARRAY[]::text[])$$),
  ('claim new',   $$SELECT idem_claim('ro')$$),
  ('claim done',  $$SELECT idem_claim('done', '{"v": 1}')$$),
  ('complete',    format('SELECT idem_complete(%L, 200, token => %s)', 'held', :held)),
  ('checkpoint',  format('SELECT idem_checkpoint(%L, %L, token => %s)', 'held', 'step', :held)),
  ('release',     format('SELECT idem_release(%L, token => %s)', 'held', :held)),
  ('maintain',    $$SELECT idem_maintain()$$)
) AS t(label, stmt);
-- reading is fine
SELECT status, response_code, response_body FROM idem_lookup('done');
COMMIT;
BEGIN;
SET TRANSACTION READ ONLY;
SELECT try($$SELECT idem_consume_message('c', 'ro')$$) AS set_transaction_read_only;
COMMIT;
SET default_transaction_read_only = on;
SELECT try($$SELECT idem_claim('ro', lease => '1 hour')$$) AS default_read_only;
RESET default_transaction_read_only;

-- an aborted transaction refuses everything, reads included
\set VERBOSITY sqlstate
BEGIN;
SELECT 1 / 0;
SELECT idem_consume_message('c', 'aborted');
SELECT idem_claim('aborted');
SELECT * FROM idem_lookup('done');
ROLLBACK;

-- PREPARE TRANSACTION with a same-transaction claim neither completed nor
-- released fails like COMMIT, and nothing is left prepared
BEGIN;
SELECT status FROM idem_claim('prepared');
PREPARE TRANSACTION 'regress_idem_misuse_1';
\set VERBOSITY default
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid LIKE 'regress_idem_misuse%';
SELECT count(*) AS rows FROM idem_lookup('prepared');
-- a resolved claim and a two-phase claim can be prepared; while prepared
-- they are another transaction's
BEGIN;
SELECT status FROM idem_claim('prepared');
SELECT idem_complete('prepared', 201);
SELECT idem_consume_message('c', 'prepared');
PREPARE TRANSACTION 'regress_idem_misuse_2';
BEGIN;
SELECT token AS prepared_token FROM idem_claim('prepared-2pc', lease => '1 hour') \gset
PREPARE TRANSACTION 'regress_idem_misuse_3';
SET lock_timeout = '10ms';
SELECT label, try(stmt) FROM (VALUES
  ('claim, wait',                    $$SELECT status FROM idem_claim('prepared', wait => true)$$),
  ('consume',                        $$SELECT idem_consume_message('c', 'prepared')$$),
  ('complete with the token',        format('SELECT idem_complete(%L, 200, token => %s)', 'prepared-2pc', :prepared_token)),
  ('checkpoint with the token',      format('SELECT idem_checkpoint(%L, %L, token => %s)', 'prepared-2pc', 'step', :prepared_token)),
  ('release with the token',         format('SELECT idem_release(%L, token => %s)', 'prepared-2pc', :prepared_token))
) AS t(label, stmt);
RESET lock_timeout;
-- without waiting: in progress; and a row being written by another
-- transaction is not there yet for lookups
SELECT status FROM idem_claim('prepared');
SELECT count(*) AS prepared_lookup FROM idem_lookup('prepared-2pc');
COMMIT PREPARED 'regress_idem_misuse_2';
COMMIT PREPARED 'regress_idem_misuse_3';
SELECT status, response_code FROM idem_claim('prepared');
SELECT idem_consume_message('c', 'prepared') AS consumed_again;
SELECT status FROM idem_lookup('prepared-2pc');
SELECT idem_release('prepared-2pc', token => :prepared_token);
SELECT ledger_rows();
SELECT ledger_state() AS state_before \gset

-- parallel mode: a wrapper wrongly marked PARALLEL SAFE cannot write
CREATE FUNCTION par_consume(m text) RETURNS boolean PARALLEL SAFE
  LANGUAGE plpgsql AS $$ BEGIN RETURN idem_consume_message('c', m); END $$;
CREATE FUNCTION par_claim(k text) RETURNS text PARALLEL SAFE
  LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT status FROM idem_claim(k)); END $$;
-- (force_parallel_mode was renamed debug_parallel_query in PostgreSQL 16)
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END,
                  'on', false) AS parallel_forced;
SELECT try($$SELECT par_consume('parallel')$$) AS parallel_consume;
SELECT try($$SELECT par_claim('parallel')$$) AS parallel_claim;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END,
                  'off', false) AS parallel_forced;
DROP FUNCTION par_consume(text), par_claim(text);

-- claims made while COMMIT runs (a deferred trigger, a holdable cursor) are
-- checked too
CREATE TABLE orders (id int);
CREATE FUNCTION claim_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_claim('order-' || NEW.id);
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER claim_order AFTER INSERT ON orders
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION claim_order();
\set VERBOSITY sqlstate
INSERT INTO orders VALUES (1);
BEGIN;
DECLARE held_cursor CURSOR WITH HOLD FOR SELECT status FROM idem_claim('cursor');
COMMIT;
\set VERBOSITY default
SELECT (SELECT count(*) FROM orders) AS orders, (SELECT count(*) FROM idem_lookup('order-1')) AS order_key,
       (SELECT count(*) FROM idem_lookup('cursor')) AS cursor_key;
DROP TABLE orders;
DROP FUNCTION claim_order();
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 9. wrong types, unknown arguments, wrong argument counts
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('consumer and id as integers',   $$SELECT idem_consume_message(1, 2)$$),
  ('ttl as an integer',             $$SELECT idem_consume_message('c', 'm', 60)$$),
  ('ttl not an interval',           $$SELECT idem_consume_message('c', 'm', 'a minute')$$),
  ('ids as text, not text[]',       $$SELECT idem_consume_messages('c', 'm1,m2')$$),
  ('ids as an integer array',       $$SELECT idem_consume_messages('c', ARRAY[1, 2])$$),
  ('request not json',              $$SELECT idem_claim('k', 'not json')$$),
  ('request as json, not jsonb',    $$SELECT idem_claim('k', '{}'::json)$$),
  ('wait not a boolean',            $$SELECT idem_claim('k', wait => 'maybe')$$),
  ('response_code as bigint',       $$SELECT idem_complete('k', 200::bigint)$$),
  ('response_code as numeric',      $$SELECT idem_complete('k', 200.5)$$),
  ('response_code as text',         $$SELECT idem_complete('k', 'OK'::text)$$),
  ('token not a number',            $$SELECT idem_complete('k', 200, token => 'abc')$$),
  ('token over bigint',             $$SELECT idem_complete('k', 200, token => 99999999999999999999)$$),
  ('unknown argument name',         $$SELECT idem_claim('k', timeout => '1s')$$),
  ('no arguments',                  $$SELECT idem_claim()$$),
  ('too many arguments',            $$SELECT idem_release('k', '', 1, 2)$$),
  ('idem_maintain with an argument', $$SELECT idem_maintain(true)$$)
) AS t(label, stmt);
SELECT ledger_rows(), ledger_state() = :'state_before' AS ledger_unchanged;

----------------------------------------------------------------------------
-- 10. settings
----------------------------------------------------------------------------
SELECT label, try(stmt) FROM (VALUES
  ('key_ttl 0',                  $$SET idempotency.key_ttl = 0$$),
  ('key_ttl negative',           $$SET idempotency.key_ttl = '-1h'$$),
  ('key_ttl 500 ms (rounds to 0)', $$SET idempotency.key_ttl = '500ms'$$),
  ('key_ttl unknown unit',       $$SET idempotency.key_ttl = '1 fortnight'$$),
  ('key_ttl size unit',          $$SET idempotency.key_ttl = '10GB'$$),
  ('key_ttl two units',          $$SET idempotency.key_ttl = '1h 30min'$$),
  ('key_ttl garbage',            $$SET idempotency.key_ttl = 'forever'$$),
  ('key_ttl empty',              $$SET idempotency.key_ttl = ''$$),
  ('key_ttl over int range',     $$SET idempotency.key_ttl = 2147483648$$),
  ('message_ttl 0',              $$SET idempotency.message_ttl = 0$$),
  ('message_ttl negative',       $$SET idempotency.message_ttl = -1$$),
  ('message_ttl garbage',        $$SET idempotency.message_ttl = 'a week'$$),
  ('message_ttl NaN',            $$SET idempotency.message_ttl = 'NaN'$$),
  ('max_ttl 0',                  $$SET idempotency.max_ttl = 0$$),
  ('max_ttl negative',           $$SET idempotency.max_ttl = '-30d'$$),
  ('max_ttl garbage',            $$SET idempotency.max_ttl = 'infinity'$$),
  ('partition_interval 0',       $$SET idempotency.partition_interval = 0$$),
  ('partition_interval -1h',     $$SET idempotency.partition_interval = '-1h'$$),
  ('partition_interval 100ms',   $$SET idempotency.partition_interval = '100ms'$$),
  ('partition_interval garbage', $$SET idempotency.partition_interval = 'daily'$$),
  ('premake -1',                 $$SET idempotency.premake = -1$$),
  ('premake 65',                 $$SET idempotency.premake = 65$$),
  ('premake with a unit',        $$SET idempotency.premake = '1s'$$),
  ('premake garbage',            $$SET idempotency.premake = 'some'$$),
  ('max_key_length 0',           $$SET idempotency.max_key_length = 0$$),
  ('max_key_length -1',          $$SET idempotency.max_key_length = -1$$),
  ('max_key_length over 1 MB',   $$SET idempotency.max_key_length = 1048577$$),
  ('max_key_length with a unit', $$SET idempotency.max_key_length = '1kB'$$),
  ('unknown setting',            $$SET idempotency.unknown_setting = 1$$),
  ('unknown setting, set_config', $$SELECT set_config('idempotency.unknown_setting', '1', false)$$),
  ('unknown setting, ALTER DATABASE', $$ALTER DATABASE regress_idem_misuse SET idempotency.unknown_setting = 1$$),
  ('bad value, ALTER DATABASE',  $$ALTER DATABASE regress_idem_misuse SET idempotency.key_ttl = 0$$),
  ('bad value, ALTER ROLE',      $$ALTER ROLE CURRENT_USER SET idempotency.max_ttl = 'x'$$),
  ('bad value, SET LOCAL',       $$SET LOCAL idempotency.premake = 100$$),
  ('bare prefix',                $$SET idempotency = 1$$)
) AS t(label, stmt);
-- nothing was changed by the refused values
SELECT name, setting FROM pg_settings WHERE name LIKE 'idempotency.%' AND source <> 'default';
SELECT count(*) AS database_or_role_settings FROM pg_db_role_setting s
 WHERE array_to_string(s.setconfig, ',') LIKE '%idempotency.%';

-- every idempotency.* setting there is, whatever it is called, refuses bad
-- values (22023; 55P02 for one that cannot be changed in a session) and
-- keeps its value
CREATE FUNCTION setting_problems(guc text, context text, minv text, maxv text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  bad text;
  before text := current_setting(guc);
  want text := CASE WHEN context IN ('user', 'superuser') THEN '22023' ELSE '55P02' END;
  got text;
  problems text := '';
BEGIN
  FOREACH bad IN ARRAY ARRAY['-1', 'garbage', '', '1 fortnight', '99999999999',
                             (minv::numeric - 1)::text, (maxv::numeric + 1)::text] LOOP
    BEGIN
      PERFORM set_config(guc, bad, false);
      got := 'accepted';
    EXCEPTION WHEN OTHERS THEN
      got := SQLSTATE;
    END;
    IF got <> want THEN
      problems := problems || format(' %L: %s', bad, got);
    END IF;
    IF current_setting(guc) <> before THEN
      problems := problems || format(' %L changed it', bad);
    END IF;
  END LOOP;
  RETURN problems;
END $$;
SELECT count(*) >= 6 AS all_settings_checked,
       string_agg(name || ':' || problems, '; ') FILTER (WHERE problems <> '') AS problems
  FROM (SELECT name, setting_problems(name, context, min_val, max_val) AS problems
          FROM pg_settings
         WHERE name LIKE 'idempotency.%' AND vartype IN ('integer', 'real')) s;
DROP FUNCTION setting_problems(text, text, text, text);

----------------------------------------------------------------------------
-- 11. roles: an ordinary role, SECURITY DEFINER functions
----------------------------------------------------------------------------
CREATE ROLE regress_idem_misuse_app;
CREATE ROLE regress_idem_misuse_owner;
CREATE SCHEMA app AUTHORIZATION regress_idem_misuse_owner;
GRANT USAGE ON SCHEMA app TO regress_idem_misuse_app;
GRANT EXECUTE ON FUNCTION try(text) TO regress_idem_misuse_app;

SET ROLE regress_idem_misuse_app;
SELECT label, try(stmt) FROM (VALUES
  ('idem_maintain',                $$SELECT idem_maintain()$$),
  ('SET max_ttl',                  $$SET idempotency.max_ttl = '1d'$$),
  ('SET partition_interval',       $$SET idempotency.partition_interval = '1h'$$),
  ('SET premake',                  $$SET idempotency.premake = 2$$),
  ('SET max_key_length',           $$SET idempotency.max_key_length = 1000$$),
  ('ALTER ROLE ... SET max_ttl',   $$ALTER ROLE CURRENT_USER SET idempotency.max_ttl = '1d'$$),
  ('read the partitions view',     $$SELECT count(*) FROM idempotency.partitions$$),
  -- the default ttls size the partitions: not the caller's to choose
  -- (a call passes its own ttl instead)
  ('SET key_ttl',                  $$SET idempotency.key_ttl = '1h'$$),
  ('SET message_ttl',              $$SET idempotency.message_ttl = '1h'$$)
) AS t(label, stmt);
RESET ROLE;

-- a SECURITY DEFINER function acts as its owner (the role is current_user):
-- the owner's keys and messages, not the caller's
SET ROLE regress_idem_misuse_owner;
CREATE FUNCTION app.claim(k text) RETURNS text SECURITY DEFINER LANGUAGE sql
  AS $$ SELECT status || ' as ' || current_user FROM idem_claim(k, lease => '1 hour') $$;
CREATE FUNCTION app.consume(m text) RETURNS boolean SECURITY DEFINER LANGUAGE sql
  AS $$ SELECT idem_consume_message('app', m) $$;
CREATE FUNCTION app.lookup(k text) RETURNS text SECURITY DEFINER LANGUAGE sql
  AS $$ SELECT status FROM idem_lookup(k) $$;
CREATE FUNCTION app.maintain() RETURNS boolean SECURITY DEFINER LANGUAGE sql
  AS $$ SELECT partitions_created >= 0 FROM idem_maintain() $$;
RESET ROLE;
SET ROLE regress_idem_misuse_app;
SELECT app.claim('definer') AS definer_claim;
SELECT app.consume('definer') AS definer_consume;
-- the caller has neither the key nor the message
SELECT count(*) AS caller_sees FROM idem_lookup('definer');
SELECT status FROM idem_claim('definer', lease => '1 hour');
SELECT idem_consume_message('app', 'definer') AS caller_consume;
-- through the function, the owner's claim is in progress
SELECT app.claim('definer') AS definer_claim_again, app.lookup('definer') AS definer_lookup;
-- an owner without EXECUTE on idem_maintain gains nothing by SECURITY DEFINER
SELECT try($$SELECT app.maintain()$$) AS definer_maintain;
RESET ROLE;
SELECT role, state, count(*) FROM idempotency.keys
 WHERE role IN ('regress_idem_misuse_app'::regrole, 'regress_idem_misuse_owner'::regrole)
 GROUP BY role, state ORDER BY role::text;
SELECT role, count(*) FROM idempotency.messages
 WHERE role IN ('regress_idem_misuse_app'::regrole, 'regress_idem_misuse_owner'::regrole)
 GROUP BY role ORDER BY role::text;

-- a superuser's SECURITY DEFINER wrapper is how maintenance is delegated
CREATE FUNCTION app.maintain_as_superuser() RETURNS boolean SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp LANGUAGE sql
  AS $$ SELECT partitions_created >= 0 FROM idem_maintain() $$;
REVOKE ALL ON FUNCTION app.maintain_as_superuser() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION app.maintain_as_superuser() TO regress_idem_misuse_app;
SET ROLE regress_idem_misuse_app;
SELECT app.maintain_as_superuser() AS delegated_maintain;
RESET ROLE;

----------------------------------------------------------------------------
-- clean up
----------------------------------------------------------------------------
\c :regress_db
SET client_min_messages = warning;
DROP DATABASE regress_idem_misuse;
DROP ROLE regress_idem_misuse_app;
DROP ROLE regress_idem_misuse_owner;
RESET client_min_messages;
