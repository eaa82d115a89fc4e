--
-- Moving a tenant's outbox between nodes (0.5.0): export_events() and
-- export_relays() on the node it leaves, import_relay() then import_event()
-- in one transaction on the node it goes to.  Each relay delivers at the
-- destination exactly the events it had not acknowledged, a retried import
-- changes nothing, and the format says what it holds.
--
-- Two databases of their own stand for the two nodes; the exports travel
-- in psql variables (any transport does: COPY, dblink).
\set regress_db :DBNAME
SET client_min_messages = warning;
DROP DATABASE IF EXISTS outbox_xfer_src;
DROP DATABASE IF EXISTS outbox_xfer_dst;
DROP ROLE IF EXISTS regress_idem_xfer_app;
DROP ROLE IF EXISTS regress_idem_xfer_other;
RESET client_min_messages;
CREATE ROLE regress_idem_xfer_app;
CREATE ROLE regress_idem_xfer_other;
CREATE DATABASE outbox_xfer_src;
CREATE DATABASE outbox_xfer_dst;

-- ---------------------------------------------------------------- source
\c outbox_xfer_src
CREATE EXTENSION idempotency;
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SET ROLE regress_idem_xfer_app;
-- six events of tenant acme, keys k0..k2, in three transactions; one
-- rolled back; another tenant's topic stays behind
BEGIN;
SELECT count(idem_publish('acme', jsonb_build_object('n', i), key => 'k' || (i % 3)))
  FROM generate_series(1, 2) i;
COMMIT;
BEGIN;
SELECT count(idem_publish('acme', jsonb_build_object('n', i), key => 'k' || (i % 3)))
  FROM generate_series(3, 4) i;
COMMIT;
BEGIN;
SELECT count(idem_publish('acme', '{"n": "rolled back"}', key => 'k0'));
ROLLBACK;
BEGIN;
SELECT count(idem_publish('acme', jsonb_build_object('n', i), key => 'k' || (i % 3),
                          headers => '{"h": "v"}'))
  FROM generate_series(5, 6) i;
COMMIT;
SELECT count(idem_publish('globex', '{"n": 1}'));
-- relay "webhook" delivered events 1 and 2; relay "audit" holds 1..4
-- handed out, not acknowledged; relay "idle" of globex only
BEGIN;
SELECT batch, payload FROM idem_outbox_next('webhook', 'acme', 2);
SELECT idem_outbox_ack('webhook', 'acme', 1);
COMMIT;
SELECT batch, payload FROM idem_outbox_next('audit', 'acme', 4, generation => 3);
SELECT count(*) FROM idem_outbox_next('idle', 'globex');
-- ordinary roles may neither export nor import
SELECT pg_temp.try($$SELECT * FROM idempotency.export_events()$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.export_relays()$$);
SELECT pg_temp.try($$SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1,
        gen_random_uuid(), NULL, NULL, '{"n": "injected"}', NULL, now(), '{}')::idempotency.event_record)$$);
SELECT pg_temp.try($$SELECT idempotency.import_relay(('regress_idem_xfer_app', 'webhook', 'acme',
        NULL, 1, 0, NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record)$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox$$);
RESET ROLE;
-- ... nor with the schema's USAGE: EXECUTE is revoked from PUBLIC
GRANT USAGE ON SCHEMA idempotency TO regress_idem_xfer_other;
SET ROLE regress_idem_xfer_other;
SELECT pg_temp.try($$SELECT * FROM idempotency.export_events()$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.export_relays()$$);
SELECT pg_temp.try($$SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1,
        gen_random_uuid(), NULL, NULL, '{"n": "injected"}', NULL, now(), '{}')::idempotency.event_record)$$);
