--
-- The transactional outbox (0.5.0): idem_publish, idem_outbox_next,
-- idem_outbox_ack, dead letters, generations, per-role isolation,
-- segments dropped by maintenance, the loss past outbox_max_age
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- a batch as a relay sees it, without the ids and times that change per run
CREATE FUNCTION pg_temp.next(relay text, topic text, max_events int DEFAULT 100,
                             generation bigint DEFAULT NULL)
RETURNS TABLE (batch bigint, key text, payload jsonb, raw bytea, headers jsonb)
LANGUAGE sql AS $$
  SELECT n.batch, n.key, n.payload, n.payload_raw, n.headers
    FROM idem_outbox_next(relay, topic, max_events, generation) AS n
$$;

CREATE ROLE regress_idem_outbox_a;
CREATE ROLE regress_idem_outbox_b;
CREATE ROLE regress_idem_outbox_mon IN ROLE pg_monitor;
SET ROLE regress_idem_outbox_a;

-- ------------------------------------------------------------ publish
-- rollback: no event
BEGIN;
SELECT idem_publish('orders', '{"n": 0}') IS NOT NULL AS published;
ROLLBACK;
-- an event id is a UUID of version 7, different per event
SELECT count(DISTINCT id) AS ids,
       bool_and(substr(id::text, 15, 1) = '7') AS version_7
  FROM (SELECT idem_publish('orders', jsonb_build_object('n', i), 'order-' || (i % 2),
                            CASE WHEN i = 1 THEN '{"traceparent": "00-ab-cd-01"}'::jsonb END) AS id
          FROM generate_series(1, 3) AS i) AS s;
SELECT idem_publish('orders', NULL, NULL, NULL, '\x00ff'::bytea) IS NOT NULL AS raw;

-- bad input: the SQLSTATE, nothing written
SELECT pg_temp.try($$SELECT idem_publish(NULL)$$);
SELECT pg_temp.try($$SELECT idem_publish('')$$);
SELECT pg_temp.try($$SELECT idem_publish(repeat('t', 300))$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, NULL, '\x00')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', '')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '[1]')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '{"a": 1}')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '{"a": []}')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '{"a": {"b": "c"}}')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '{"a": "line\nbreak"}')$$);
SELECT pg_temp.try($$SELECT idem_publish('orders', '{}', NULL, '{"": "x"}')$$);
RESET ROLE;
SET idempotency.max_response_bytes = 1024;
SET ROLE regress_idem_outbox_a;
SELECT pg_temp.try($$SELECT idem_publish('orders', jsonb_build_object('x', repeat('x', 2000)))$$);
RESET ROLE;
RESET idempotency.max_response_bytes;
SET ROLE regress_idem_outbox_a;
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT idem_publish('orders')$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders')$$);
ROLLBACK;

-- ------------------------------------------------------------ relay
-- commit order; the same batch again until it is acknowledged
SELECT * FROM pg_temp.next('shipping', 'orders', 2);
SELECT * FROM pg_temp.next('shipping', 'orders', 2);
SELECT idem_outbox_ack('shipping', 'orders', 1);
-- acknowledged before: false, nothing changes
SELECT idem_outbox_ack('shipping', 'orders', 1);
-- not handed out yet
SELECT pg_temp.try($$SELECT idem_outbox_ack('shipping', 'orders', 2)$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('shipping', 'orders', 7)$$);
SELECT * FROM pg_temp.next('shipping', 'orders', 2);
SELECT idem_outbox_ack('shipping', 'orders', 2);
SELECT * FROM pg_temp.next('shipping', 'orders', 2);
-- another relay of the topic: its own position, from the first kept event
SELECT * FROM pg_temp.next('audit', 'orders', 10);
SELECT idem_outbox_ack('audit', 'orders', 1);
-- a relay never seen acknowledging
SELECT pg_temp.try($$SELECT idem_outbox_ack('nobody', 'orders', 1)$$);
-- bad input
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next(NULL, 'orders')$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', '')$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders', 0)$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders', 10, -1)$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('shipping', 'orders', NULL)$$);
-- a topic nobody published: no rows
SELECT * FROM pg_temp.next('shipping', 'nothing');

