/* idempotency--0.4.0--0.5.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- 0.5.0: the transactional outbox, expired keys remembered (see
-- CHANGELOG.md, "0.5.0").  Every existing call keeps its meaning.

-- 0.5.0: the transactional outbox (see src/outbox.h, doc/reference.md,
-- "The transactional outbox").  Events live in idempotency.outbox, a table
-- partitioned into segments that the first idem_publish() makes (as the
-- ledgers' tables: not a member of the extension, so pg_dump carries it
-- and its rows) and that maintenance drops; the tables below are members
-- whose rows pg_dump carries (pg_extension_config_dump).  All are reached
-- through the functions only and granted to nobody.

CREATE SEQUENCE idempotency.outbox_event_seq AS pg_catalog.int8 CACHE 1;

COMMENT ON SEQUENCE idempotency.outbox_event_seq IS
'event numbers of the outbox, taken in real-time order (not cached); managed by idem_publish()';

CREATE TABLE idempotency.outbox_segments (
    seg       pg_catalog.int4        PRIMARY KEY,
    opened_at pg_catalog.timestamptz NOT NULL,
    quiet_at  pg_catalog.timestamptz
);

COMMENT ON TABLE idempotency.outbox_segments IS
'when each segment (partition) of idempotency.outbox started taking events, and when maintenance first found it written by no transaction after it stopped (outbox_max_age counts from then); managed by maintenance';

CREATE TABLE idempotency.outbox_relays (
    role          pg_catalog.regrole     NOT NULL,
    relay         pg_catalog.text        NOT NULL,
    topic         pg_catalog.text        NOT NULL,
    generation    pg_catalog.int8,
    batch         pg_catalog.int8        NOT NULL,
    batch_end     pg_catalog.int8,
    batch_events  pg_catalog.int4        NOT NULL,
    acked_ev      pg_catalog.int8        NOT NULL,
    window_done   pg_catalog.bool        NOT NULL,
    lo_xmin       pg_catalog.int8        NOT NULL,
    lo_xmax       pg_catalog.int8        NOT NULL,
    lo_xip        pg_catalog.int8[]      NOT NULL,
    lo_floor      pg_catalog.int8[]      NOT NULL,
    lo_seq        pg_catalog.int8        NOT NULL,
    up_xmin       pg_catalog.int8        NOT NULL,
    up_xmax       pg_catalog.int8        NOT NULL,
    up_xip        pg_catalog.int8[]      NOT NULL,
    up_seq_before pg_catalog.int8        NOT NULL,
    up_seq_after  pg_catalog.int8        NOT NULL,
    up_at         pg_catalog.timestamptz,
    lost_events   pg_catalog.int8        NOT NULL,
    lost_first_ev pg_catalog.int8,
    lost_last_ev  pg_catalog.int8,
    lost_from     pg_catalog.timestamptz,
    lost_to       pg_catalog.timestamptz,
    created_at    pg_catalog.timestamptz NOT NULL,
    acked_at      pg_catalog.timestamptz,
    updated_at    pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (role, relay, topic)
);

COMMENT ON TABLE idempotency.outbox_relays IS
'each relay''s position per (role, relay, topic): the window between two snapshots it reads, its current batch and generation; managed by idem_outbox_next() and idem_outbox_ack()';

CREATE TABLE idempotency.outbox_dead_letters (
    role         pg_catalog.regrole     NOT NULL,
    relay        pg_catalog.text        NOT NULL,
    topic        pg_catalog.text        NOT NULL,
    event_id     pg_catalog.uuid        NOT NULL,
    key          pg_catalog.text,
    headers      pg_catalog.jsonb,
    payload      pg_catalog.jsonb,
    payload_raw  pg_catalog.bytea,
    published_at pg_catalog.timestamptz NOT NULL,
    reason       pg_catalog.text,
    attempts     pg_catalog.int4,
    failed_at    pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (role, relay, topic, event_id)
);

COMMENT ON TABLE idempotency.outbox_dead_letters IS
'events a relay gave up on, with a copy of each; managed by idem_outbox_dead_letter(), kept for idempotency.outbox_max_age';

CREATE TABLE idempotency.outbox_xid_base (
    one               pg_catalog.bool PRIMARY KEY DEFAULT true CHECK (one),
    system_identifier pg_catalog.int8 NOT NULL,
    base              pg_catalog.int8 NOT NULL,
    checked_xmin      pg_catalog.int8 NOT NULL DEFAULT 0
);

COMMENT ON TABLE idempotency.outbox_xid_base IS
'what the outbox adds to transaction ids: checked against the ones it stores, and raised if they are ahead, on first use after CREATE EXTENSION or a restore (this row is not dumped); written in place, never under a lock a caller holds';

-- the one row, made here so that no caller's transaction makes it (and
-- holds its index entry); checked and set in place on first use
INSERT INTO idempotency.outbox_xid_base (system_identifier, base, checked_xmin)
VALUES (0, 0, 0);

REVOKE ALL ON idempotency.outbox_event_seq, idempotency.outbox_segments,
              idempotency.outbox_relays, idempotency.outbox_dead_letters,
              idempotency.outbox_xid_base FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_event_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_segments', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_relays', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_dead_letters', '');

CREATE FUNCTION pg_catalog.idem_publish(topic text,
                                        payload jsonb DEFAULT NULL,
                                        key text DEFAULT NULL,
                                        headers jsonb DEFAULT NULL,
                                        payload_raw bytea DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'idem_publish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_publish(text, jsonb, text, jsonb, bytea) IS
'writes one event of the calling role''s topic in the caller''s transaction, and returns its event id';

CREATE FUNCTION pg_catalog.idem_outbox_next(relay text,
                                            topic text,
                                            max_events integer DEFAULT 100,
                                            generation bigint DEFAULT NULL)
RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
               payload_raw bytea, headers jsonb, published_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_next'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_next(text, text, integer, bigint) IS
'the relay''s current batch of committed events of the calling role''s topic, in commit order: the same again until acknowledged';

CREATE FUNCTION pg_catalog.idem_outbox_ack(relay text,
                                           topic text,
                                           batch bigint,
                                           generation bigint DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_ack(text, text, bigint, bigint) IS
'moves the relay past its current batch in the caller''s transaction: true, or false if that batch was acknowledged before';

CREATE FUNCTION pg_catalog.idem_outbox_dead_letter(relay text,
                                                   topic text,
                                                   event_id uuid,
                                                   reason text DEFAULT NULL,
                                                   attempts integer DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_dead_letter'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_dead_letter(text, text, uuid, text, integer) IS
'records that the relay gave up on one event of its current batch, with a copy of the event';

CREATE FUNCTION pg_catalog.idem_outbox_dead_letters(relay text DEFAULT NULL,
                                                    topic text DEFAULT NULL)
RETURNS TABLE (relay text, topic text, event_id uuid, key text,
               payload jsonb, payload_raw bytea, headers jsonb,
               published_at timestamptz, reason text, attempts integer,
               failed_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_dead_letters'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_dead_letters(text, text) IS
'the calling role''s dead letters, of one relay and topic or all';

CREATE FUNCTION pg_catalog.idem_outbox_relays()
RETURNS TABLE (relay text, topic text, generation bigint, batch bigint,
               in_flight integer, lag_events bigint,
               lag_seconds double precision, dead_letters bigint,
               lost_events bigint, acked_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_relays'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_relays() IS
'the calling role''s relays: batch, lag in events and seconds, dead letters and lost events';

CREATE FUNCTION idempotency.outbox_relay_info()
RETURNS TABLE (role regrole, relay text, topic text, generation bigint,
               batch bigint, in_flight integer, lag_events bigint,
               lag_seconds double precision, dead_letters bigint,
               lost_events bigint, acked_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_relay_info'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

REVOKE ALL ON FUNCTION idempotency.outbox_relay_info() FROM PUBLIC;

CREATE VIEW idempotency.outbox_relay_lag AS
SELECT r.role, r.relay, r.topic, r.generation, r.batch, r.in_flight,
       r.lag_events, r.lag_seconds, r.dead_letters, r.lost_events,
       r.acked_at
  FROM idempotency.outbox_relay_info() AS r;

COMMENT ON VIEW idempotency.outbox_relay_lag IS
'every role''s outbox relays: batch, lag in events and seconds, dead letters and lost events';

CREATE FUNCTION idempotency.outbox_stats_info(OUT events_published bigint,
                                              OUT events_relayed bigint,
                                              OUT dead_letters bigint,
                                              OUT events_lost bigint,
                                              OUT segments_created bigint,
                                              OUT segments_dropped bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_outbox_stats_info'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

REVOKE ALL ON FUNCTION idempotency.outbox_stats_info() FROM PUBLIC;

CREATE VIEW idempotency.outbox_stats AS
SELECT s.events_published, s.events_relayed, s.dead_letters,
       s.events_lost, s.segments_created, s.segments_dropped
  FROM idempotency.outbox_stats_info() AS s;

COMMENT ON VIEW idempotency.outbox_stats IS
'the outbox''s counters of the current database since server start or idempotency.stats_reset() (needs shared_preload_libraries)';

GRANT SELECT ON idempotency.outbox_relay_lag, idempotency.outbox_stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION idempotency.outbox_relay_info(),
                          idempotency.outbox_stats_info() TO pg_monitor;

-- What default privileges gave the outbox's tables and sequences beyond
-- the above: taken back (they hold every role's events and positions).
DO $outbox_privileges$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT c.oid::pg_catalog.regclass AS name, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
          FROM pg_catalog.pg_class AS c,
               pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_event_seq',
                   'outbox_segments', 'outbox_relays',
                   'outbox_dead_letters', 'outbox_xid_base']::pg_catalog.name[])
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE',
                                  item.privilege_type, item.name, item.grantee);
    END LOOP;
END
$outbox_privileges$;
-- 0.5.0: expired keys remembered (idempotency.key_memory; the memory's
-- tables are made on first use by maintenance, like the ledgers)
COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409), mismatch (422) or expired (410: remembered after its ttl, idempotency.key_memory)';

COMMENT ON FUNCTION pg_catalog.idem_lookup(text, text) IS
'the calling role''s own live record of one idempotency key, for support work (status expired: remembered after its ttl)';

-- 0.5.0: outbox export and import (a tenant move takes its unrelayed
-- events and its relays along; see src/outbox_transfer.c, doc/reference.md,
-- "Moving tenants between nodes"), and the export manifest.

CREATE TYPE idempotency.event_record AS (
    role         name,
    topic        text,
    ord          bigint,
    event_id     uuid,
    key          text,
    headers      jsonb,
    payload      jsonb,
    payload_raw  bytea,
    published_at timestamptz,
    delivered_by text[]
);

COMMENT ON TYPE idempotency.event_record IS
'one outbox event as idempotency.export_events() gives it and idempotency.import_event() takes it: import in ord order';

CREATE TYPE idempotency.relay_record AS (
    role          name,
    relay         text,
    topic         text,
    generation    bigint,
    batch         bigint,
    lost_events   bigint,
    lost_first_ev bigint,
    lost_last_ev  bigint,
    lost_from     timestamptz,
    lost_to       timestamptz,
    created_at    timestamptz,
    acked_at      timestamptz
);

COMMENT ON TYPE idempotency.relay_record IS
'one outbox relay as idempotency.export_relays() gives it and idempotency.import_relay() takes it';

CREATE FUNCTION idempotency.export_events(topics text[] DEFAULT NULL)
RETURNS SETOF idempotency.event_record
AS 'MODULE_PATHNAME', 'idem_export_events'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_events(text[]) IS
'the outbox events of the given topics (all if NULL), of every role, that a relay of their topic has not acknowledged, for idempotency.import_event() on another node';

CREATE FUNCTION idempotency.import_event(e record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_event'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_event(record) IS
'writes an exported outbox event with its event id unless this node has it already: inserted or kept';

CREATE FUNCTION idempotency.export_relays(topics text[] DEFAULT NULL)
RETURNS SETOF idempotency.relay_record
AS 'MODULE_PATHNAME', 'idem_export_relays'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_relays(text[]) IS
'the outbox relays of the given topics (all if NULL), of every role, for idempotency.import_relay() on another node';

CREATE FUNCTION idempotency.import_relay(r record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_relay'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_relay(record) IS
'takes an exported outbox relay (before its topic''s events, in their transaction): inserted, replaced or kept';

CREATE TYPE idempotency.dead_letter_record AS (
    role         name,
    relay        text,
    topic        text,
    event_id     uuid,
    key          text,
    headers      jsonb,
    payload      jsonb,
    payload_raw  bytea,
    published_at timestamptz,
    reason       text,
    attempts     integer,
    failed_at    timestamptz
);

COMMENT ON TYPE idempotency.dead_letter_record IS
'one dead letter of an outbox relay as idempotency.export_dead_letters() gives it and idempotency.import_dead_letter() takes it';

CREATE FUNCTION idempotency.export_dead_letters(topics text[] DEFAULT NULL)
RETURNS SETOF idempotency.dead_letter_record
AS 'MODULE_PATHNAME', 'idem_export_dead_letters'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_dead_letters(text[]) IS
'the dead letters of the outbox relays of the given topics (all if NULL), of every role, for idempotency.import_dead_letter() on another node';

CREATE FUNCTION idempotency.import_dead_letter(d record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_dead_letter'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_dead_letter(record) IS
'stores an exported dead letter unless this node has one of the same relay and event that failed as late: inserted, replaced, kept or expired';

REVOKE ALL ON FUNCTION idempotency.export_dead_letters(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_dead_letter(record) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.export_events(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_event(record) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.export_relays(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_relay(record) FROM PUBLIC;

-- What an export holds, part by part, in the order to import them: a
-- mover keeps these rows with the exported ones, and the importing node's
-- own manifest says whether it takes that format and each part.  Format
-- 2 is 0.5.0's; the exports of 0.3.0 and 0.4.0 (format 1: keys, messages,
-- and since 0.4.0 positions and sequences) had no manifest and import as
-- before.  key_memory is a slot: the memory of expired keys is not
-- exported yet.
CREATE FUNCTION idempotency.export_manifest()
RETURNS TABLE (format integer, part text, record_type regtype,
               export_function regprocedure, import_function regprocedure,
               import_order integer)
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $manifest$
SELECT 2, m.part, m.record_type::pg_catalog.regtype,
       m.export_function::pg_catalog.regprocedure,
       m.import_function::pg_catalog.regprocedure, m.import_order
  FROM (VALUES
        ('keys', 'idempotency.key_record', 'idempotency.export_keys(text[])',
         'idempotency.import_key(record)', 1),
        ('messages', 'idempotency.message_record', 'idempotency.export_messages(text[])',
         'idempotency.import_message(record)', 2),
        ('positions', 'idempotency.position_record', 'idempotency.export_positions(text[])',
         'idempotency.import_position(record)', 3),
        ('sequences', 'idempotency.sequence_record', 'idempotency.export_sequences(text[])',
         'idempotency.import_sequence(record)', 4),
        ('outbox_relays', 'idempotency.relay_record', 'idempotency.export_relays(text[])',
         'idempotency.import_relay(record)', 5),
        ('outbox_events', 'idempotency.event_record', 'idempotency.export_events(text[])',
         'idempotency.import_event(record)', 6),
        ('outbox_dead_letters', 'idempotency.dead_letter_record',
         'idempotency.export_dead_letters(text[])', 'idempotency.import_dead_letter(record)', 7),
        ('key_memory', NULL, NULL, NULL, 8))
       AS m(part, record_type, export_function, import_function, import_order)
 ORDER BY m.import_order
$manifest$;

COMMENT ON FUNCTION idempotency.export_manifest() IS
'what an export of this version holds (format 2): each part, its record type, its export and import functions, in the order to import them; key_memory is a slot not exported yet';