SELECT pg_temp.try($$SELECT idempotency.import_relay(('regress_idem_xfer_app', 'webhook', 'acme',
        NULL, 1, 0, NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record)$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_relays$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.export_dead_letters()$$);
SELECT pg_temp.try($$SELECT idempotency.import_dead_letter(('regress_idem_xfer_app', 'webhook', 'acme',
        gen_random_uuid(), NULL, NULL, NULL, NULL, now(), 'forged', 1, now())::idempotency.dead_letter_record)$$);
RESET ROLE;
REVOKE USAGE ON SCHEMA idempotency FROM regress_idem_xfer_other;

-- ---------------------------------------------------------------- export
-- what the export of this version holds, and in which order to import it
SELECT * FROM idempotency.export_manifest();
-- the events some relay has not acknowledged, those acknowledged by more
-- relays first: a relay's acknowledged events lead
SELECT role, topic, ord, key, payload, headers, delivered_by
  FROM idempotency.export_events(ARRAY['acme', 'acme']) ORDER BY ord;
SELECT role, relay, topic, generation, batch, lost_events, acked_at IS NOT NULL AS acked
  FROM idempotency.export_relays(ARRAY['acme']) ORDER BY relay;
-- NULL: every topic; an empty list: none
SELECT (SELECT count(*) FROM idempotency.export_events()) AS all_events,
       (SELECT count(*) FROM idempotency.export_events('{}')) AS no_topic,
       (SELECT count(*) FROM idempotency.export_relays()) AS all_relays,
       (SELECT count(*) FROM idempotency.export_relays('{}')) AS no_relay;
-- a topic without relays: every event it keeps
SELECT topic, payload, delivered_by FROM idempotency.export_events(ARRAY['globex-none']);
SET ROLE regress_idem_xfer_app;
SELECT count(idem_publish('lonely', '{"n": 1}'));
RESET ROLE;
SELECT topic, payload, delivered_by FROM idempotency.export_events(ARRAY['lonely']);
SET DateStyle = ISO;  -- text that reads back in any time zone (not "SST")
SELECT array_agg(e ORDER BY e.ord)::text AS events
  FROM idempotency.export_events(ARRAY['acme']) e \gset
SELECT array_agg(r ORDER BY r.relay)::text AS relays
  FROM idempotency.export_relays(ARRAY['acme']) r \gset
RESET DateStyle;  -- compared as text where it is read back, in the same style
SELECT array_agg(e.event_id::text || ' ' || e.published_at ORDER BY e.ord)::text AS event_ids
  FROM idempotency.export_events(ARRAY['acme']) e \gset
-- the relays of the old node stop: the tenant's relays go on at the new one

-- ---------------------------------------------------------------- import
\c outbox_xfer_dst
CREATE EXTENSION idempotency;
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
-- the same manifest: this node takes every part of the export
SELECT count(*) AS parts, min(format) AS format FROM idempotency.export_manifest();
-- a publisher of this node, on a topic of its own
SET ROLE regress_idem_xfer_app;
SELECT count(idem_publish('local', '{"n": 0}'));
RESET ROLE;
BEGIN;
SELECT r.relay, idempotency.import_relay(r)
  FROM unnest(:'relays'::idempotency.relay_record[]) r ORDER BY r.relay;
SELECT e.ord, idempotency.import_event(e)
  FROM unnest(:'events'::idempotency.event_record[]) e ORDER BY e.ord;
COMMIT;
-- again (a retried import): nothing changes
BEGIN;
SELECT r.relay, idempotency.import_relay(r)
  FROM unnest(:'relays'::idempotency.relay_record[]) r ORDER BY r.relay;
SELECT e.ord, idempotency.import_event(e)
  FROM unnest(:'events'::idempotency.event_record[]) e ORDER BY e.ord;
COMMIT;

SET ROLE regress_idem_xfer_app;
SELECT relay, topic, generation, batch, in_flight, lag_events, lost_events
  FROM idem_outbox_relays() ORDER BY relay;
-- webhook: the four it had not acknowledged, in the same batch numbering,
-- with their event ids, publication times and headers
SELECT batch, key, payload, headers FROM idem_outbox_next('webhook', 'acme', 10);
SELECT idem_outbox_ack('webhook', 'acme', 2);
-- audit: every event again (none acknowledged), fenced as before, with
-- the event ids and publication times they had
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('audit', 'acme', 10, generation => 2)$$);
SELECT batch, key, payload FROM idem_outbox_next('audit', 'acme', 10, generation => 3);
SELECT array_agg(event_id::text || ' ' || published_at)::text = :'event_ids' AS same_ids_and_times
  FROM idem_outbox_next('audit', 'acme', 10, generation => 3);
