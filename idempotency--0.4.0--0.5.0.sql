/* idempotency--0.4.0--0.5.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- 0.5.0: the transactional outbox, expired keys remembered, ledgers
-- distributed by Citus (see CHANGELOG.md, "0.5.0").  Every existing call
-- keeps its meaning.

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
-- before.  key_memory is a slot here, filled by the section "moving the
-- key memory with a tenant" below.
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

-- 0.5.0: ledgers distributed by Citus (issue 37; src/citus.h,
-- doc/scale-out.md, "Citus' own shard operations").
-- idempotency.citus_distribute() distributes both ledgers by a new last
-- column "tenant", co-located with the application's tables, so that
-- Citus' rebalancer, moves, splits and tenant isolation carry the dedup
-- records with the tenant's rows; the C path then writes each row into
-- the local shard of its tenant.  idem_consume_message() and
-- idem_consume_messages() take that tenant (ignored while the message
-- ledger is not distributed) in overloads of their own, with four
-- arguments and no default: 0.4.0's three-argument functions stay as they
-- are, because a call that leaves out a defaulted argument makes the
-- parser read the function's defaults on every call (a second default
-- cost about 5,000 instructions a consume, test/t/090_instructions.pl).
-- A call that names the tenant passes ttl too (ttl => NULL).
CREATE FUNCTION pg_catalog.idem_consume_message(consumer text,
                                                message_id text,
                                                ttl interval,
                                                tenant text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume_message'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_consume_message(text, text, interval, text) IS
'records a message as consumed in this transaction: true on first delivery, false if already consumed (tenant: the shard of a message ledger distributed by Citus)';

CREATE FUNCTION pg_catalog.idem_consume_messages(consumer text,
                                                 message_ids text[],
                                                 ttl interval,
                                                 tenant text)
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'idem_consume_messages'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION pg_catalog.idem_consume_messages(text, text[], interval, text) IS
'records a batch of messages as consumed in this transaction and returns the new ones, in input order (tenant: the shard of a message ledger distributed by Citus)';

-- Each overload gets exactly the privileges of its three-argument sibling
-- (what default privileges gave it is taken back first).
DO $citus_privileges$
DECLARE
    o record;
    item record;
BEGIN
    FOR o IN
        SELECT n.oid::pg_catalog.regprocedure AS name, n.proacl AS newacl,
               d.proacl AS oldacl, n.proowner AS owner
          FROM (VALUES
                ('pg_catalog.idem_consume_message(text,text,interval,text)'::pg_catalog.regprocedure::pg_catalog.oid,
                 'pg_catalog.idem_consume_message(text,text,interval)'::pg_catalog.regprocedure::pg_catalog.oid),
                ('pg_catalog.idem_consume_messages(text,text[],interval,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_consume_messages(text,text[],interval)'::pg_catalog.regprocedure))
               AS f (newobj, oldobj)
          JOIN pg_catalog.pg_proc AS n ON n.oid OPERATOR(pg_catalog.=) f.newobj
          JOIN pg_catalog.pg_proc AS d ON d.oid OPERATOR(pg_catalog.=) f.oldobj
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', o.name);
        FOR item IN
            SELECT a.grantee
              FROM pg_catalog.aclexplode(o.newacl) AS a
             WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
               AND a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %I CASCADE', o.name,
                                      pg_catalog.pg_get_userbyid(item.grantee));
        END LOOP;
        IF o.oldacl IS NULL THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', o.name);
        ELSE
            FOR item IN
                SELECT a.grantee, a.privilege_type, a.is_grantable
                  FROM pg_catalog.aclexplode(o.oldacl) AS a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
            LOOP
                EXECUTE pg_catalog.format('GRANT %s ON FUNCTION %s TO %s%s',
                                          item.privilege_type, o.name,
                                          CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                               ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
                                          CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$citus_privileges$;

-- Run once, on the Citus coordinator, as the owner of schema idempotency
-- (or a superuser), after the tenant's tables are distributed and before
-- the first call.  Runs with the caller's privileges: it only does what
-- the caller could do by hand.
CREATE FUNCTION idempotency.citus_distribute(colocate_with regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $citus_distribute$
DECLARE
    attempt integer;
    messages text;
    dist_column text;
    tenant_type text;
    ledger text;
    part record;
    worker record;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NULL
       OR pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NULL THEN
        RAISE EXCEPTION 'Citus is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = 'Run CREATE EXTENSION citus, and idempotency.citus_distribute() on the coordinator.';
    END IF;
    IF (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'idempotency.citus_distribute() must run on the Citus coordinator'
            USING ERRCODE = '55000';
    END IF;
    EXECUTE 'SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
               FROM pg_catalog.pg_dist_partition AS p
              WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1
                AND p.partmethod OPERATOR(pg_catalog.=) ''h'''
       INTO dist_column USING colocate_with;
    IF dist_column IS NULL THEN
        RAISE EXCEPTION 'table % is not distributed by hash', colocate_with
            USING ERRCODE = '22023',
                  HINT = 'Name a table distributed with create_distributed_table(), by its tenant.';
    END IF;
    SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) ||
           CASE WHEN a.attcollation OPERATOR(pg_catalog.<>) 0
                     AND a.attcollation OPERATOR(pg_catalog.<>) t.typcollation
                THEN ' COLLATE ' || (SELECT pg_catalog.format('%I.%I', cn.nspname, c.collname)
                                       FROM pg_catalog.pg_collation AS c
                                       JOIN pg_catalog.pg_namespace AS cn
                                         ON cn.oid OPERATOR(pg_catalog.=) c.collnamespace
                                      WHERE c.oid OPERATOR(pg_catalog.=) a.attcollation)
                ELSE '' END
      INTO tenant_type
      FROM pg_catalog.pg_attribute AS a
      JOIN pg_catalog.pg_type AS t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
     WHERE a.attrelid OPERATOR(pg_catalog.=) colocate_with
       AND a.attname OPERATOR(pg_catalog.=) dist_column;

    -- the ledgers' tables and partitions, made here if missing; a run of
    -- the background worker's maintenance in progress (idem_maintain()
    -- then does nothing) is waited for, up to a minute
    -- (its "already running" notice said once)
    messages := pg_catalog.current_setting('client_min_messages');
    FOR attempt IN 1..600 LOOP
        PERFORM pg_catalog.idem_maintain();
        EXIT WHEN pg_catalog.to_regclass('idempotency.keys') IS NOT NULL
              AND pg_catalog.to_regclass('idempotency.messages') IS NOT NULL;
        PERFORM pg_catalog.set_config('client_min_messages', 'warning', true);
        PERFORM pg_catalog.pg_sleep(0.1);
    END LOOP;
    PERFORM pg_catalog.set_config('client_min_messages', messages, true);
    IF pg_catalog.to_regclass('idempotency.keys') IS NULL
       OR pg_catalog.to_regclass('idempotency.messages') IS NULL THEN
        RAISE EXCEPTION 'the ledgers of this database could not be made'
            USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_attribute AS a
                WHERE a.attrelid OPERATOR(pg_catalog.=) ANY
                      (ARRAY['idempotency.keys'::pg_catalog.regclass, 'idempotency.messages'::pg_catalog.regclass])
                  AND a.attname OPERATOR(pg_catalog.=) 'tenant' AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'the ledgers are distributed already'
            USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT FROM idempotency.keys) OR EXISTS (SELECT FROM idempotency.messages) THEN
        RAISE EXCEPTION 'the ledgers of this node have rows'
            USING ERRCODE = '55000',
                  DETAIL = 'Only empty ledgers are distributed: a row does not say its tenant.',
                  HINT = 'Distribute the ledgers before the first call, or once the rows have expired.';
    END IF;
    -- the tenant positions and sequences start empty too: one written
    -- before, with or without a tenant, is in the node's own
    -- idempotency.positions or sequences, which a tenant call no longer
    -- reads once they are distributed
    IF pg_catalog.to_regclass('idempotency.tenant_positions') IS NOT NULL
       OR pg_catalog.to_regclass('idempotency.tenant_sequences') IS NOT NULL THEN
        RAISE EXCEPTION 'the stream positions are distributed already'
            USING ERRCODE = '55000';
    END IF;
    -- held to the commit: a call writing a position or a sequence now
    -- (with a tenant or without) is waited for, and its row refused below;
    -- a tenant call that comes meanwhile waits, and then finds the tenant
    -- tables (src/streams.c, IdemStreamRoute)
    LOCK TABLE idempotency.positions, idempotency.sequences IN SHARE MODE;
    IF EXISTS (SELECT FROM idempotency.positions) OR EXISTS (SELECT FROM idempotency.sequences) THEN
        RAISE EXCEPTION 'the stream positions of this node have rows'
            USING ERRCODE = '55000',
                  DETAIL = 'A position in idempotency.positions or a sequence in idempotency.sequences does not say its tenant, and a call that names its tenant would not read it once they are distributed.',
                  HINT = 'Distribute before the first call, or once the positions and sequences are unused for idempotency.position_ttl.';
    END IF;
    FOR worker IN
        EXECUTE 'SELECT w.nodename, w.nodeport
                   FROM pg_catalog.run_command_on_workers(
                        ''SELECT pg_catalog.to_regclass(''''idempotency.keys'''') IS NOT NULL
                              OR pg_catalog.to_regclass(''''idempotency.messages'''') IS NOT NULL'') AS w
                  WHERE NOT w.success OR w.result OPERATOR(pg_catalog.<>) ''f'''
    LOOP
        RAISE EXCEPTION 'worker %:% has ledgers of its own', worker.nodename, worker.nodeport
            USING ERRCODE = '55000',
                  DETAIL = 'Its idempotency.keys or idempotency.messages would stand in the way of the distributed ledgers.',
                  HINT = 'Drop them on that worker once its rows have expired or moved, then distribute.';
    END LOOP;
    FOR worker IN
        EXECUTE 'SELECT w.nodename, w.nodeport
                   FROM pg_catalog.run_command_on_workers(
                        ''SELECT EXISTS (SELECT FROM idempotency.positions)
                              OR EXISTS (SELECT FROM idempotency.sequences)'') AS w
                  WHERE NOT w.success OR w.result OPERATOR(pg_catalog.<>) ''f'''
    LOOP
        RAISE EXCEPTION 'the stream positions of worker %:% have rows', worker.nodename, worker.nodeport
            USING ERRCODE = '55000',
                  DETAIL = 'A position in idempotency.positions or a sequence in idempotency.sequences does not say its tenant, and a call that names its tenant would not read it once they are distributed.',
                  HINT = 'Distribute before the first call, or once the positions and sequences are unused for idempotency.position_ttl.';
    END LOOP;

    -- role_ref: the role column of every table distributed here is an
    -- idempotency.role_ref, which Citus' shard moves and splits copy by
    -- the role's name (a regrole goes as the source node's OID of the
    -- role, another role's or none on the target; src/role_ref.c): the
    -- ledgers' changed here, before they are distributed; the tables made
    -- below are made with it
    FOREACH ledger IN ARRAY ARRAY['keys', 'messages'] LOOP
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I ALTER COLUMN role TYPE idempotency.role_ref
                                       USING role::pg_catalog.oid::idempotency.role_ref', ledger);
    END LOOP;

    FOREACH ledger IN ARRAY ARRAY['keys', 'messages'] LOOP
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I ADD COLUMN tenant %s NOT NULL',
                                  ledger, tenant_type);
        -- the replica identity of each partition (also made so later by
        -- maintenance): it has the distribution column, so a split routes
        -- every change, and a logical move finds rows by an index
        EXECUTE pg_catalog.format('CREATE UNIQUE INDEX %I ON idempotency.%I (role, digest, lane, expires_at, tenant)',
                                  ledger || '_identity_idx', ledger);
        -- it also serves probes, by its first two columns: the (role,
        -- digest) index goes (one index entry fewer per row written)
        FOR part IN
            SELECT i.indexrelid::pg_catalog.regclass AS idx
              FROM pg_catalog.pg_index AS i
             WHERE i.indrelid OPERATOR(pg_catalog.=)
                   pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger))
               AND i.indnatts OPERATOR(pg_catalog.=) 2
               AND i.indkey[0] OPERATOR(pg_catalog.=) 3
               AND i.indkey[1] OPERATOR(pg_catalog.=) 2
        LOOP
            EXECUTE pg_catalog.format('DROP INDEX %s', part.idx);
        END LOOP;
        FOR part IN
            SELECT i.indrelid::pg_catalog.regclass AS rel, c.relname AS idx
              FROM pg_catalog.pg_inherits AS h
              JOIN pg_catalog.pg_index AS i ON i.indexrelid OPERATOR(pg_catalog.=) h.inhrelid
              JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
             WHERE h.inhparent OPERATOR(pg_catalog.=)
                   pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger || '_identity_idx'))
        LOOP
            EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY USING INDEX %I',
                                      part.rel, part.idx);
        END LOOP;
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
          USING pg_catalog.format('idempotency.%I', ledger), colocate_with::pg_catalog.text;
    END LOOP;

    -- The stream positions of the calls that name their tenant
    -- (idem_assign(), idem_advance(), idem_positions(); src/streams.c): a
    -- table of their own, not a member of the extension (Citus leaves the
    -- shell of a member table to CREATE EXTENSION on each node, which
    -- would make it without the tenant column), owned like the ledgers by
    -- the owner of schema idempotency and granted to nobody.  The tenant
    -- is the fifth column, so that the primary key, which must contain
    -- the distribution column, is the first five.
    EXECUTE pg_catalog.format(
        'CREATE TABLE idempotency.tenant_positions (
             role        idempotency.role_ref  NOT NULL,
             consumer    pg_catalog.text        NOT NULL,
             stream      pg_catalog.text        NOT NULL,
             part        pg_catalog.int4        NOT NULL,
             tenant      %s NOT NULL,
             next_offset pg_catalog.int8,
             generation  pg_catalog.int8,
             updated_at  pg_catalog.timestamptz NOT NULL,
             PRIMARY KEY (role, consumer, stream, part, tenant))', tenant_type);
    REVOKE ALL ON idempotency.tenant_positions FROM PUBLIC;
    EXECUTE pg_catalog.format('ALTER TABLE idempotency.tenant_positions OWNER TO %I',
                              (SELECT pg_catalog.pg_get_userbyid(n.nspowner)
                                 FROM pg_catalog.pg_namespace AS n
                                WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'));
    COMMENT ON TABLE idempotency.tenant_positions IS
        'the stream positions of the calls that name their tenant, distributed by Citus with the tenant''s rows (idempotency.citus_distribute())';
    EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
      USING 'idempotency.tenant_positions', colocate_with::pg_catalog.text;

    -- The producer sequences of the calls that name their tenant
    -- (idem_sequence(..., tenant)), likewise: "tenant" fourth, after the
    -- columns of the key of idempotency.sequences.
    EXECUTE pg_catalog.format(
        'CREATE TABLE idempotency.tenant_sequences (
             role       idempotency.role_ref  NOT NULL,
             consumer   pg_catalog.text        NOT NULL,
             producer   pg_catalog.text        NOT NULL,
             tenant     %s NOT NULL,
             epoch      pg_catalog.int8        NOT NULL,
             seq        pg_catalog.int8        NOT NULL,
             updated_at pg_catalog.timestamptz NOT NULL,
             PRIMARY KEY (role, consumer, producer, tenant))', tenant_type);
    REVOKE ALL ON idempotency.tenant_sequences FROM PUBLIC;
    EXECUTE pg_catalog.format('ALTER TABLE idempotency.tenant_sequences OWNER TO %I',
                              (SELECT pg_catalog.pg_get_userbyid(n.nspowner)
                                 FROM pg_catalog.pg_namespace AS n
                                WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'));
    COMMENT ON TABLE idempotency.tenant_sequences IS
        'the producer sequences of the calls that name their tenant, distributed by Citus with the tenant''s rows (idempotency.citus_distribute())';
    EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
      USING 'idempotency.tenant_sequences', colocate_with::pg_catalog.text;

    -- The outbox of the calls that name their tenant
    -- (idem_publish(..., tenant); src/outbox_tenant.c, doc/scale-out.md,
    -- "The outbox of a tenant"), distributed likewise so that Citus' shard
    -- operations carry a tenant's unrelayed events: the head of each
    -- (role, topic, tenant), whose row a publisher updates and keeps locked
    -- to its commit (so a tenant's events of a topic are numbered densely,
    -- in commit order), and the events, partitioned by the time they were
    -- published (maintenance on the coordinator makes and drops the
    -- partitions; the primary key of each is its replica identity).  The
    -- node's own idempotency.outbox is not looked at: it stays each node's
    -- own, read by the relays without a tenant.
    EXECUTE pg_catalog.format(
        'CREATE TABLE idempotency.tenant_outbox_heads (
             role       idempotency.role_ref  NOT NULL,
             topic      pg_catalog.text        NOT NULL,
             tenant     %s NOT NULL,
             last_seq   pg_catalog.int8        NOT NULL,
             updated_at pg_catalog.timestamptz NOT NULL,
             PRIMARY KEY (role, topic, tenant))', tenant_type);
    EXECUTE pg_catalog.format(
        'CREATE TABLE idempotency.tenant_events (
             role         idempotency.role_ref  NOT NULL,
             topic        pg_catalog.text        NOT NULL,
             tenant       %s NOT NULL,
             seq          pg_catalog.int8        NOT NULL,
             event_id     pg_catalog.uuid        NOT NULL,
             key          pg_catalog.text,
             payload      pg_catalog.jsonb,
             payload_raw  pg_catalog.bytea,
             headers      pg_catalog.jsonb,
             published_at pg_catalog.timestamptz NOT NULL,
             PRIMARY KEY (role, topic, tenant, seq, published_at))
         PARTITION BY RANGE (published_at)', tenant_type);
    -- the relays' positions: on the coordinator only (the relay connects
    -- to it), per relay and per tenant; the sequence numbers travel with
    -- the events, so a move changes nothing here.  Neither they nor the
    -- functions below are sent to the workers (Citus would propagate the
    -- functions).
    messages := pg_catalog.current_setting('citus.enable_ddl_propagation');
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', 'off', true);
    CREATE TABLE idempotency.tenant_relays (
        role          pg_catalog.regrole     NOT NULL,
        relay         pg_catalog.text        NOT NULL,
        topic         pg_catalog.text        NOT NULL,
        batch         pg_catalog.int8        NOT NULL,
        handed_out    pg_catalog.bool        NOT NULL,
        tenant_filter pg_catalog.text,
        every_tenant  pg_catalog.bool        NOT NULL,
        generation    pg_catalog.int8,
        acked_at      pg_catalog.timestamptz,
        updated_at    pg_catalog.timestamptz NOT NULL,
        PRIMARY KEY (role, relay, topic));
    CREATE TABLE idempotency.tenant_relay_positions (
        role        pg_catalog.regrole     NOT NULL,
        relay       pg_catalog.text        NOT NULL,
        topic       pg_catalog.text        NOT NULL,
        tenant      pg_catalog.text        NOT NULL,
        acked_seq   pg_catalog.int8,
        batch_end   pg_catalog.int8,
        lost_first  pg_catalog.int8,
        lost_last   pg_catalog.int8,
        lost_events pg_catalog.int8,
        lost_from   pg_catalog.timestamptz,
        lost_to     pg_catalog.timestamptz,
        lost_acked  pg_catalog.int8,
        PRIMARY KEY (role, relay, topic, tenant));
    CREATE TABLE idempotency.tenant_event_partitions (
        partition   pg_catalog.name        PRIMARY KEY,
        lower_bound pg_catalog.timestamptz NOT NULL,
        upper_bound pg_catalog.timestamptz NOT NULL);

    -- What the relays and maintenance run on the coordinator, as the owner
    -- of schema idempotency (src/outbox_tenant.c calls them with the
    -- calling role's OID; granted to nobody): made here, with the tenant's
    -- type, like the tables they read.
    EXECUTE pg_catalog.format($fn$
CREATE FUNCTION idempotency.tenant_outbox_next(p_role pg_catalog.regrole, p_relay pg_catalog.text,
                                               p_topic pg_catalog.text, p_max pg_catalog.int4,
                                               p_generation pg_catalog.int8, p_tenant pg_catalog.text)
RETURNS TABLE (batch pg_catalog.int8, event_id pg_catalog.uuid, key pg_catalog.text,
               payload pg_catalog.jsonb, payload_raw pg_catalog.bytea, headers pg_catalog.jsonb,
               published_at pg_catalog.timestamptz, tenant pg_catalog.text, seq pg_catalog.int8)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
#variable_conflict use_column
DECLARE
    r idempotency.tenant_relays;
    filt %1$s;
    -- the heads read
    names pg_catalog.text[] := '{}';
    heads pg_catalog.int8[] := '{}';
    -- ranges (a, z] of numbers, per tenant t: $3, $4, $5 of in_ranges
    rt pg_catalog.text[];
    ra pg_catalog.int8[];
    rz pg_catalog.int8[];
    first_t pg_catalog.text[] := '{}';
    first_s pg_catalog.int8[] := '{}';
    counts pg_catalog.int8[];
    g record;
    fresh boolean := false;
    expected pg_catalog.int8;
    got pg_catalog.int8;
    lvl pg_catalog.int8;
    lvl_hi pg_catalog.int8;
    mid pg_catalog.int8;
    spare pg_catalog.int8;
    -- The events of (role, topic) in ranges of numbers, one per tenant
    -- ($3, $4, $5: (a, z] for tenant t), read by the index of each
    -- partition of the tenants' shards (its primary key's first columns:
    -- role, topic, tenant, seq): a nested loop over the ranges, or, for
    -- a range of many tenants, one scan of the index for the tenants'
    -- array between the lowest start and the highest end ($6, $7) joined
    -- with the ranges; the tenants' array lets Citus send it only to the
    -- shards holding them.
    in_ranges constant pg_catalog.text :=
        ' FROM ROWS FROM (pg_catalog.unnest($3::pg_catalog.text[]), pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[])) AS b(t, a, z)
          JOIN idempotency.tenant_events AS e
            ON e.tenant OPERATOR(pg_catalog.=) b.t::%1$s
           AND e.seq OPERATOR(pg_catalog.>) b.a AND e.seq OPERATOR(pg_catalog.<=) b.z
         WHERE e.role OPERATOR(pg_catalog.=) pg_catalog.to_regrole($1) AND e.topic OPERATOR(pg_catalog.=) $2
           AND e.tenant OPERATOR(pg_catalog.=) ANY ($3::%1$s[])
           AND e.seq OPERATOR(pg_catalog.>) $6 AND e.seq OPERATOR(pg_catalog.<=) $7';
BEGIN
    IF p_tenant IS NOT NULL THEN
        filt := p_tenant::%1$s;
        p_tenant := filt::pg_catalog.text;
    END IF;
    -- a relay's row, and the tenants it reads: maintenance keeps their
    -- events for it (every tenant's for a relay called without one)
    INSERT INTO idempotency.tenant_relays AS x (role, relay, topic, batch, handed_out, every_tenant, updated_at)
    VALUES (p_role, p_relay, p_topic, 1, false, p_tenant IS NULL, pg_catalog.now())
    ON CONFLICT (role, relay, topic) DO UPDATE SET every_tenant = true
     WHERE p_tenant IS NULL AND NOT x.every_tenant;
    IF p_tenant IS NOT NULL THEN
        INSERT INTO idempotency.tenant_relay_positions AS p (role, relay, topic, tenant)
        VALUES (p_role, p_relay, p_topic, p_tenant)
        ON CONFLICT (role, relay, topic, tenant) DO NOTHING;
    END IF;
    SELECT x.* INTO r FROM idempotency.tenant_relays AS x
     WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
       AND x.topic OPERATOR(pg_catalog.=) p_topic
       FOR UPDATE;
    PERFORM idempotency.tenant_outbox_fence(r, p_generation);
    IF r.handed_out AND r.tenant_filter IS DISTINCT FROM p_tenant THEN
        RAISE EXCEPTION 'relay "%%" of topic "%%" has a batch of %% handed out', p_relay, p_topic,
                        COALESCE('tenant ' OPERATOR(pg_catalog.||) r.tenant_filter, 'every tenant')
            USING ERRCODE = '55000',
                  HINT = 'Acknowledge it with the same tenant argument first.';
    END IF;
    IF NOT r.handed_out THEN
        PERFORM idempotency.tenant_outbox_report_loss(r);
        -- The heads of the role's topic, one row per tenant (by the index
        -- of their primary key).  A head's number visible means every
        -- number up to it committed (a publisher holds its head row to its
        -- commit), so the heads alone say which tenants have events past
        -- the relay's acknowledged numbers, and how many: no event is read
        -- to find out, and an empty poll reads none.  The role is sent to
        -- the workers by its name and resolved there (to_regrole): a role
        -- has another OID on each node, and Citus sends an oid compared
        -- with the role column as its number (idempotency.role_ref).
        FOR g IN EXECUTE pg_catalog.format(
            'SELECT h.tenant::pg_catalog.text AS t, h.last_seq AS s
               FROM idempotency.tenant_outbox_heads AS h
              WHERE h.role OPERATOR(pg_catalog.=) pg_catalog.to_regrole($1) AND h.topic OPERATOR(pg_catalog.=) $2 %%s',
            CASE WHEN p_tenant IS NULL THEN '' ELSE 'AND h.tenant OPERATOR(pg_catalog.=) $3' END)
          USING p_role::pg_catalog.text, p_topic, filt
        LOOP
            names := names OPERATOR(pg_catalog.||) g.t;
            heads := heads OPERATOR(pg_catalog.||) g.s;
        END LOOP;

        -- Where the relay starts a tenant it has no number of, or goes on
        -- after a loss it acknowledged: at the first event kept (up to the
        -- head, or to the end of the loss; read by the index), or past
        -- them when none is.  From here on, the number above a tenant's
        -- acknowledged one is an event that exists; and an event whose
        -- number is in an acknowledged loss (published with a clock behind
        -- into a partition not dropped) is relayed, not skipped.
        SELECT pg_catalog.array_agg(h.t), pg_catalog.array_agg(COALESCE(p.acked_seq, 0)),
               pg_catalog.array_agg(CASE WHEN p.acked_seq IS NULL THEN h.s
                                         ELSE LEAST(COALESCE(p.lost_acked, 0), h.s) END)
          INTO rt, ra, rz
          FROM ROWS FROM (pg_catalog.unnest(names), pg_catalog.unnest(heads)) AS h(t, s)
          LEFT JOIN idempotency.tenant_relay_positions AS p
            ON p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.tenant OPERATOR(pg_catalog.=) h.t
         WHERE p.acked_seq IS NULL
            OR p.acked_seq OPERATOR(pg_catalog.<) LEAST(COALESCE(p.lost_acked, 0), h.s);
        IF rt IS NOT NULL THEN
            FOR g IN EXECUTE 'SELECT e.tenant::pg_catalog.text AS t, pg_catalog.min(e.seq) AS s'
                             OPERATOR(pg_catalog.||) in_ranges OPERATOR(pg_catalog.||) ' GROUP BY e.tenant'
              USING p_role::pg_catalog.text, p_topic, rt, ra, rz,
                    (SELECT pg_catalog.min(v) FROM pg_catalog.unnest(ra) AS v), (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(rz) AS v)
            LOOP
                first_t := first_t OPERATOR(pg_catalog.||) g.t;
                first_s := first_s OPERATOR(pg_catalog.||) g.s;
            END LOOP;
            INSERT INTO idempotency.tenant_relay_positions AS p (role, relay, topic, tenant, acked_seq)
            SELECT p_role, p_relay, p_topic, n.t, COALESCE(f.s OPERATOR(pg_catalog.-) 1, n.z)
              FROM ROWS FROM (pg_catalog.unnest(rt), pg_catalog.unnest(rz)) AS n(t, z)
              LEFT JOIN ROWS FROM (pg_catalog.unnest(first_t), pg_catalog.unnest(first_s)) AS f(t, s) ON f.t OPERATOR(pg_catalog.=) n.t
            ON CONFLICT (role, relay, topic, tenant) DO UPDATE SET acked_seq = EXCLUDED.acked_seq;
        END IF;

        -- The batch, from the numbers alone: per tenant, a prefix of its
        -- numbers above the acknowledged one, round robin (the n-th of
        -- every tenant before the n+1-th of any, tenants in the order of
        -- their text), max_events in all.  lvl: the most rounds every
        -- tenant gets in full; spare: the tenants, in that order, that
        -- get one more.
        SELECT pg_catalog.array_agg(h.t ORDER BY h.t), pg_catalog.array_agg(h.s OPERATOR(pg_catalog.-) p.acked_seq ORDER BY h.t)
          INTO rt, counts
          FROM ROWS FROM (pg_catalog.unnest(names), pg_catalog.unnest(heads)) AS h(t, s)
          JOIN idempotency.tenant_relay_positions AS p
            ON p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.tenant OPERATOR(pg_catalog.=) h.t
         WHERE h.s OPERATOR(pg_catalog.>) p.acked_seq;
        IF rt IS NULL THEN
            RETURN;
        END IF;
        lvl := 0;
        lvl_hi := LEAST(p_max, (SELECT pg_catalog.max(n) FROM pg_catalog.unnest(counts) AS n));
        WHILE lvl OPERATOR(pg_catalog.<) lvl_hi LOOP
            mid := (lvl OPERATOR(pg_catalog.+) lvl_hi OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog./) 2;
            IF (SELECT pg_catalog.sum(LEAST(n, mid)) FROM pg_catalog.unnest(counts) AS n) OPERATOR(pg_catalog.<=) p_max THEN
                lvl := mid;
            ELSE
                lvl_hi := mid OPERATOR(pg_catalog.-) 1;
            END IF;
        END LOOP;
        spare := p_max OPERATOR(pg_catalog.-) (SELECT pg_catalog.sum(LEAST(n, lvl)) FROM pg_catalog.unnest(counts) AS n);
        UPDATE idempotency.tenant_relay_positions AS p
           SET batch_end = p.acked_seq OPERATOR(pg_catalog.+) c.take
          FROM (SELECT q.t, LEAST(q.n, lvl) OPERATOR(pg_catalog.+)
                       CASE WHEN q.n OPERATOR(pg_catalog.>) lvl
                             AND pg_catalog.row_number() OVER (PARTITION BY q.n OPERATOR(pg_catalog.>) lvl ORDER BY q.i)
                                 OPERATOR(pg_catalog.<=) spare
                            THEN 1 ELSE 0 END AS take
                  FROM ROWS FROM (pg_catalog.unnest(rt), pg_catalog.unnest(counts)) WITH ORDINALITY AS q(t, n, i)) AS c
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.tenant OPERATOR(pg_catalog.=) c.t
           AND c.take OPERATOR(pg_catalog.>) 0;
        UPDATE idempotency.tenant_relays AS x
           SET handed_out = true, tenant_filter = p_tenant, updated_at = pg_catalog.now()
         WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
           AND x.topic OPERATOR(pg_catalog.=) p_topic;
        fresh := true;
    END IF;

    -- the batch: each tenant's events above its acknowledged number up to
    -- the batch's end for it, by the index
    SELECT pg_catalog.array_agg(p.tenant), pg_catalog.array_agg(COALESCE(p.acked_seq, 0)),
           pg_catalog.array_agg(p.batch_end),
           pg_catalog.sum(p.batch_end OPERATOR(pg_catalog.-) COALESCE(p.acked_seq, 0))
      INTO rt, ra, rz, expected
      FROM idempotency.tenant_relay_positions AS p
     WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
       AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.batch_end IS NOT NULL;
    RETURN QUERY EXECUTE
        'SELECT $8, e.event_id, e.key, e.payload, e.payload_raw, e.headers, e.published_at,
                e.tenant::pg_catalog.text, e.seq' OPERATOR(pg_catalog.||) in_ranges OPERATOR(pg_catalog.||)
        ' ORDER BY e.seq OPERATOR(pg_catalog.-) b.a, e.tenant::pg_catalog.text'
      USING p_role::pg_catalog.text, p_topic, COALESCE(rt, '{}'), COALESCE(ra, '{}'), COALESCE(rz, '{}'),
            (SELECT pg_catalog.min(v) FROM pg_catalog.unnest(ra) AS v), (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(rz) AS v),
            r.batch;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF fresh AND got OPERATOR(pg_catalog.<) expected THEN
        -- A number of the batch with no event: one of a loss the relay
        -- acknowledged, or dropped before maintenance could tell this
        -- relay (a race with it): the latter is recorded as a loss,
        -- reported by the next call (numbers above the acknowledged loss
        -- that have no event; the events of the batch are handed out)
        SELECT pg_catalog.array_agg(p.tenant),
               pg_catalog.array_agg(GREATEST(COALESCE(p.acked_seq, 0), LEAST(COALESCE(p.lost_acked, 0), p.batch_end))),
               pg_catalog.array_agg(p.batch_end)
          INTO rt, ra, rz
          FROM idempotency.tenant_relay_positions AS p
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.batch_end IS NOT NULL;
        first_t := '{}';
        first_s := '{}';
        FOR g IN EXECUTE 'SELECT e.tenant::pg_catalog.text AS t, pg_catalog.count(*) AS n'
                         OPERATOR(pg_catalog.||) in_ranges OPERATOR(pg_catalog.||) ' GROUP BY e.tenant'
          USING p_role::pg_catalog.text, p_topic, rt, ra, rz,
                (SELECT pg_catalog.min(v) FROM pg_catalog.unnest(ra) AS v), (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(rz) AS v)
        LOOP
            first_t := first_t OPERATOR(pg_catalog.||) g.t;
            first_s := first_s OPERATOR(pg_catalog.||) g.n;
        END LOOP;
        UPDATE idempotency.tenant_relay_positions AS p
           SET lost_first = LEAST(p.lost_first, m.a OPERATOR(pg_catalog.+) 1),
               lost_last = GREATEST(p.lost_last, m.z),
               lost_events = COALESCE(p.lost_events, 0) OPERATOR(pg_catalog.+) m.missing
          FROM (SELECT b.t, b.a, b.z,
                       b.z OPERATOR(pg_catalog.-) b.a OPERATOR(pg_catalog.-) COALESCE(f.n, 0) AS missing
                  FROM ROWS FROM (pg_catalog.unnest(rt), pg_catalog.unnest(ra), pg_catalog.unnest(rz)) AS b(t, a, z)
                  LEFT JOIN ROWS FROM (pg_catalog.unnest(first_t), pg_catalog.unnest(first_s)) AS f(t, n) ON f.t OPERATOR(pg_catalog.=) b.t) AS m
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.tenant OPERATOR(pg_catalog.=) m.t
           AND m.missing OPERATOR(pg_catalog.>) 0;
        IF FOUND AND got OPERATOR(pg_catalog.=) 0 THEN
            -- nothing to hand out: the loss is reported by the next call
            UPDATE idempotency.tenant_relay_positions AS p SET batch_end = NULL
             WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
               AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.batch_end IS NOT NULL;
            UPDATE idempotency.tenant_relays AS x
               SET handed_out = false, tenant_filter = NULL
             WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
               AND x.topic OPERATOR(pg_catalog.=) p_topic;
        END IF;
    ELSIF got OPERATOR(pg_catalog.=) 0 AND r.handed_out THEN
        -- every event of the batch went past the max age: the loss is
        -- reported as this batch (outbox_relay.c does the same)
        PERFORM idempotency.tenant_outbox_report_loss(r);
    END IF;
END
$body$$fn$, tenant_type);

    CREATE FUNCTION idempotency.tenant_outbox_fence(r idempotency.tenant_relays, p_generation pg_catalog.int8)
    RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $body$
    BEGIN
        IF p_generation IS NULL THEN
            IF r.generation IS NOT NULL THEN
                RAISE EXCEPTION 'relay "%" of topic "%" is fenced, and no generation was given', r.relay, r.topic
                    USING ERRCODE = 'ID001',
                          DETAIL = pg_catalog.format('The relay has generation %s.', r.generation),
                          HINT = 'Pass the generation of the relay process.  Nothing was changed.';
            END IF;
            RETURN;
        END IF;
        IF p_generation OPERATOR(pg_catalog.<) 0 THEN
            RAISE EXCEPTION 'generation must not be negative' USING ERRCODE = '22023';
        END IF;
        IF r.generation IS NOT NULL AND p_generation OPERATOR(pg_catalog.<) r.generation THEN
            RAISE EXCEPTION 'generation % of relay "%" of topic "%" is stale', p_generation, r.relay, r.topic
                USING ERRCODE = 'ID001',
                      DETAIL = pg_catalog.format('The relay has been taken over with generation %s since.', r.generation),
                      HINT = 'Stop relaying: another relay process owns it now.  Nothing was changed.';
        END IF;
        IF r.generation IS DISTINCT FROM p_generation THEN
            UPDATE idempotency.tenant_relays AS x SET generation = p_generation
             WHERE x.role OPERATOR(pg_catalog.=) r.role AND x.relay OPERATOR(pg_catalog.=) r.relay
               AND x.topic OPERATOR(pg_catalog.=) r.topic;
        END IF;
    END
    $body$;

    CREATE FUNCTION idempotency.tenant_outbox_report_loss(r idempotency.tenant_relays)
    RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $body$
    DECLARE
        lost record;
    BEGIN
        SELECT pg_catalog.sum(p.lost_events) AS events,
               pg_catalog.min(p.lost_from) AS lost_from, pg_catalog.max(p.lost_to) AS lost_to,
               pg_catalog.string_agg(pg_catalog.format('tenant %s: %s to %s', p.tenant, p.lost_first, p.lost_last),
                                     ', ' ORDER BY p.tenant) AS ranges
          INTO lost
          FROM idempotency.tenant_relay_positions AS p
         WHERE p.role OPERATOR(pg_catalog.=) r.role AND p.relay OPERATOR(pg_catalog.=) r.relay
           AND p.topic OPERATOR(pg_catalog.=) r.topic AND p.lost_last IS NOT NULL;
        IF lost.ranges IS NULL THEN
            RETURN;
        END IF;
        RAISE EXCEPTION 'relay "%" of topic "%" lost % events that expired before it acknowledged them',
                        r.relay, r.topic, lost.events
            USING ERRCODE = 'ID003',
                  DETAIL = pg_catalog.format('Events published from %s to %s (sequence numbers %s) were dropped after "idempotency.outbox_max_age"; the loss is batch %s.',
                                             COALESCE(lost.lost_from::pg_catalog.text, 'unknown'),
                                             COALESCE(lost.lost_to::pg_catalog.text, 'unknown'), lost.ranges, r.batch),
                  HINT = pg_catalog.format('Acknowledge the loss with idem_outbox_ack(relay, topic, %s, generation, tenant) to go on.', r.batch);
    END
    $body$;

    EXECUTE pg_catalog.format($fn$
CREATE FUNCTION idempotency.tenant_outbox_ack(p_role pg_catalog.regrole, p_relay pg_catalog.text,
                                              p_topic pg_catalog.text, p_batch pg_catalog.int8,
                                              p_generation pg_catalog.int8, p_tenant pg_catalog.text)
RETURNS pg_catalog.bool
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    r idempotency.tenant_relays;
    lost boolean;
BEGIN
    IF p_tenant IS NOT NULL THEN
        p_tenant := p_tenant::%1$s::pg_catalog.text;
    END IF;
    SELECT x.* INTO r FROM idempotency.tenant_relays AS x
     WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
       AND x.topic OPERATOR(pg_catalog.=) p_topic
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relay "%%" of topic "%%" has taken no batch', p_relay, p_topic
            USING ERRCODE = '55000', HINT = 'Call idem_outbox_next() first.';
    END IF;
    PERFORM idempotency.tenant_outbox_fence(r, p_generation);
    IF p_batch OPERATOR(pg_catalog.<) r.batch THEN
        RETURN false;
    END IF;
    lost := EXISTS (SELECT FROM idempotency.tenant_relay_positions AS p
                     WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
                       AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.lost_last IS NOT NULL);
    IF p_batch OPERATOR(pg_catalog.>) r.batch OR (NOT r.handed_out AND NOT lost) THEN
        RAISE EXCEPTION 'batch %% of relay "%%" of topic "%%" has not been handed out', p_batch, p_relay, p_topic
            USING ERRCODE = '55000',
                  DETAIL = CASE WHEN r.handed_out OR lost
                                THEN pg_catalog.format('The relay''s current batch is %%s.', r.batch)
                                ELSE pg_catalog.format('The relay''s next batch, %%s, has not been taken by idem_outbox_next() yet.', r.batch) END;
    END IF;
    IF r.handed_out THEN
        IF r.tenant_filter IS DISTINCT FROM p_tenant THEN
            RAISE EXCEPTION 'batch %% of relay "%%" of topic "%%" is of %%', p_batch, p_relay, p_topic,
                            COALESCE('tenant ' OPERATOR(pg_catalog.||) r.tenant_filter, 'every tenant')
                USING ERRCODE = '55000',
                      HINT = 'Acknowledge it with the tenant argument it was taken with.';
        END IF;
        UPDATE idempotency.tenant_relay_positions AS p
           SET acked_seq = p.batch_end, batch_end = NULL
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.batch_end IS NOT NULL;
    ELSE
        -- the loss reported as this batch: the acknowledged number stays,
        -- and the loss's end is kept (lost_acked): the next call goes on
        -- at the first event kept above the acknowledged number, so that
        -- an event with a number inside the loss's range that was not in
        -- the dropped partition (published with a clock behind) is still
        -- relayed (tenant_outbox_next())
        UPDATE idempotency.tenant_relay_positions AS p
           SET acked_seq = COALESCE(p.acked_seq, 0),
               lost_acked = GREATEST(COALESCE(p.lost_acked, 0), p.lost_last),
               lost_first = NULL, lost_last = NULL,
               lost_events = NULL, lost_from = NULL, lost_to = NULL
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.lost_last IS NOT NULL;
    END IF;
    UPDATE idempotency.tenant_relays AS x
       SET batch = x.batch OPERATOR(pg_catalog.+) 1, handed_out = false, tenant_filter = NULL,
           acked_at = pg_catalog.now(), updated_at = pg_catalog.now()
     WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
       AND x.topic OPERATOR(pg_catalog.=) p_topic;
    RETURN true;
END
$body$$fn$, tenant_type);

    EXECUTE pg_catalog.format($fn$
CREATE FUNCTION idempotency.tenant_outbox_dead_letter(p_role pg_catalog.regrole, p_relay pg_catalog.text,
                                                      p_topic pg_catalog.text, p_event_id pg_catalog.uuid,
                                                      p_reason pg_catalog.text, p_attempts pg_catalog.int4,
                                                      p_tenant pg_catalog.text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
#variable_conflict use_column
DECLARE
    r idempotency.tenant_relays;
    e record;
    rt pg_catalog.text[];
    ra pg_catalog.int8[];
    rz pg_catalog.int8[];
BEGIN
    IF p_tenant IS NOT NULL THEN
        p_tenant := p_tenant::%1$s::pg_catalog.text;
    END IF;
    SELECT x.* INTO r FROM idempotency.tenant_relays AS x
     WHERE x.role OPERATOR(pg_catalog.=) p_role AND x.relay OPERATOR(pg_catalog.=) p_relay
       AND x.topic OPERATOR(pg_catalog.=) p_topic
       FOR UPDATE;
    IF FOUND AND r.handed_out AND r.tenant_filter IS NOT DISTINCT FROM p_tenant THEN
        -- looked for in the ranges of the current batch only (by the
        -- index: role, topic, tenant, seq), as tenant_outbox_next() reads
        -- them
        SELECT pg_catalog.array_agg(p.tenant), pg_catalog.array_agg(COALESCE(p.acked_seq, 0)),
               pg_catalog.array_agg(p.batch_end)
          INTO rt, ra, rz
          FROM idempotency.tenant_relay_positions AS p
         WHERE p.role OPERATOR(pg_catalog.=) p_role AND p.relay OPERATOR(pg_catalog.=) p_relay
           AND p.topic OPERATOR(pg_catalog.=) p_topic AND p.batch_end IS NOT NULL;
        EXECUTE 'SELECT e.tenant::pg_catalog.text AS tenant, e.seq, e.event_id, e.key, e.headers,
                        e.payload, e.payload_raw, e.published_at
                   FROM ROWS FROM (pg_catalog.unnest($3::pg_catalog.text[]), pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[])) AS b(t, a, z)
                   JOIN idempotency.tenant_events AS e
                     ON e.tenant OPERATOR(pg_catalog.=) b.t::%1$s
                    AND e.seq OPERATOR(pg_catalog.>) b.a AND e.seq OPERATOR(pg_catalog.<=) b.z
                  WHERE e.role OPERATOR(pg_catalog.=) pg_catalog.to_regrole($1) AND e.topic OPERATOR(pg_catalog.=) $2
                    AND e.tenant OPERATOR(pg_catalog.=) ANY ($3::%1$s[])
                    AND e.seq OPERATOR(pg_catalog.>) $7 AND e.seq OPERATOR(pg_catalog.<=) $8
                    AND e.event_id OPERATOR(pg_catalog.=) $6'
          INTO e
          USING p_role::pg_catalog.text, p_topic, COALESCE(rt, '{}'), COALESCE(ra, '{}'), COALESCE(rz, '{}'), p_event_id,
                (SELECT pg_catalog.min(v) FROM pg_catalog.unnest(ra) AS v), (SELECT pg_catalog.max(v) FROM pg_catalog.unnest(rz) AS v);
        IF e.event_id IS NOT NULL THEN
            -- with the node's own relays' dead letters (this node's
            -- idempotency.outbox_dead_letters): idem_outbox_dead_letters()
            -- lists them, and maintenance deletes them as those
            INSERT INTO idempotency.outbox_dead_letters AS d (role, relay, topic, event_id, key,
                   headers, payload, payload_raw, published_at, reason, attempts, failed_at)
            VALUES (p_role, p_relay, p_topic, e.event_id, e.key, e.headers, e.payload,
                    e.payload_raw, e.published_at, p_reason, p_attempts, pg_catalog.clock_timestamp())
            ON CONFLICT (role, relay, topic, event_id) DO UPDATE
               SET reason = EXCLUDED.reason, attempts = EXCLUDED.attempts,
                   failed_at = EXCLUDED.failed_at;
            RETURN;
        END IF;
    END IF;
    RAISE EXCEPTION 'event %% is not in the current batch of relay "%%" of topic "%%"', p_event_id, p_relay, p_topic
        USING ERRCODE = '55000',
              HINT = 'Record a dead letter after idem_outbox_next() returned the event, before acknowledging its batch.';
END
$body$$fn$, tenant_type);

    -- maintenance (coordinator): partitions made ahead, and dropped once
    -- every relay of their events' topics acknowledged them and the
    -- retention passed, or past the max age whatever the relays (the loss
    -- recorded with each relay that had not acknowledged them)
    CREATE FUNCTION idempotency.tenant_outbox_maintain(p_interval pg_catalog.int4, p_premake pg_catalog.int4,
                                                       p_retention pg_catalog.int4, p_max_age pg_catalog.int4,
                                                       p_lock_timeout pg_catalog.int4,
                                                       OUT created pg_catalog.int4, OUT dropped pg_catalog.int4)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $body$
    DECLARE
        now_at pg_catalog.timestamptz := pg_catalog.clock_timestamp();
        lo pg_catalog.timestamptz;
        hi pg_catalog.timestamptz;
        name pg_catalog.name;
        part record;
        g record;
        rl record;
        past boolean;
        i pg_catalog.int4;
    BEGIN
        created := 0;
        dropped := 0;
        -- the relays of roles that no longer exist (a role made later with
        -- the same OID would start from their positions), as for the
        -- node's own relays; a row a transaction holds goes next time
        DELETE FROM idempotency.tenant_relay_positions AS p
         WHERE p.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT q.ctid FROM idempotency.tenant_relay_positions AS q
                WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                                   WHERE r.oid OPERATOR(pg_catalog.=) q.role::pg_catalog.oid)
                  FOR UPDATE SKIP LOCKED));
        DELETE FROM idempotency.tenant_relays AS x
         WHERE x.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT q.ctid FROM idempotency.tenant_relays AS q
                WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                                   WHERE r.oid OPERATOR(pg_catalog.=) q.role::pg_catalog.oid)
                  FOR UPDATE SKIP LOCKED));
        lo := pg_catalog.to_timestamp(pg_catalog.floor(pg_catalog.date_part('epoch', now_at)
                                                       OPERATOR(pg_catalog./) p_interval)
                                      OPERATOR(pg_catalog.*) p_interval);
        FOR i IN 0..p_premake LOOP
            hi := lo OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => p_interval);
            IF NOT EXISTS (SELECT FROM idempotency.tenant_event_partitions AS t
                            WHERE t.lower_bound OPERATOR(pg_catalog.<) hi
                              AND t.upper_bound OPERATOR(pg_catalog.>) lo) THEN
                name := 'tenant_events_' OPERATOR(pg_catalog.||)
                        pg_catalog.to_char(pg_catalog.timezone('UTC', lo), 'YYYYMMDD"_"HH24MISS');
                BEGIN
                    SET LOCAL citus.propagate_set_commands = 'local';
                    EXECUTE pg_catalog.format('SET LOCAL lock_timeout = %s', p_lock_timeout);
                    -- made apart and attached: ATTACH PARTITION takes SHARE
                    -- UPDATE EXCLUSIVE on idempotency.tenant_events, which a
                    -- relay's transaction holding it (ACCESS SHARE, to its
                    -- end: any role's, left open) does not block, where
                    -- CREATE TABLE ... PARTITION OF waits for ACCESS
                    -- EXCLUSIVE; the (LIKE ... INCLUDING ALL) copies the
                    -- primary key, the partition's replica identity, and
                    -- Citus distributes it co-located as it attaches it
                    EXECUTE pg_catalog.format('CREATE TABLE idempotency.%I (LIKE idempotency.tenant_events INCLUDING ALL)',
                                              name);
                    EXECUTE pg_catalog.format('ALTER TABLE idempotency.tenant_events ATTACH PARTITION idempotency.%I FOR VALUES FROM (%L) TO (%L)',
                                              name, lo, hi);
                    -- what default privileges gave it: taken back
                    FOR g IN
                        SELECT a.grantee
                          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
                         WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.format('idempotency.%I', name)::pg_catalog.regclass
                           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
                    LOOP
                        EXECUTE pg_catalog.format('REVOKE ALL ON idempotency.%I FROM %s', name,
                                                  CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                                       ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END);
                    END LOOP;
                    SET LOCAL lock_timeout TO DEFAULT;
                    INSERT INTO idempotency.tenant_event_partitions VALUES (name, lo, hi);
                    created := created OPERATOR(pg_catalog.+) 1;
                EXCEPTION WHEN lock_not_available THEN
                    RAISE LOG 'could not make partition "idempotency.%" of the tenant outbox now, will retry: %', name, SQLERRM;
                END;
            END IF;
            lo := hi;
        END LOOP;

        FOR part IN
            SELECT t.partition, t.lower_bound, t.upper_bound
              FROM idempotency.tenant_event_partitions AS t
             WHERE t.upper_bound OPERATOR(pg_catalog.+)
                   pg_catalog.make_interval(secs => LEAST(p_retention, p_max_age)) OPERATOR(pg_catalog.<=) now_at
             ORDER BY t.lower_bound
        LOOP
            past := part.upper_bound OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => p_max_age)
                    OPERATOR(pg_catalog.<=) now_at;
            BEGIN
                -- kept while a relay of its events has not acknowledged
                -- them: found first without the lock below (ACCESS
                -- EXCLUSIVE on every shard of the partition, which every
                -- role's relay reading the outbox waits for while the
                -- partition's events are read), so that a partition kept
                -- run after run, however many events another role put in
                -- it, holds no relay up; found again under the lock before
                -- a drop
                IF NOT past THEN
                    FOR g IN EXECUTE pg_catalog.format(
                        'SELECT e.role, e.topic, e.tenant::pg_catalog.text AS tenant, pg_catalog.max(e.seq) AS hi
                           FROM idempotency.%I AS e GROUP BY 1, 2, 3', part.partition)
                    LOOP
                        IF EXISTS (SELECT
                                     FROM idempotency.tenant_relays AS x
                                     LEFT JOIN idempotency.tenant_relay_positions AS p
                                       ON p.role OPERATOR(pg_catalog.=) x.role AND p.relay OPERATOR(pg_catalog.=) x.relay
                                      AND p.topic OPERATOR(pg_catalog.=) x.topic AND p.tenant OPERATOR(pg_catalog.=) g.tenant
                                    WHERE x.role OPERATOR(pg_catalog.=) g.role AND x.topic OPERATOR(pg_catalog.=) g.topic
                                      AND (x.every_tenant OR p.relay IS NOT NULL)
                                      AND COALESCE(p.acked_seq, 0) OPERATOR(pg_catalog.<) g.hi) THEN
                            RAISE EXCEPTION 'kept' USING ERRCODE = 'IDK01';
                        END IF;
                    END LOOP;
                END IF;
                SET LOCAL citus.propagate_set_commands = 'local';
                EXECUTE pg_catalog.format('SET LOCAL lock_timeout = %s', p_lock_timeout);
                -- the lock of every shard of the partition, from here to the
                -- drop: a publisher that wrote into it has ended, and no other
                -- comes (no event is committed after it is found acknowledged)
                EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I REPLICA IDENTITY DEFAULT', part.partition);
                SET LOCAL lock_timeout TO DEFAULT;
                FOR g IN EXECUTE pg_catalog.format(
                    'SELECT e.role, e.topic, e.tenant::pg_catalog.text AS tenant,
                            pg_catalog.min(e.seq) AS lo, pg_catalog.max(e.seq) AS hi, pg_catalog.count(*) AS n,
                            pg_catalog.min(e.published_at) AS first_at, pg_catalog.max(e.published_at) AS last_at
                       FROM idempotency.%I AS e GROUP BY 1, 2, 3', part.partition)
                LOOP
                    FOR rl IN
                        SELECT x.relay, p.acked_seq
                          FROM idempotency.tenant_relays AS x
                          LEFT JOIN idempotency.tenant_relay_positions AS p
                            ON p.role OPERATOR(pg_catalog.=) x.role AND p.relay OPERATOR(pg_catalog.=) x.relay
                           AND p.topic OPERATOR(pg_catalog.=) x.topic AND p.tenant OPERATOR(pg_catalog.=) g.tenant
                         WHERE x.role OPERATOR(pg_catalog.=) g.role AND x.topic OPERATOR(pg_catalog.=) g.topic
                           AND (x.every_tenant OR p.relay IS NOT NULL)
                           AND COALESCE(p.acked_seq, 0) OPERATOR(pg_catalog.<) g.hi
                    LOOP
                        IF NOT past THEN
                            RAISE EXCEPTION 'kept' USING ERRCODE = 'IDK01';
                        END IF;
                        INSERT INTO idempotency.tenant_relay_positions AS p
                               (role, relay, topic, tenant, acked_seq, lost_first, lost_last, lost_events, lost_from, lost_to)
                        VALUES (g.role, rl.relay, g.topic, g.tenant, 0, g.lo, g.hi, g.n, g.first_at, g.last_at)
                        ON CONFLICT (role, relay, topic, tenant) DO UPDATE
                           SET acked_seq = COALESCE(p.acked_seq, 0),
                               lost_first = LEAST(p.lost_first, GREATEST(COALESCE(p.acked_seq, 0) OPERATOR(pg_catalog.+) 1, g.lo)),
                               lost_last = GREATEST(p.lost_last, g.hi),
                               lost_events = COALESCE(p.lost_events, 0) OPERATOR(pg_catalog.+)
                                             CASE WHEN COALESCE(p.acked_seq, 0) OPERATOR(pg_catalog.<) g.lo THEN g.n
                                                  ELSE g.hi OPERATOR(pg_catalog.-) p.acked_seq END,
                               lost_from = LEAST(p.lost_from, g.first_at),
                               lost_to = GREATEST(p.lost_to, g.last_at);
                    END LOOP;
                END LOOP;
                SET LOCAL citus.propagate_set_commands = 'local';
                EXECUTE pg_catalog.format('SET LOCAL lock_timeout = %s', p_lock_timeout);
                EXECUTE pg_catalog.format('DROP TABLE idempotency.%I', part.partition);
                SET LOCAL lock_timeout TO DEFAULT;
                DELETE FROM idempotency.tenant_event_partitions AS t
                 WHERE t.partition OPERATOR(pg_catalog.=) part.partition;
                dropped := dropped OPERATOR(pg_catalog.+) 1;
            EXCEPTION
                WHEN lock_not_available THEN
                    RAISE LOG 'could not drop partition "idempotency.%" of the tenant outbox now, will retry: %', part.partition, SQLERRM;
                WHEN SQLSTATE 'IDK01' THEN
                    NULL;		-- not acknowledged yet: kept
            END;
        END LOOP;
    END
    $body$;

    FOREACH ledger IN ARRAY ARRAY['tenant_outbox_heads', 'tenant_events', 'tenant_relays',
                                  'tenant_relay_positions', 'tenant_event_partitions'] LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON idempotency.%I FROM PUBLIC', ledger);
        EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I OWNER TO %I', ledger,
                                  (SELECT pg_catalog.pg_get_userbyid(n.nspowner)
                                     FROM pg_catalog.pg_namespace AS n
                                    WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'));
        -- and what default privileges gave anyone else
        FOR part IN
            SELECT a.grantee
              FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
             WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.format('idempotency.%I', ledger)::pg_catalog.regclass
               AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON idempotency.%I FROM %s', ledger,
                                      CASE WHEN part.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(part.grantee)) END);
        END LOOP;
    END LOOP;
    FOREACH ledger IN ARRAY ARRAY['tenant_outbox_next(pg_catalog.regrole, pg_catalog.text, pg_catalog.text, pg_catalog.int4, pg_catalog.int8, pg_catalog.text)',
                                  'tenant_outbox_ack(pg_catalog.regrole, pg_catalog.text, pg_catalog.text, pg_catalog.int8, pg_catalog.int8, pg_catalog.text)',
                                  'tenant_outbox_dead_letter(pg_catalog.regrole, pg_catalog.text, pg_catalog.text, pg_catalog.uuid, pg_catalog.text, pg_catalog.int4, pg_catalog.text)',
                                  'tenant_outbox_fence(idempotency.tenant_relays, pg_catalog.int8)',
                                  'tenant_outbox_report_loss(idempotency.tenant_relays)',
                                  'tenant_outbox_maintain(pg_catalog.int4, pg_catalog.int4, pg_catalog.int4, pg_catalog.int4, pg_catalog.int4)'] LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION idempotency.%s FROM PUBLIC', ledger);
        EXECUTE pg_catalog.format('ALTER FUNCTION idempotency.%s OWNER TO %I', ledger,
                                  (SELECT pg_catalog.pg_get_userbyid(n.nspowner)
                                     FROM pg_catalog.pg_namespace AS n
                                    WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency'));
        -- and what default privileges gave anyone else
        FOR part IN
            SELECT a.grantee
              FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
             WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.format('idempotency.%s', ledger)::pg_catalog.regprocedure
               AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION idempotency.%s FROM %s', ledger,
                                      CASE WHEN part.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(part.grantee)) END);
        END LOOP;
    END LOOP;
    PERFORM pg_catalog.set_config('citus.enable_ddl_propagation', messages, true);
    COMMENT ON TABLE idempotency.tenant_outbox_heads IS
        'the last sequence number of each role''s topic per tenant, distributed by Citus with the tenant''s rows (idempotency.citus_distribute())';
    COMMENT ON TABLE idempotency.tenant_events IS
        'the outbox of the calls that name their tenant, distributed by Citus with the tenant''s rows (idempotency.citus_distribute())';
    COMMENT ON TABLE idempotency.tenant_relays IS
        'the relays of the tenant outbox (coordinator): batch and generation';
    COMMENT ON TABLE idempotency.tenant_relay_positions IS
        'the relays of the tenant outbox (coordinator): acknowledged sequence number and losses per tenant';
    EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
      USING 'idempotency.tenant_outbox_heads', colocate_with::pg_catalog.text;
    EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''tenant'', colocate_with => $2)'
      USING 'idempotency.tenant_events', colocate_with::pg_catalog.text;
    -- the tenant outbox's first partitions (maintenance makes the next)
    PERFORM pg_catalog.idem_maintain();
END
$citus_distribute$;

COMMENT ON FUNCTION idempotency.citus_distribute(regclass) IS
'distributes the key and message ledgers, the tenant stream positions and producer sequences and the tenant outbox by tenant, co-located with a table distributed by its tenant (Citus coordinator, once, before the first call)';

REVOKE ALL ON FUNCTION idempotency.citus_distribute(regclass) FROM PUBLIC;

-- What default privileges gave it: taken back (superuser or the schema's
-- owner only).
DO $citus_distribute_privileges$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p,
               pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.citus_distribute(regclass)'::pg_catalog.regprocedure
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION idempotency.citus_distribute(regclass) FROM %I CASCADE',
                                  pg_catalog.pg_get_userbyid(item.grantee));
    END LOOP;
END
$citus_distribute_privileges$;

-- 0.5.0: moving the key memory with a tenant (see src/memory_transfer.c,
-- doc/scale-out.md): the expired keys and message ids remembered
-- (idempotency.key_memory) of chosen scopes or consumers, as
-- idempotency.memory_record rows (0.5.0's form: role, digest, expired_by)
CREATE TYPE idempotency.memory_record AS (
    role       name,
    digest     uuid,
    expired_by timestamptz
);

COMMENT ON TYPE idempotency.memory_record IS
'one remembered expired key or message id as idempotency.export_key_memory() and export_message_memory() give it and the import functions take it';

CREATE FUNCTION idempotency.export_key_memory(scopes text[] DEFAULT NULL)
RETURNS SETOF idempotency.memory_record
AS 'MODULE_PATHNAME', 'idem_export_key_memory'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_key_memory(text[]) IS
'the expired idempotency keys of the given scopes (all if NULL) remembered now (idempotency.key_memory), of every role, for idempotency.import_key_memory() on another node';

CREATE FUNCTION idempotency.import_key_memory(r record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_key_memory'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_key_memory(record) IS
'remembers an exported expired idempotency key for idempotency.key_memory after it expired, unless this node does already: inserted, kept or expired';

CREATE FUNCTION idempotency.export_message_memory(consumers text[] DEFAULT NULL)
RETURNS SETOF idempotency.memory_record
AS 'MODULE_PATHNAME', 'idem_export_message_memory'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_message_memory(text[]) IS
'the expired message ids of the given consumers (all if NULL) remembered now (idempotency.key_memory), of every role, for idempotency.import_message_memory() on another node';

CREATE FUNCTION idempotency.import_message_memory(r record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_message_memory'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_message_memory(record) IS
'remembers an exported expired message id for idempotency.key_memory after it expired, unless this node does already: inserted, kept or expired';

REVOKE ALL ON FUNCTION idempotency.export_key_memory(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_key_memory(record) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.export_message_memory(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_message_memory(record) FROM PUBLIC;

-- what default privileges of the installing role granted on them, taken back
-- (PUBLIC keeps USAGE on the type, as on the other record types)
DO $memory_transfer_privileges$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT pg_catalog.format('FUNCTION %s', p.oid::pg_catalog.regprocedure) AS name,
               a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
          FROM pg_catalog.pg_proc AS p,
               pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
                   'idempotency.export_key_memory(text[])'::pg_catalog.regprocedure,
                   'idempotency.import_key_memory(record)'::pg_catalog.regprocedure,
                   'idempotency.export_message_memory(text[])'::pg_catalog.regprocedure,
                   'idempotency.import_message_memory(record)'::pg_catalog.regprocedure]::pg_catalog.oid[])
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        UNION ALL
        SELECT pg_catalog.format('TYPE %s', t.oid::pg_catalog.regtype), a.privilege_type,
               pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee))
          FROM pg_catalog.pg_type AS t,
               pg_catalog.aclexplode(t.typacl) AS a
         WHERE t.oid OPERATOR(pg_catalog.=) 'idempotency.memory_record'::pg_catalog.regtype
           AND a.grantee OPERATOR(pg_catalog.<>) t.typowner
           AND a.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE',
                                  item.privilege_type, item.name, item.grantee);
    END LOOP;
END
$memory_transfer_privileges$;

-- The export manifest (section "outbox export and import" above) names
-- the memory's parts now that they are exported: key_memory, whose slot
-- it held, and message_memory.  Same privileges (CREATE OR REPLACE keeps
-- them): EXECUTE for PUBLIC, it reads nothing.
CREATE OR REPLACE FUNCTION idempotency.export_manifest()
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
        ('key_memory', 'idempotency.memory_record', 'idempotency.export_key_memory(text[])',
         'idempotency.import_key_memory(record)', 8),
        ('message_memory', 'idempotency.memory_record', 'idempotency.export_message_memory(text[])',
         'idempotency.import_message_memory(record)', 9))
       AS m(part, record_type, export_function, import_function, import_order)
 ORDER BY m.import_order
$manifest$;

COMMENT ON FUNCTION idempotency.export_manifest() IS
'what an export of this version holds (format 2): each part, its record type, its export and import functions, in the order to import them';

-- 0.5.0: stream positions and producer sequences carried by Citus' shard
-- operations (issue 37; src/streams.c, doc/scale-out.md, "What the
-- distributed ledgers do not carry").  idem_assign(), idem_advance(),
-- idem_positions() and idem_sequence() take the
-- tenant in overloads of their own, with every argument and no default, as
-- idem_consume_message() does (0.4.0's functions stay as they are; a call
-- that names the tenant passes generation too, generation => NULL for an
-- unfenced advance, and strict for a sequence).  With
-- idempotency.tenant_positions and tenant_sequences made by
-- idempotency.citus_distribute(), the call reads and writes the tenant's
-- local shard of them; otherwise the tenant is not used, and the call is
-- the one without it.
CREATE FUNCTION pg_catalog.idem_assign(consumer text,
                                       stream text,
                                       parts integer[],
                                       generation bigint,
                                       tenant text)
RETURNS TABLE (part integer, next_offset bigint)
AS 'MODULE_PATHNAME', 'idem_assign'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_assign(text, text, integer[], bigint, text) IS
'records the assignment of stream partitions to a consumer with its generation, and returns where to seek each (tenant: the shard of stream positions distributed by Citus)';

CREATE FUNCTION pg_catalog.idem_advance(consumer text,
                                        stream text,
                                        part integer,
                                        first_offset bigint,
                                        last_offset bigint,
                                        generation bigint,
                                        tenant text)
RETURNS TABLE (first_offset bigint, last_offset bigint)
AS 'MODULE_PATHNAME', 'idem_advance'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION pg_catalog.idem_advance(text, text, integer, bigint, bigint, bigint, text) IS
'moves a stream partition''s position past a batch in the caller''s transaction, and returns the part of the batch not processed yet (tenant: the shard of stream positions distributed by Citus)';

CREATE FUNCTION pg_catalog.idem_positions(consumer text, stream text, tenant text)
RETURNS TABLE (part integer, next_offset bigint, generation bigint,
               updated_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_positions'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_positions(text, text, text) IS
'the calling role''s positions of one consumer on one stream (tenant: the shard of stream positions distributed by Citus)';

CREATE FUNCTION pg_catalog.idem_sequence(consumer text,
                                         producer text,
                                         epoch bigint,
                                         seq bigint,
                                         strict boolean,
                                         tenant text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_sequence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_sequence(text, text, bigint, bigint, boolean, text) IS
'checks a producer''s sequence number in the caller''s transaction: new, duplicate, gap or fenced (tenant: the shard of producer sequences distributed by Citus)';

-- 0.5.0: a ledger that a publication carries keeps working.  0.5.0
-- refuses an update or delete of a ledger row, as an UPDATE is, when a
-- publication carries that change and the partition has no replica
-- identity (src/relation_checks.c); before, the change was written and no
-- subscriber could apply it.  So that updating the extension does not make
-- every completion of a database that publishes FOR ALL TABLES (or the
-- schema, or a ledger) fail, such a ledger table and its partitions get
-- REPLICA IDENTITY FULL here, which a subscriber can apply; the partitions
-- made after take it from their table (storage.c).  A ledger made later,
-- or a publication made later, is the DBA's choice (doc/operations.md,
-- "Not supported").
DO $replica_identity_0_5_0$
DECLARE
    ledger pg_catalog.oid;
    part pg_catalog.oid;
BEGIN
    FOR ledger IN
        SELECT c.oid FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['keys', 'messages']::pg_catalog.name[])
           AND c.relkind OPERATOR(pg_catalog.=) 'p'
           AND c.relreplident OPERATOR(pg_catalog.=) 'd'
           AND EXISTS (
               SELECT FROM pg_catalog.pg_publication AS p
                WHERE (p.pubupdate OR p.pubdelete)
                  AND (p.puballtables
                       OR EXISTS (SELECT FROM pg_catalog.pg_publication_namespace AS pn
                                   WHERE pn.pnpubid OPERATOR(pg_catalog.=) p.oid
                                     AND pn.pnnspid OPERATOR(pg_catalog.=) c.relnamespace)
                       OR EXISTS (SELECT FROM pg_catalog.pg_publication_rel AS pr
                                   WHERE pr.prpubid OPERATOR(pg_catalog.=) p.oid
                                     AND pr.prrelid OPERATOR(pg_catalog.=) ANY (
                                         SELECT t.relid FROM pg_catalog.pg_partition_tree(c.oid) AS t))))
    LOOP
        BEGIN
            FOR part IN
                SELECT t.relid FROM pg_catalog.pg_partition_tree(ledger) AS t
                  JOIN pg_catalog.pg_class AS pc ON pc.oid OPERATOR(pg_catalog.=) t.relid
                 WHERE pc.relreplident OPERATOR(pg_catalog.=) 'd'
                 ORDER BY t.level
            LOOP
                EXECUTE pg_catalog.format('ALTER TABLE %s REPLICA IDENTITY FULL',
                                          part::pg_catalog.regclass);
            END LOOP;
            RAISE NOTICE 'the ledger % is published: made REPLICA IDENTITY FULL, with its partitions',
                ledger::pg_catalog.regclass
                USING DETAIL = 'Since 0.5.0, an update or delete of a ledger row that a publication carries needs a replica identity, as an UPDATE does.';
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'the ledger % is published and has no replica identity',
                ledger::pg_catalog.regclass
                USING DETAIL = 'Since 0.5.0, the calls that update or delete its rows are refused while a publication carries those changes.',
                      HINT = 'As the owner of schema idempotency, give the table and its partitions REPLICA IDENTITY FULL (doc/operations.md, "Not supported").';
        END;
    END LOOP;
END
$replica_identity_0_5_0$;

-- 0.5.0: the outbox carried by Citus' shard operations (issue 37;
-- src/outbox_tenant.c, doc/scale-out.md, "The outbox of a tenant").
-- idem_publish(), idem_outbox_next(), idem_outbox_ack() and
-- idem_outbox_dead_letter() take the tenant in overloads of their own, with every argument and no default, as the
-- stream calls do.  With idempotency.tenant_events made by
-- idempotency.citus_distribute(), the event is written in the tenant's
-- local shard with the next number of its (role, topic, tenant), and the
-- relay on the coordinator reads every tenant's events (tenant NULL) or
-- one tenant's; otherwise the tenant is not used, and the call is the one
-- without it.
CREATE FUNCTION pg_catalog.idem_publish(topic text,
                                        payload jsonb,
                                        key text,
                                        headers jsonb,
                                        payload_raw bytea,
                                        tenant text)
RETURNS uuid
AS 'MODULE_PATHNAME', 'idem_publish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_publish(text, jsonb, text, jsonb, bytea, text) IS
'writes an event into the outbox in the caller''s transaction and returns its event id (tenant: the shard of the outbox distributed by Citus)';

CREATE FUNCTION pg_catalog.idem_outbox_next(relay text,
                                            topic text,
                                            max_events integer,
                                            generation bigint,
                                            tenant text)
RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
               payload_raw bytea, headers jsonb, published_at timestamptz,
               tenant text, seq bigint)
AS 'MODULE_PATHNAME', 'idem_outbox_next'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_next(text, text, integer, bigint, text) IS
'the relay''s current batch of events of a topic, the same until acknowledged (tenant: of the outbox distributed by Citus, NULL for every tenant)';

CREATE FUNCTION pg_catalog.idem_outbox_ack(relay text,
                                           topic text,
                                           batch bigint,
                                           generation bigint,
                                           tenant text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_ack(text, text, bigint, bigint, text) IS
'acknowledges the relay''s current batch: true if it moved the relay past it (tenant: of the outbox distributed by Citus, NULL for every tenant)';

CREATE FUNCTION pg_catalog.idem_outbox_dead_letter(relay text,
                                                   topic text,
                                                   event_id uuid,
                                                   reason text,
                                                   attempts integer,
                                                   tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_dead_letter'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_outbox_dead_letter(text, text, uuid, text, integer, text) IS
'records that the relay gave up on an event of its current batch, with a copy of the event (tenant: of the outbox distributed by Citus, as the batch was taken)';

-- Each tenant overload (the stream calls' and the outbox's) gets exactly
-- the privileges of its sibling without the tenant (what default
-- privileges gave it is taken back first).
DO $tenant_overload_privileges$
DECLARE
    o record;
    item record;
BEGIN
    FOR o IN
        SELECT n.oid::pg_catalog.regprocedure AS name, n.proacl AS newacl,
               d.proacl AS oldacl, n.proowner AS owner
          FROM (VALUES
                ('pg_catalog.idem_publish(text,jsonb,text,jsonb,bytea,text)'::pg_catalog.regprocedure::pg_catalog.oid,
                 'pg_catalog.idem_publish(text,jsonb,text,jsonb,bytea)'::pg_catalog.regprocedure::pg_catalog.oid),
                ('pg_catalog.idem_outbox_next(text,text,integer,bigint,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_outbox_next(text,text,integer,bigint)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_outbox_ack(text,text,bigint,bigint,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_outbox_ack(text,text,bigint,bigint)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_outbox_dead_letter(text,text,uuid,text,integer,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_outbox_dead_letter(text,text,uuid,text,integer)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_assign(text,text,integer[],bigint,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_assign(text,text,integer[],bigint)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_advance(text,text,integer,bigint,bigint,bigint,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_advance(text,text,integer,bigint,bigint,bigint)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_positions(text,text,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_positions(text,text)'::pg_catalog.regprocedure),
                ('pg_catalog.idem_sequence(text,text,bigint,bigint,boolean,text)'::pg_catalog.regprocedure,
                 'pg_catalog.idem_sequence(text,text,bigint,bigint,boolean)'::pg_catalog.regprocedure))
               AS f (newobj, oldobj)
          JOIN pg_catalog.pg_proc AS n ON n.oid OPERATOR(pg_catalog.=) f.newobj
          JOIN pg_catalog.pg_proc AS d ON d.oid OPERATOR(pg_catalog.=) f.oldobj
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', o.name);
        FOR item IN
            SELECT a.grantee
              FROM pg_catalog.aclexplode(o.newacl) AS a
             WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
               AND a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %I CASCADE', o.name,
                                      pg_catalog.pg_get_userbyid(item.grantee));
        END LOOP;
        IF o.oldacl IS NULL THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', o.name);
        ELSE
            FOR item IN
                SELECT a.grantee, a.privilege_type, a.is_grantable
                  FROM pg_catalog.aclexplode(o.oldacl) AS a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
            LOOP
                EXECUTE pg_catalog.format('GRANT %s ON FUNCTION %s TO %s%s',
                                          item.privilege_type, o.name,
                                          CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                               ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
                                          CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$tenant_overload_privileges$;

-- 0.5.0: roles identified by name across Citus nodes (see src/role_ref.c,
-- doc/scale-out.md, "Roles across nodes").  The role column of the tables
-- citus_distribute() distributes is an idempotency.role_ref: stored as
-- this node's OID of the role, like a regrole, but written and read (text
-- and binary) as the role's name, so that Citus' shard moves and splits,
-- which copy rows between nodes where the role has another OID, find it
-- again by its name.  "-" (binary: empty) is a role that no longer
-- exists; a name no role has reads as 0, which no role matches.
CREATE TYPE idempotency.role_ref;

CREATE FUNCTION idempotency.role_ref_in(name pg_catalog.cstring)
RETURNS idempotency.role_ref
AS 'MODULE_PATHNAME', 'idem_role_ref_in'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_ref_out(role idempotency.role_ref)
RETURNS pg_catalog.cstring
AS 'MODULE_PATHNAME', 'idem_role_ref_out'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_ref_recv(buf pg_catalog.internal)
RETURNS idempotency.role_ref
AS 'MODULE_PATHNAME', 'idem_role_ref_recv'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION idempotency.role_ref_send(role idempotency.role_ref)
RETURNS pg_catalog.bytea
AS 'MODULE_PATHNAME', 'idem_role_ref_send'
LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE TYPE idempotency.role_ref (
    INPUT = idempotency.role_ref_in,
    OUTPUT = idempotency.role_ref_out,
    RECEIVE = idempotency.role_ref_recv,
    SEND = idempotency.role_ref_send,
    INTERNALLENGTH = 4,
    PASSEDBYVALUE,
    ALIGNMENT = int4,
    STORAGE = plain
);

COMMENT ON TYPE idempotency.role_ref IS
'a role, stored as its OID on this node and copied between nodes by its name (the role column of the tables idempotency.citus_distribute() distributes)';
COMMENT ON FUNCTION idempotency.role_ref_in(pg_catalog.cstring) IS
'input of idempotency.role_ref: a role name, or - for a role that no longer exists';
COMMENT ON FUNCTION idempotency.role_ref_out(idempotency.role_ref) IS
'output of idempotency.role_ref: the role''s name, or - for a role that no longer exists';
COMMENT ON FUNCTION idempotency.role_ref_recv(pg_catalog.internal) IS
'binary input of idempotency.role_ref: a role name, empty for a role that no longer exists';
COMMENT ON FUNCTION idempotency.role_ref_send(idempotency.role_ref) IS
'binary output of idempotency.role_ref: the role''s name, empty for a role that no longer exists';

-- The same four bytes as an oid: implicitly an oid or a regrole (so
-- "role = $1", pg_get_userbyid(role) and the indexes of oid's btree
-- operator class work on the column unchanged), and an oid or a regrole
-- becomes one on assignment (an INSERT of a role's OID).
CREATE CAST (idempotency.role_ref AS pg_catalog.oid) WITHOUT FUNCTION AS IMPLICIT;
CREATE CAST (idempotency.role_ref AS pg_catalog.regrole) WITHOUT FUNCTION AS IMPLICIT;
CREATE CAST (pg_catalog.oid AS idempotency.role_ref) WITHOUT FUNCTION AS ASSIGNMENT;
CREATE CAST (pg_catalog.regrole AS idempotency.role_ref) WITHOUT FUNCTION AS ASSIGNMENT;

-- 0.5.0: the members this version adds get exactly the privileges of a
-- fresh install in a plain database, as 0.4.0's members do (see the block
-- "Privileges" of the install script): each privilege that the default
-- privileges of the role running this script account for and that this
-- script does not give is taken back.  Only these members: a privilege on
-- an older member that you granted stays.
DO $privileges_0_5_0$
DECLARE
    item record;
BEGIN
    FOR item IN
        WITH members (kind, objid, name, acl, owner, nsp, monitor) AS (
            SELECT 'f', p.oid, pg_catalog.format('FUNCTION %s', p.oid::pg_catalog.regprocedure),
                   p.proacl, p.proowner, p.pronamespace,
                   p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_relay_info',
                       'outbox_stats_info']::pg_catalog.name[])
              FROM pg_catalog.pg_proc AS p
             WHERE (p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                    AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['idem_publish',
                        'idem_outbox_next', 'idem_outbox_ack', 'idem_outbox_dead_letter',
                        'idem_outbox_dead_letters', 'idem_outbox_relays']::pg_catalog.name[]))
                OR (p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
                    AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_relay_info',
                        'outbox_stats_info', 'export_events', 'import_event', 'export_relays',
                        'import_relay', 'export_dead_letters', 'import_dead_letter',
                        'export_manifest', 'citus_distribute', 'export_key_memory',
                        'import_key_memory', 'export_message_memory',
                        'import_message_memory', 'role_ref_in', 'role_ref_out',
                        'role_ref_recv', 'role_ref_send']::pg_catalog.name[]))
            UNION ALL
            SELECT 'r', c.oid, pg_catalog.format('TABLE %s', c.oid::pg_catalog.regclass),
                   c.relacl, c.relowner, c.relnamespace, true
              FROM pg_catalog.pg_class AS c
             WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
               AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_relay_lag',
                   'outbox_stats']::pg_catalog.name[])
            UNION ALL
            SELECT 'T', t.oid, pg_catalog.format('TYPE %s', t.oid::pg_catalog.regtype),
                   t.typacl, t.typowner, t.typnamespace, false
              FROM pg_catalog.pg_type AS t
             WHERE t.typnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
               AND t.typname OPERATOR(pg_catalog.=) ANY (ARRAY['event_record', 'relay_record',
                   'dead_letter_record', 'memory_record', 'role_ref']::pg_catalog.name[])
        )
        SELECT m.name, a.privilege_type,
               CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                    ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee
          FROM members AS m
          JOIN pg_catalog.pg_depend AS d
            ON d.objid OPERATOR(pg_catalog.=) m.objid
           AND d.classid OPERATOR(pg_catalog.=) CASE m.kind
                   WHEN 'f' THEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                   WHEN 'r' THEN 'pg_catalog.pg_class'::pg_catalog.regclass
                   ELSE 'pg_catalog.pg_type'::pg_catalog.regclass END
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=)
               (SELECT e.oid FROM pg_catalog.pg_extension AS e
                 WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')
           AND d.deptype OPERATOR(pg_catalog.=) 'e',
               pg_catalog.aclexplode(m.acl) AS a
         WHERE a.grantee OPERATOR(pg_catalog.<>) m.owner
           AND EXISTS (
               SELECT FROM pg_catalog.pg_default_acl AS da,
                           pg_catalog.aclexplode(da.defaclacl) AS g
                WHERE da.defaclrole OPERATOR(pg_catalog.=) m.owner
                  AND da.defaclobjtype OPERATOR(pg_catalog.=) m.kind::pg_catalog."char"
                  AND da.defaclnamespace OPERATOR(pg_catalog.=) ANY (ARRAY[0, m.nsp]::pg_catalog.oid[])
                  AND g.grantee OPERATOR(pg_catalog.=) a.grantee
                  AND g.privilege_type OPERATOR(pg_catalog.=) a.privilege_type)
           -- what this script gives: EXECUTE on the idem_* functions,
           -- export_manifest() and role_ref's I/O functions and USAGE on the
           -- types to PUBLIC, the
           -- monitoring ones to pg_monitor
           AND NOT ((m.kind OPERATOR(pg_catalog.=) 'f'
                     AND (m.nsp OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                          OR m.name OPERATOR(pg_catalog.=) 'FUNCTION idempotency.export_manifest()'
                          OR m.name OPERATOR(pg_catalog.=) ANY (ARRAY[
                              'FUNCTION idempotency.role_ref_in(cstring)',
                              'FUNCTION idempotency.role_ref_out(idempotency.role_ref)',
                              'FUNCTION idempotency.role_ref_recv(internal)',
                              'FUNCTION idempotency.role_ref_send(idempotency.role_ref)']))
                     AND a.grantee OPERATOR(pg_catalog.=) 0
                     AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE')
                 OR (m.kind OPERATOR(pg_catalog.=) 'T'
                     AND a.grantee OPERATOR(pg_catalog.=) 0
                     AND a.privilege_type OPERATOR(pg_catalog.=) 'USAGE')
                 OR (m.monitor
                     AND a.grantee OPERATOR(pg_catalog.=) 'pg_monitor'::pg_catalog.regrole
                     AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['EXECUTE',
                         'SELECT']::pg_catalog.text[])))
    LOOP
        EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s CASCADE',
                                  item.privilege_type, item.name, item.grantee);
    END LOOP;
END
$privileges_0_5_0$;

-- 0.5.0: dumps leave out the rows of dropped roles (doc/security.md,
-- "Dropped roles").  The positions, sequences, relays and dead letters of
-- a role that no longer exists, not yet deleted by maintenance, would be
-- written by pg_dump under the role's bare OID (regrole's output for an
-- OID no role has), and restored under that OID into a cluster where it
-- may be another role's: that role would start its streams and relays
-- from them, and read the dead letters' copies of the events.  pg_dump
-- runs each condition with its own settings (search_path empty): every
-- name is qualified.
SELECT pg_catalog.pg_extension_config_dump('idempotency.positions',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.sequences',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_relays',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_dead_letters',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