-- ------------------------------------------------------------ generations
SELECT idem_publish('fenced', '{"n": 1}') IS NOT NULL AS published;
SELECT * FROM pg_temp.next('r', 'fenced', 10, 3);
-- a lower generation: ID001, nothing changes; none at all once fenced: ID001
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('r', 'fenced', 10, 2)$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('r', 'fenced', 1, 2)$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('r', 'fenced', 1)$$);
-- a higher one takes over: the same batch (at-least-once), then the ack
SELECT * FROM pg_temp.next('r', 'fenced', 10, 4);
SELECT pg_temp.try($$SELECT idem_outbox_ack('r', 'fenced', 1, 3)$$);
SELECT idem_outbox_ack('r', 'fenced', 1, 4);

-- ------------------------------------------------------------ dead letters
SELECT idem_publish('hooks', '{"n": 1}', 'k') IS NOT NULL AS published;
SELECT idem_publish('hooks', '{"n": 2}', 'k') IS NOT NULL AS published;
SELECT count(*) FROM idem_outbox_next('webhook', 'hooks');
SELECT idem_outbox_dead_letter('webhook', 'hooks', n.event_id, 'HTTP 410', 5)
  FROM idem_outbox_next('webhook', 'hooks') AS n WHERE n.payload = '{"n": 2}';
-- again: the record is updated, not doubled
SELECT idem_outbox_dead_letter('webhook', 'hooks', n.event_id, 'HTTP 410 Gone', 6)
  FROM idem_outbox_next('webhook', 'hooks') AS n WHERE n.payload = '{"n": 2}';
SELECT pg_temp.try($$SELECT idem_outbox_dead_letter('webhook', 'hooks', '00000000-0000-7000-8000-000000000000')$$);
SELECT pg_temp.try($$SELECT idem_outbox_dead_letter('webhook', 'hooks', NULL)$$);
SELECT pg_temp.try($$SELECT idem_outbox_dead_letter('webhook', 'hooks', gen_random_uuid(), NULL, -1)$$);
SELECT idem_outbox_ack('webhook', 'hooks', 1);
SELECT relay, topic, key, payload, reason, attempts FROM idem_outbox_dead_letters();
SELECT relay, topic, batch, in_flight, lag_events, dead_letters, lost_events
  FROM idem_outbox_relays() ORDER BY relay, topic;
-- lag: published and not acknowledged
SELECT idem_publish('orders', '{"n": 9}') IS NOT NULL AS published;
SELECT relay, lag_events, lag_seconds >= 0 AS has_age
  FROM idem_outbox_relays() WHERE topic = 'orders' ORDER BY relay;

-- ------------------------------------------------------------ per role
SET ROLE regress_idem_outbox_b;
-- b's topic "orders" is not a's: nothing to read, no relay of a's seen
SELECT * FROM pg_temp.next('shipping', 'orders');
SELECT count(*) FROM idem_outbox_relays();
SELECT count(*) FROM idem_outbox_dead_letters();
SELECT idem_publish('orders', '{"b": 1}') IS NOT NULL AS published;
SELECT * FROM pg_temp.next('shipping', 'orders');
-- the storage is nobody's to read or write but through the functions
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_000001$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_relays$$);
SELECT pg_temp.try($$UPDATE idempotency.outbox_relays SET batch = 1$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_dead_letters$$);
SELECT pg_temp.try($$SELECT nextval('idempotency.outbox_event_seq')$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_relay_lag$$);
SELECT pg_temp.try($$SELECT * FROM idempotency.outbox_stats$$);
-- pg_monitor reads the views, never the events nor the positions
SET ROLE regress_idem_outbox_mon;
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_relay_lag$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_000001$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_relays$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_dead_letters$$);
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.outbox_segments$$);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders')$$);
SELECT count(*) FROM idem_outbox_relays();
SET ROLE regress_idem_outbox_a;
-- a's relay still where it was: b's event is not a's
SELECT relay, lag_events FROM idem_outbox_relays() WHERE topic = 'orders' ORDER BY relay;
RESET ROLE;
-- pg_monitor sees every role's relays, names and numbers only
SELECT role, relay, topic, batch, lag_events FROM idempotency.outbox_relay_lag
 ORDER BY role::text, relay, topic;