SELECT idem_outbox_ack('audit', 'acme', 1, generation => 3);
-- an event published here after the move reaches both, once
SELECT count(idem_publish('acme', '{"n": 7}', key => 'k1'));
SELECT batch, payload FROM idem_outbox_next('webhook', 'acme', 10);
SELECT idem_outbox_ack('webhook', 'acme', 3);
SELECT batch, payload FROM idem_outbox_next('audit', 'acme', 10, generation => 3);
SELECT idem_outbox_ack('audit', 'acme', 2, generation => 3);
SELECT count(*) AS nothing_more FROM idem_outbox_next('webhook', 'acme', 10);
SELECT count(*) AS nothing_more FROM idem_outbox_next('audit', 'acme', 10, generation => 3);
-- a relay never seen reads every event the topic keeps here
SELECT count(*) AS new_relay_reads FROM idem_outbox_next('fresh', 'acme', 100);
-- the other tenant's topic did not come along
SELECT count(*) AS globex FROM idem_outbox_next('idle', 'globex');
RESET ROLE;
-- another role sees none of them (its relay of that name is its own)
SET ROLE regress_idem_xfer_other;
SELECT count(*) AS other_role FROM idem_outbox_next('webhook', 'acme', 100);
RESET ROLE;
-- the retried import after the relays went on: still nothing changes
BEGIN;
SELECT r.relay, idempotency.import_relay(r)
  FROM unnest(:'relays'::idempotency.relay_record[]) r ORDER BY r.relay;
SELECT e.ord, idempotency.import_event(e)
  FROM unnest(:'events'::idempotency.event_record[]) e ORDER BY e.ord;
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT count(*) AS nothing_again FROM idem_outbox_next('webhook', 'acme', 10);
SELECT count(*) AS nothing_again FROM idem_outbox_next('audit', 'acme', 10, generation => 3);

-- a retried import once the relay delivered the events and their segment
-- went (maintenance drops it; here the rows are deleted): nothing again
RESET ROLE;
BEGIN;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r-gone', 'gone', NULL, 1, 0,
        NULL, NULL, NULL, NULL, '2026-01-01 00:00:00+00', NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'gone', i, ('00000000-0000-7000-8000-00000000000' || i)::uuid,
        NULL, NULL, jsonb_build_object('n', i), NULL, now(), '{}')::idempotency.event_record)
  FROM generate_series(1, 2) AS i;
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT batch, payload FROM idem_outbox_next('r-gone', 'gone');
SELECT idem_outbox_ack('r-gone', 'gone', 1);
RESET ROLE;
DELETE FROM idempotency.outbox WHERE topic = 'gone';
BEGIN;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r-gone', 'gone', NULL, 1, 0,
        NULL, NULL, NULL, NULL, '2026-01-01 00:00:00+00', NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'gone', i, ('00000000-0000-7000-8000-00000000000' || i)::uuid,
        NULL, NULL, jsonb_build_object('n', i), NULL, now(), '{}')::idempotency.event_record)
  FROM generate_series(1, 2) AS i;
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT count(*) AS nothing_again FROM idem_outbox_next('r-gone', 'gone');

-- ---------------------------------------------------------------- moving back
-- event 8 is handed out to webhook, not acknowledged; the tenant goes
-- back to the old node, whose webhook is where it was (batch 2, events
-- 3..6 unacknowledged there) and whose audit holds 1..4 handed out
SELECT count(idem_publish('acme', '{"n": 8}', key => 'k2'));
SELECT batch, payload FROM idem_outbox_next('webhook', 'acme', 10);
RESET ROLE;
SELECT e.ord, e.payload, e.delivered_by
  FROM idempotency.export_events(ARRAY['acme']) e ORDER BY e.ord;
SET DateStyle = ISO;  -- text that reads back in any time zone (not "SST")
SELECT array_agg(e ORDER BY e.ord)::text AS events_back
  FROM idempotency.export_events(ARRAY['acme']) e \gset
SELECT array_agg(r ORDER BY r.relay)::text AS relays_back
  FROM idempotency.export_relays(ARRAY['acme']) r \gset