-- ------------------------------------------------------------ segments
-- a segment per interval (a quarter of the retention, at least 1 s); one
-- goes once every relay acknowledged it and the retention has passed
SET idempotency.outbox_retention = 1;
SELECT count(*) AS segments FROM idempotency.outbox_segments;
SELECT pg_sleep(1.1);
SELECT partitions_created >= 1 AS made FROM idem_maintain();
SELECT count(*) AS segments FROM idempotency.outbox_segments;
SELECT pg_sleep(1.1);
-- a's relays have not acknowledged the "n": 9 event, b's relay b's event:
-- the first segment stays
SELECT partitions_dropped FROM idem_maintain();
SET ROLE regress_idem_outbox_a;
SELECT * FROM pg_temp.next('shipping', 'orders');
SELECT idem_outbox_ack('shipping', 'orders', 3);
SELECT * FROM pg_temp.next('audit', 'orders');
SELECT idem_outbox_ack('audit', 'orders', 2);
SET ROLE regress_idem_outbox_b;
SELECT idem_outbox_ack('shipping', 'orders', 1);
RESET ROLE;
-- a segment this session itself reads is left for the next run, and the
-- run goes on (before, it failed: cannot DROP TABLE "outbox_..." because
-- it is being used by active queries in this session)
SELECT m.partitions_dropped, (SELECT count(*) FROM idempotency.outbox) > 0 AS read
  FROM idem_maintain() AS m;
SELECT count(*) AS segments FROM idempotency.outbox_segments;
SELECT partitions_dropped FROM idem_maintain();
SELECT count(*) AS segments FROM idempotency.outbox_segments;

-- past the max age, unacknowledged events go all the same: the relay's
-- next call says how many it lost (ID003), until it acknowledges the loss
SET ROLE regress_idem_outbox_a;
SELECT idem_publish('orders', '{"n": 10}') IS NOT NULL AS published;
SELECT idem_publish('orders', '{"n": 11}') IS NOT NULL AS published;
-- audit takes them as batch 3 and stops before acknowledging it
SELECT * FROM pg_temp.next('audit', 'orders');
RESET ROLE;
SET idempotency.outbox_max_age = 1;
SELECT pg_sleep(1.1);
SELECT partitions_created >= 1 AS made FROM idem_maintain();
-- the max age counts from the first run that finds the old segment written
-- by no transaction (not the run that made the next one)
SELECT partitions_dropped FROM idem_maintain();
SELECT count(*) AS found_quiet FROM idempotency.outbox_segments WHERE quiet_at IS NOT NULL;
SELECT pg_sleep(1.1);
SELECT partitions_dropped FROM idem_maintain();
SET ROLE regress_idem_outbox_a;
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('shipping', 'orders')$$);
SELECT relay, lost_events FROM idem_outbox_relays() WHERE topic = 'orders' ORDER BY relay;
SELECT idem_outbox_ack('shipping', 'orders', 4);
SELECT * FROM pg_temp.next('shipping', 'orders');
SELECT idem_publish('orders', '{"n": 12}') IS NOT NULL AS published;
SELECT * FROM pg_temp.next('shipping', 'orders');
-- audit's batch 3 went whole: no row could carry its number, so its next
-- call reports the loss as batch 3 (not an empty batch, for ever); the
-- acknowledgement moves it past the batch, and the loss is reported once
-- more, as batch 4, until that is acknowledged too
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('audit', 'orders')$$);
SELECT idem_outbox_ack('audit', 'orders', 3);
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('audit', 'orders')$$);
SELECT idem_outbox_ack('audit', 'orders', 4);
SELECT * FROM pg_temp.next('audit', 'orders');
RESET ROLE;
RESET idempotency.outbox_max_age;
RESET idempotency.outbox_retention;

-- ------------------------------------------------------------ dropped roles
-- A dropped role's relays and dead letters go at the next maintenance run:
-- rows are keyed by the role's OID, which a role made later can get again,
-- and would then start its relays from the dropped role's positions
-- (before, they stayed, and held back every segment they had not
-- acknowledged until outbox_max_age)
CREATE ROLE regress_idem_outbox_gone;
SET ROLE regress_idem_outbox_gone;
SELECT idem_publish('gone-topic', '{"n": 1}') IS NOT NULL AS published;
SELECT idem_outbox_dead_letter('gone-relay', 'gone-topic', n.event_id, 'HTTP 410')
  FROM idem_outbox_next('gone-relay', 'gone-topic') AS n;
RESET ROLE;
SELECT oid AS gone_oid FROM pg_roles WHERE rolname = 'regress_idem_outbox_gone' \gset
DROP ROLE regress_idem_outbox_gone;
SELECT (SELECT count(*) FROM idempotency.outbox_relays WHERE role::oid = :gone_oid) AS relays,
       (SELECT count(*) FROM idempotency.outbox_dead_letters WHERE role::oid = :gone_oid) AS dead_letters;
SELECT count(*) AS relays_before FROM idempotency.outbox_relays \gset
SELECT count(*) AS dead_letters_before FROM idempotency.outbox_dead_letters \gset
SELECT partitions_created >= 0 AS ran FROM idem_maintain();
SELECT (SELECT count(*) FROM idempotency.outbox_relays WHERE role::oid = :gone_oid) AS relays,
       (SELECT count(*) FROM idempotency.outbox_dead_letters WHERE role::oid = :gone_oid) AS dead_letters;
-- every other role's rows stay
SELECT (SELECT count(*) FROM idempotency.outbox_relays) = :relays_before - 1 AS relays_kept,
       (SELECT count(*) FROM idempotency.outbox_dead_letters) = :dead_letters_before - 1 AS dead_letters_kept;

-- ------------------------------------------------------------ relay locks
-- Each relay of a topic a transaction serves keeps a lock, in the lock
-- table every session shares, until the transaction ends: at most
-- max_locks_per_transaction of them (with its stream locks), the next one
-- refused with 53000 in this transaction only.  (Before, one role's open
-- transaction could take them without bound and fill the table: every
-- other session's next lock failed with 53200, out of shared memory.)
SELECT current_setting('max_locks_per_transaction')::int AS budget \gset
SET ROLE regress_idem_outbox_a;
BEGIN;
SELECT count(*) AS batches FROM generate_series(1, :budget) AS i,
  LATERAL idem_outbox_next('many-' || i, 'quiet-topic') AS n;
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('one-more', 'quiet-topic')$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('one-more', 'quiet-topic', 1)$$);
-- a relay it holds already is served again
SELECT count(*) AS batches FROM idem_outbox_next('many-1', 'quiet-topic');
ROLLBACK;
RESET ROLE;
-- the keys of the events a transaction publishes are bounded the same way,
-- apart from its relay and stream locks
SET ROLE regress_idem_outbox_a;
BEGIN;
SELECT count(*) = :budget AS all_published FROM generate_series(1, :budget) AS i,
  LATERAL idem_publish('quiet-topic', '{}', key => 'k' || i) AS p;
SELECT pg_temp.try($$SELECT idem_publish('quiet-topic', '{}', key => 'one more')$$);
SELECT idem_publish('quiet-topic', '{}', key => 'k1') IS NOT NULL AS same_key_again;
SELECT idem_publish('quiet-topic', '{}') IS NOT NULL AS no_key;
SELECT count(*) AS batches FROM idem_outbox_next('many-1', 'quiet-topic');
ROLLBACK;
RESET ROLE;