\c outbox_xfer_src
BEGIN;
SELECT r.role, r.relay, idempotency.import_relay(r)
  FROM unnest(:'relays_back'::idempotency.relay_record[]) r ORDER BY r.role, r.relay;
SELECT e.ord, idempotency.import_event(e)
  FROM unnest(:'events_back'::idempotency.event_record[]) e ORDER BY e.ord;
COMMIT;
SET ROLE regress_idem_xfer_app;
-- webhook and audit: event 8 only, not 3..7 they delivered at the other
-- node (the old copies of 1..6 here are kept, 7 and 8 written)
SELECT batch, payload FROM idem_outbox_next('webhook', 'acme', 10);
SELECT idem_outbox_ack('webhook', 'acme', 4);
SELECT count(*) AS nothing_more FROM idem_outbox_next('webhook', 'acme', 10);
SELECT batch, payload FROM idem_outbox_next('audit', 'acme', 10, generation => 3);
-- fresh, which had acknowledged nothing: all eight, once each
SELECT count(*) AS events, count(DISTINCT event_id) AS distinct_ids
  FROM idem_outbox_next('fresh', 'acme', 100);
RESET ROLE;

-- ---------------------------------------------------------------- refusals
\c outbox_xfer_dst
\set VERBOSITY terse
-- a relay after events of its topic, in one transaction
BEGIN;
SELECT idempotency.import_event(e)
  FROM unnest(:'events'::idempotency.event_record[]) e ORDER BY e.ord LIMIT 1;
SELECT idempotency.import_relay(r)
  FROM unnest(:'relays'::idempotency.relay_record[]) r ORDER BY r.relay LIMIT 1;
ROLLBACK;
-- another relay of that name, with events not delivered here
SET ROLE regress_idem_xfer_app;
SELECT count(idem_publish('busy', '{"n": 1}'));
SELECT count(*) FROM idem_outbox_next('webhook', 'busy', 10);
SELECT count(idem_publish('busy', '{"n": 2}'));
RESET ROLE;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'webhook', 'busy', NULL, 5, 0,
        NULL, NULL, NULL, NULL, now() - interval '1 day', NULL)::idempotency.relay_record);
-- ... and once it delivered everything here: merged (the higher batch)
SET ROLE regress_idem_xfer_app;
SELECT idem_outbox_ack('webhook', 'busy', 1);
SELECT count(*) FROM idem_outbox_next('webhook', 'busy', 10);
SELECT idem_outbox_ack('webhook', 'busy', 2);
RESET ROLE;
BEGIN;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'webhook', 'busy', 4, 5, 0,
        NULL, NULL, NULL, NULL, now() - interval '1 day', NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'busy', 1, gen_random_uuid(), NULL, NULL,
        '{"n": "moved"}', NULL, now(), '{}')::idempotency.event_record);
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT batch, payload FROM idem_outbox_next('webhook', 'busy', 10, generation => 4);
RESET ROLE;
-- a rolled-back savepoint takes its imports with it
BEGIN;
SAVEPOINT s;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r-sp', 'sp', NULL, 1, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'sp', 1, gen_random_uuid(), NULL, NULL,
        '{"n": "rolled back"}', NULL, now(), '{}')::idempotency.event_record);
ROLLBACK TO SAVEPOINT s;
-- the topic's relays may come first again: its events went with the savepoint
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r-sp', 'sp', NULL, 2, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'sp', 2, gen_random_uuid(), NULL, NULL,
        '{"n": "kept"}', NULL, now(), '{}')::idempotency.event_record);
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT relay, topic, batch FROM idem_outbox_relays() WHERE topic = 'sp';
SELECT batch, payload FROM idem_outbox_next('r-sp', 'sp', 10);
RESET ROLE;

-- one transaction imports events of more keys than a transaction may hold
-- event key locks (max_locks_per_transaction): imports take none
BEGIN;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r-many', 'many', NULL, 1, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT count(*) FILTER (WHERE o = 'inserted')
       - current_setting('max_locks_per_transaction')::int AS inserted_beyond_the_limit
  FROM (SELECT idempotency.import_event(('regress_idem_xfer_app', 'many', i, gen_random_uuid(),
               'key-' || i, NULL, NULL, NULL, now(), '{}')::idempotency.event_record) AS o
          FROM generate_series(1, current_setting('max_locks_per_transaction')::int + 10) AS i) s;