-- ------------------------------------------------------------ look-alikes
-- The outbox's statements run as the storage owner.  A role that puts
-- look-alike operators and tables first on its path (and in pg_temp), in a
-- new session where the statements are prepared for the first time, does
-- not change what they do: no look-alike runs, the right rows move.
CREATE SCHEMA regress_idem_evil AUTHORIZATION regress_idem_outbox_a;
\c -
SET ROLE regress_idem_outbox_a;
CREATE FUNCTION regress_idem_evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike text = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = text, rightarg = text, function = regress_idem_evil.eq);
CREATE FUNCTION regress_idem_evil.oideq(oid, oid) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike oid = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = oid, rightarg = oid, function = regress_idem_evil.oideq);
CREATE FUNCTION regress_idem_evil.int4eq(int4, int4) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike int4 = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = int4, rightarg = int4, function = regress_idem_evil.int4eq);
CREATE FUNCTION regress_idem_evil.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike nextval ran'; RETURN 1; END$$;
CREATE TABLE regress_idem_evil.outbox_relays (role regrole, relay text, topic text);
CREATE TABLE regress_idem_evil.outbox_segments (seg int, opened_at timestamptz);
CREATE TABLE regress_idem_evil.outbox_dead_letters (role regrole, relay text, topic text);
CREATE TEMP TABLE outbox_relays (LIKE regress_idem_evil.outbox_relays);
CREATE TEMP TABLE outbox_segments (LIKE regress_idem_evil.outbox_segments);
SET search_path = regress_idem_evil, pg_catalog;
SELECT idem_publish('evil', jsonb_build_object('n', 1)) IS NOT NULL AS published;
SELECT idem_publish('evil', jsonb_build_object('n', 2)) IS NOT NULL AS published;
SELECT batch, payload FROM idem_outbox_next('evil-relay', 'evil');
SELECT idem_outbox_dead_letter('evil-relay', 'evil', n.event_id, 'gone')
  FROM idem_outbox_next('evil-relay', 'evil') AS n WHERE n.payload = '{"n": 2}';
SELECT idem_outbox_ack('evil-relay', 'evil', 1);
SELECT batch, payload FROM idem_outbox_next('evil-relay', 'evil');
SELECT relay, topic, batch, lag_events, dead_letters FROM idem_outbox_relays() ORDER BY relay, topic;
SELECT relay, payload, reason FROM idem_outbox_dead_letters('evil-relay');
SELECT count(*) AS untouched FROM regress_idem_evil.outbox_relays;
SELECT count(*) AS untouched FROM pg_temp.outbox_segments;
RESET search_path;
RESET ROLE;
DROP SCHEMA regress_idem_evil CASCADE;

-- ------------------------------------------------------------ direct rows
-- A relay's position is read and written without SQL (src/keyed_rows.c,
-- as the stream positions): a DBA's change of its table's columns is
-- refused with 55000 and nothing is written, instead of values formed as
-- the old types; the relay goes on once the table is back.
ALTER TABLE idempotency.outbox_relays ALTER COLUMN batch TYPE numeric;
SET ROLE regress_idem_outbox_a;
SELECT batch, payload FROM idem_outbox_next('evil-relay', 'evil');
SELECT idem_outbox_ack('evil-relay', 'evil', 2);
RESET ROLE;
ALTER TABLE idempotency.outbox_relays ALTER COLUMN batch TYPE bigint;
SET ROLE regress_idem_outbox_a;
SELECT idem_publish('evil', jsonb_build_object('n', 3)) IS NOT NULL AS published;
SELECT batch, payload FROM idem_outbox_next('evil-relay', 'evil');
SELECT idem_outbox_ack('evil-relay', 'evil', 2);
SELECT relay, topic, batch FROM idem_outbox_relays() WHERE relay = 'evil-relay';
RESET ROLE;

-- ------------------------------------------------------------ cleanup
DROP EXTENSION idempotency;
SELECT count(*) FROM pg_class WHERE relname LIKE 'outbox%' AND relpersistence <> 't';
CREATE EXTENSION idempotency;
DROP OWNED BY regress_idem_outbox_a, regress_idem_outbox_b, regress_idem_outbox_mon;
DROP ROLE regress_idem_outbox_a;
DROP ROLE regress_idem_outbox_b;
DROP ROLE regress_idem_outbox_mon;