COMMIT;
SET ROLE regress_idem_xfer_app;
SELECT count(*) - current_setting('max_locks_per_transaction')::int AS delivered_beyond_the_limit
  FROM idem_outbox_next('r-many', 'many', 1000);
RESET ROLE;

-- a loss not acknowledged yet moves with its relay: reported here, as
-- the batch it was, and acknowledged here
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'lossy', 'lost', 2, 4, 3, 10, 12,
        '2026-01-01 00:00:00+00', '2026-01-01 00:00:02+00', now(), NULL)::idempotency.relay_record);
SET ROLE regress_idem_xfer_app;
SELECT * FROM idem_outbox_next('lossy', 'lost', generation => 2);
SELECT relay, batch, lost_events FROM idem_outbox_relays() WHERE relay = 'lossy';
SELECT idem_outbox_ack('lossy', 'lost', 4, generation => 2);
SELECT count(*) AS after_the_loss FROM idem_outbox_next('lossy', 'lost', generation => 2);
RESET ROLE;

-- ---------------------------------------------------------------- bad input
CREATE TABLE before_bad AS SELECT count(*) AS n FROM idempotency.outbox;
SELECT idempotency.import_event(('regress_idem_nobody', 'acme', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event((NULL, 'acme', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', '', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', repeat('t', 300), 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, NULL, NULL, NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), '', NULL,
        NULL, NULL, now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, NULL, '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, NULL,
        '{}', '\x00', now(), '{}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, '{"a": 1}',
        NULL, NULL, now(), '{}')::idempotency.event_record);
SET idempotency.max_response_bytes = 1024;
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, NULL,
        jsonb_build_object('x', repeat('x', 2000)), NULL, now(), '{}')::idempotency.event_record);
RESET idempotency.max_response_bytes;
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{webhook, NULL}')::idempotency.event_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'acme', 1, gen_random_uuid(), NULL, NULL,
        NULL, NULL, now(), '{{a}, {b}}')::idempotency.event_record);
SELECT idempotency.import_event(ROW('regress_idem_xfer_app'::name, 'acme', 1::bigint));
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r', 'acme', NULL, 0, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r', 'acme', -1, 1, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_relay(('regress_idem_xfer_app', '', 'acme', NULL, 1, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r', 'acme', NULL, 1, 2,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'r', 'acme', NULL, 1, 0,
        NULL, NULL, NULL, NULL, NULL, NULL)::idempotency.relay_record);
SELECT * FROM idempotency.export_events(ARRAY['acme', NULL]);
SELECT * FROM idempotency.export_relays(ARRAY[['acme'], ['globex']]);
SELECT * FROM idempotency.export_events(ARRAY[repeat('x', 300)]);
BEGIN READ ONLY;
SELECT idempotency.import_event(e)
  FROM unnest(:'events'::idempotency.event_record[]) e ORDER BY e.ord LIMIT 1;
ROLLBACK;
SELECT (SELECT count(*) FROM idempotency.outbox) - n AS events_written FROM before_bad;
DROP TABLE before_bad;
\set VERBOSITY default

-- ---------------------------------------------------------------- look-alikes
-- Export and import run with more privilege than the roles whose rows
-- they move: look-alike operators, functions and tables a role put on the
-- mover's path (and in pg_temp) change nothing.
CREATE SCHEMA regress_idem_evil AUTHORIZATION regress_idem_xfer_other;
\c -
SET ROLE regress_idem_xfer_other;
CREATE FUNCTION regress_idem_evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike text = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = text, rightarg = text, function = regress_idem_evil.eq);
CREATE FUNCTION regress_idem_evil.oideq(oid, oid) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike oid = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = oid, rightarg = oid, function = regress_idem_evil.oideq);
CREATE FUNCTION regress_idem_evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike nextval ran'; RETURN 1; END$$;
CREATE TABLE regress_idem_evil.outbox_relays (role regrole, relay text, topic text);
RESET ROLE;
CREATE TEMP TABLE outbox_relays (role regrole, relay text, topic text);
SET search_path = regress_idem_evil, pg_catalog;
SELECT count(*) AS exported FROM idempotency.export_events(ARRAY['acme']);
SELECT count(*) AS dead_letters FROM idempotency.export_dead_letters();
SELECT role, relay, batch FROM idempotency.export_relays(ARRAY['acme']) ORDER BY role, relay;
BEGIN;
SELECT idempotency.import_relay(('regress_idem_xfer_app', 'evil-relay', 'evil', NULL, 1, 0,
        NULL, NULL, NULL, NULL, now(), NULL)::idempotency.relay_record);
SELECT idempotency.import_event(('regress_idem_xfer_app', 'evil', 1, gen_random_uuid(), NULL, NULL,
        '{"n": 1}', NULL, now(), '{}')::idempotency.event_record);
COMMIT;
RESET search_path;
SELECT count(*) AS untouched FROM regress_idem_evil.outbox_relays;
SELECT count(*) AS untouched FROM pg_temp.outbox_relays;
SET ROLE regress_idem_xfer_app;
SELECT batch, payload FROM idem_outbox_next('evil-relay', 'evil');
RESET ROLE;

-- ---------------------------------------------------------------- dead letters
-- a relay's dead letters move with it: the new node's view shows them
\c outbox_xfer_src
SET ROLE regress_idem_xfer_app;
SELECT count(idem_publish('dl', '{"n": 1}', key => 'k', headers => '{"h": "v"}'));
SELECT idem_outbox_dead_letter('dlr', 'dl', n.event_id, 'endpoint gone', 5)
  FROM idem_outbox_next('dlr', 'dl') AS n;
SELECT idem_outbox_ack('dlr', 'dl', 1);
RESET ROLE;
SELECT role, relay, topic, key, payload, headers, reason, attempts
  FROM idempotency.export_dead_letters(ARRAY['dl']);
SELECT count(*) AS none FROM idempotency.export_dead_letters(ARRAY['acme']);
SET DateStyle = ISO;  -- text that reads back in any time zone (not "SST")
SELECT array_agg(d)::text AS dead
  FROM idempotency.export_dead_letters(ARRAY['dl']) d \gset
\c outbox_xfer_dst
SELECT idempotency.import_dead_letter(d) FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SELECT idempotency.import_dead_letter(d) FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
-- a later failure of the same event replaces it; one past outbox_max_age
-- is not stored
SELECT idempotency.import_dead_letter((d.role, d.relay, d.topic, d.event_id, d.key, d.headers,
        d.payload, d.payload_raw, d.published_at, 'still gone', 6, d.failed_at + interval '1 second')::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SELECT idempotency.import_dead_letter((d.role, d.relay, d.topic, gen_random_uuid(), d.key, d.headers,
        d.payload, d.payload_raw, d.published_at, 'old', 1, now() - interval '8 days')::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SET ROLE regress_idem_xfer_app;
SELECT relay, topic, key, payload, headers, reason, attempts FROM idem_outbox_dead_letters('dlr');
RESET ROLE;
\set VERBOSITY terse
SELECT idempotency.import_dead_letter((d.role, d.relay, d.topic, d.event_id, d.key, d.headers,
        d.payload, d.payload_raw, d.published_at, d.reason, -1, d.failed_at)::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SELECT idempotency.import_dead_letter((d.role, d.relay, d.topic, d.event_id, d.key, d.headers,
        d.payload, d.payload_raw, d.published_at, d.reason, d.attempts, NULL)::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SELECT idempotency.import_dead_letter((d.role, '', d.topic, d.event_id, d.key, d.headers,
        d.payload, d.payload_raw, d.published_at, d.reason, d.attempts, d.failed_at)::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
SELECT idempotency.import_dead_letter((d.role, d.relay, d.topic, d.event_id, d.key, d.headers,
        d.payload, '\x00', d.published_at, d.reason, d.attempts, d.failed_at)::idempotency.dead_letter_record)
  FROM unnest(:'dead'::idempotency.dead_letter_record[]) d;
\set VERBOSITY default

\c :regress_db
DROP DATABASE outbox_xfer_src;
DROP DATABASE outbox_xfer_dst;
DROP ROLE regress_idem_xfer_app;
DROP ROLE regress_idem_xfer_other;
