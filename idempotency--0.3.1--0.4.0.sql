/* idempotency--0.3.1--0.4.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- 0.4.0: waiting for two-phase holders (idempotency.wait_timeout, a
-- setting: nothing here), recovering lapsed two-phase work (keep_request,
-- idem_recover) and responses beyond JSON (response headers and raw
-- bytes).  Every existing call keeps its meaning: the new parameters come
-- last with defaults, the new result columns come last.
--
-- Each ledger that exists gets its digest index on (role, digest) in
-- place of the one on (digest) alone, in every partition: a role's probe
-- then never reads another role's entry of the same key, which every role
-- could count in pg_stat_all_indexes (doc/security.md, "Who holds what").
-- Building it reads and sorts each partition, while calls on the ledger
-- wait; a (role, digest) index built beforehand in a partition with
-- CREATE INDEX CONCURRENTLY is taken as it is (see doc/operations.md,
-- "Updating").  The key ledger also gains its new columns (NULL in every
-- existing row: no rewrite) and the partial index idem_recover() scans,
-- made after the digest index, so that the digest index stays the first
-- of each partition's indexes (the one a probe opens first).

DO $ledger$
DECLARE
    ledger pg_catalog.text;
    old_index pg_catalog.regclass;
BEGIN
    -- keep in step with ledger_defs and IdemUpgradeLedgerIndex in src/storage.c
    FOREACH ledger IN ARRAY ARRAY['messages', 'keys'] LOOP
        CONTINUE WHEN pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger)) IS NULL;
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_catalog.pg_index AS i
             WHERE i.indrelid OPERATOR(pg_catalog.=)
                       pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger))
               AND i.indkey::pg_catalog.text OPERATOR(pg_catalog.=) '3 2'
               AND i.indnkeyatts OPERATOR(pg_catalog.=) 2
               AND i.indexprs IS NULL AND i.indpred IS NULL);
        SELECT i.indexrelid::pg_catalog.regclass INTO old_index
          FROM pg_catalog.pg_index AS i
         WHERE i.indrelid OPERATOR(pg_catalog.=)
                   pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger))
           AND i.indkey::pg_catalog.text OPERATOR(pg_catalog.=) '2'
           AND i.indexprs IS NULL AND i.indpred IS NULL
         ORDER BY i.indexrelid
         LIMIT 1;
        EXECUTE pg_catalog.format('CREATE INDEX %I ON idempotency.%I (role, digest) WITH (deduplicate_items = off)',
                                  ledger OPERATOR(pg_catalog.||) '_role_digest_idx', ledger);
        IF old_index IS NOT NULL THEN
            EXECUTE pg_catalog.format('DROP INDEX %s', old_index);
        END IF;
    END LOOP;

    IF pg_catalog.to_regclass('idempotency.keys') IS NOT NULL THEN
        -- keep in step with ledger_defs in src/storage.c
        ALTER TABLE idempotency.keys
            ADD COLUMN kept_key pg_catalog.text,
            ADD COLUMN kept_scope pg_catalog.text,
            ADD COLUMN kept_request pg_catalog.jsonb,
            ADD COLUMN recover_at pg_catalog.timestamptz,
            ADD COLUMN response_headers pg_catalog.jsonb,
            ADD COLUMN response_raw pg_catalog.bytea;
        CREATE INDEX keys_recover_idx ON idempotency.keys (role, recover_at)
            WHERE recover_at IS NOT NULL;
    END IF;
END
$ledger$;

-- Result and record types gain their trailing columns (ALTER TYPE keeps
-- their privileges).
ALTER TYPE idempotency.claim_result
    ADD ATTRIBUTE response_headers jsonb,
    ADD ATTRIBUTE response_raw bytea;

COMMENT ON TYPE idempotency.claim_result IS
'what idem_claim() answers: status, token, recovery_point, response_code, response_body, expires_at, response_headers, response_raw';

ALTER TYPE idempotency.key_record
    ADD ATTRIBUTE kept_key text,
    ADD ATTRIBUTE kept_scope text,
    ADD ATTRIBUTE request jsonb,
    ADD ATTRIBUTE response_headers jsonb,
    ADD ATTRIBUTE response_raw bytea;

-- Functions whose parameters or result change are made anew; the old ones
-- are renamed first, their privileges carried over below, then dropped.
ALTER FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean)
    RENAME TO idem_claim_before_0_4_0;
ALTER FUNCTION pg_catalog.idem_complete(text, integer, jsonb, text, bigint)
    RENAME TO idem_complete_before_0_4_0;
ALTER FUNCTION pg_catalog.idem_lookup(text, text)
    RENAME TO idem_lookup_before_0_4_0;

CREATE FUNCTION pg_catalog.idem_claim(key text,
                                      request jsonb DEFAULT NULL,
                                      scope text DEFAULT '',
                                      ttl interval DEFAULT NULL,
                                      lease interval DEFAULT NULL,
                                      wait boolean DEFAULT false,
                                      keep_request boolean DEFAULT false)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409) or mismatch (422)';

CREATE FUNCTION pg_catalog.idem_complete(key text,
                                         response_code integer,
                                         response_body jsonb DEFAULT NULL,
                                         scope text DEFAULT '',
                                         token bigint DEFAULT NULL,
                                         response_headers jsonb DEFAULT NULL,
                                         response_raw bytea DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_complete(text, integer, jsonb, text, bigint, jsonb, bytea) IS
'stores the response (JSON body or raw bytes, and headers) of a claimed idempotency key and marks it completed';

CREATE FUNCTION pg_catalog.idem_lookup(key text,
                                       scope text DEFAULT '')
RETURNS TABLE (status text,
               token bigint,
               recovery_point text,
               response_code integer,
               response_body jsonb,
               claimed_at timestamptz,
               expires_at timestamptz,
               lease_expires_at timestamptz,
               response_headers jsonb,
               response_raw bytea,
               request jsonb)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION pg_catalog.idem_lookup(text, text) IS
'the calling role''s own live record of one idempotency key, for support work';

CREATE FUNCTION pg_catalog.idem_recover(lease interval,
                                        scope text DEFAULT NULL,
                                        max_keys integer DEFAULT 10)
RETURNS TABLE (key text,
               scope text,
               token bigint,
               recovery_point text,
               request jsonb,
               lapsed_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_recover'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_recover(interval, text, integer) IS
'takes over the calling role''s lapsed two-phase claims made with keep_request, each by exactly one caller, oldest lapse first';


-- Ordered streams (new in 0.4.0)

-- Ordered streams: positions and producer sequences (see src/streams.c).
-- A few rows per consumer, members of the extension whose rows pg_dump
-- carries (pg_extension_config_dump); reached through the functions only.

CREATE TABLE idempotency.positions (
    role        pg_catalog.regrole     NOT NULL,
    consumer    pg_catalog.text        NOT NULL,
    stream      pg_catalog.text        NOT NULL,
    part        pg_catalog.int4        NOT NULL,
    next_offset pg_catalog.int8,
    generation  pg_catalog.int8,
    updated_at  pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (role, consumer, stream, part)
);

COMMENT ON TABLE idempotency.positions IS
'the next offset to process per (role, consumer, stream, partition), and the partition''s assignment generation; managed by idem_assign() and idem_advance()';

CREATE TABLE idempotency.sequences (
    role       pg_catalog.regrole     NOT NULL,
    consumer   pg_catalog.text        NOT NULL,
    producer   pg_catalog.text        NOT NULL,
    epoch      pg_catalog.int8        NOT NULL,
    seq        pg_catalog.int8        NOT NULL,
    updated_at pg_catalog.timestamptz NOT NULL,
    PRIMARY KEY (role, consumer, producer)
);

COMMENT ON TABLE idempotency.sequences IS
'the last sequence number seen per (role, consumer, producer) and its epoch; managed by idem_sequence()';

REVOKE ALL ON idempotency.positions, idempotency.sequences FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('idempotency.positions', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.sequences', '');

CREATE FUNCTION pg_catalog.idem_assign(consumer text,
                                       stream text,
                                       parts integer[],
                                       generation bigint)
RETURNS TABLE (part integer, next_offset bigint)
AS 'MODULE_PATHNAME', 'idem_assign'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_assign(text, text, integer[], bigint) IS
'records the assignment of stream partitions to a consumer with its generation, and returns where to seek each';

CREATE FUNCTION pg_catalog.idem_advance(consumer text,
                                        stream text,
                                        part integer,
                                        first_offset bigint,
                                        last_offset bigint,
                                        generation bigint DEFAULT NULL)
RETURNS TABLE (first_offset bigint, last_offset bigint)
AS 'MODULE_PATHNAME', 'idem_advance'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

COMMENT ON FUNCTION pg_catalog.idem_advance(text, text, integer, bigint, bigint, bigint) IS
'moves a stream partition''s position past a batch in the caller''s transaction, and returns the part of the batch not processed yet';

CREATE FUNCTION pg_catalog.idem_positions(consumer text, stream text)
RETURNS TABLE (part integer, next_offset bigint, generation bigint,
               updated_at timestamptz)
AS 'MODULE_PATHNAME', 'idem_positions'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_positions(text, text) IS
'the calling role''s positions of one consumer on one stream';

CREATE FUNCTION pg_catalog.idem_sequence(consumer text,
                                         producer text,
                                         epoch bigint,
                                         seq bigint,
                                         strict boolean DEFAULT false)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_sequence'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_sequence(text, text, bigint, bigint, boolean) IS
'checks a producer''s sequence number in the caller''s transaction: new, duplicate, gap or fenced';

CREATE TYPE idempotency.position_record AS (
    role        name,
    consumer    text,
    stream      text,
    part        integer,
    next_offset bigint,
    generation  bigint,
    updated_at  timestamptz
);

COMMENT ON TYPE idempotency.position_record IS
'one stream position as idempotency.export_positions() gives it and idempotency.import_position() takes it';

CREATE TYPE idempotency.sequence_record AS (
    role       name,
    consumer   text,
    producer   text,
    epoch      bigint,
    seq        bigint,
    updated_at timestamptz
);

COMMENT ON TYPE idempotency.sequence_record IS
'one producer sequence as idempotency.export_sequences() gives it and idempotency.import_sequence() takes it';

CREATE FUNCTION idempotency.export_positions(consumers text[] DEFAULT NULL)
RETURNS SETOF idempotency.position_record
AS 'MODULE_PATHNAME', 'idem_export_positions'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_positions(text[]) IS
'the stream positions of the given consumers (all if NULL), of every role, for idempotency.import_position() on another node';

CREATE FUNCTION idempotency.import_position(p record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_position'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_position(record) IS
'stores an exported stream position unless this node has one at least as far: inserted, replaced or kept';

CREATE FUNCTION idempotency.export_sequences(consumers text[] DEFAULT NULL)
RETURNS SETOF idempotency.sequence_record
AS 'MODULE_PATHNAME', 'idem_export_sequences'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_sequences(text[]) IS
'the producer sequences of the given consumers (all if NULL), of every role, for idempotency.import_sequence() on another node';

CREATE FUNCTION idempotency.import_sequence(s record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_sequence'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_sequence(record) IS
'stores an exported producer sequence unless this node has one at least as far: inserted, replaced or kept';

REVOKE ALL ON FUNCTION idempotency.export_positions(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_position(record) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.export_sequences(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_sequence(record) FROM PUBLIC;

-- The statistics gain the counters of 0.4.0: the view and its function are
-- made anew (renamed first, their privileges carried over below).
ALTER VIEW idempotency.stats RENAME TO stats_before_0_4_0;
ALTER FUNCTION idempotency.stats_info() RENAME TO stats_info_before_0_4_0;

CREATE FUNCTION idempotency.stats_info(OUT dboid oid,
                                       OUT claims bigint,
                                       OUT replays bigint,
                                       OUT conflicts bigint,
                                       OUT mismatches bigint,
                                       OUT consumed bigint,
                                       OUT duplicates bigint,
                                       OUT partitions_created bigint,
                                       OUT partitions_dropped bigint,
                                       OUT holder_waits bigint,
                                       OUT recoveries bigint,
                                       OUT positions_advanced bigint,
                                       OUT stale_generations bigint,
                                       OUT sequence_duplicates bigint,
                                       OUT sequence_gaps bigint,
                                       OUT sequences_fenced bigint,
                                       OUT streams_removed bigint,
                                       OUT maintenance_runs bigint,
                                       OUT last_maintenance timestamptz,
                                       OUT last_maintenance_error text,
                                       OUT last_error_at timestamptz,
                                       OUT stats_reset timestamptz,
                                       OUT maintenance_held_off text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_info'
LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;

REVOKE ALL ON FUNCTION idempotency.stats_info() FROM PUBLIC;

CREATE VIEW idempotency.stats AS
SELECT d.datname,
       s.claims, s.replays, s.conflicts, s.mismatches,
       s.consumed, s.duplicates,
       s.partitions_created, s.partitions_dropped,
       s.holder_waits, s.recoveries,
       s.positions_advanced, s.stale_generations,
       s.sequence_duplicates, s.sequence_gaps, s.sequences_fenced,
       s.streams_removed,
       s.maintenance_runs, s.last_maintenance,
       s.last_maintenance_error, s.last_error_at,
       s.maintenance_held_off,
       s.stats_reset
  FROM idempotency.stats_info() AS s
  LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.dboid;

COMMENT ON VIEW idempotency.stats IS
'per-database counters since server start or idempotency.stats_reset() (needs shared_preload_libraries)';

GRANT SELECT ON idempotency.stats TO pg_monitor;

-- The secret that the lock tags derived from a key, a message id or a
-- stream name are keyed with (see src/lock_secret.c): every role reads
-- pg_locks, and must not be able to compute, for a guessed name, the tag
-- of another role's lock.  16 bytes from pg_strong_random() (through
-- gen_random_uuid(): 244 random bits, hashed), one row, readable by the
-- extension's owner only.  Not dumped: a restore's CREATE EXTENSION makes
-- a new one (a lock tag outlives no session); pg_upgrade and standbys
-- keep it.  Every session of the database must use the same one: never
-- change it while the server runs (doc/operations.md, "The lock secret").

CREATE TABLE idempotency.lock_secret (
    one    pg_catalog.bool  PRIMARY KEY DEFAULT true CHECK (one),
    secret pg_catalog.bytea NOT NULL
           CHECK (pg_catalog.octet_length(secret) OPERATOR(pg_catalog.=) 16)
);

COMMENT ON TABLE idempotency.lock_secret IS
'the secret the key and stream lock tags are keyed with; never change it while the server runs';

INSERT INTO idempotency.lock_secret (secret)
SELECT pg_catalog.substr(pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                                           OPERATOR(pg_catalog.||)
                                           pg_catalog.uuid_send(pg_catalog.gen_random_uuid())),
                         1, 16);

REVOKE ALL ON idempotency.lock_secret FROM PUBLIC;

-- Privileges of the objects made here: each object that replaces one gets
-- exactly the privileges of the one it replaces (a DBA who revoked EXECUTE
-- on idem_claim() from PUBLIC and granted it to one role keeps that; a
-- role granted SELECT on idempotency.stats keeps it; the grantor of a
-- carried privilege becomes the role running this script), and each new
-- object those of a fresh install under the same default privileges: what
-- they gave to roles is taken back.  Names are qualified: see the install
-- script.
DO $privileges$
DECLARE
    o record;
    item record;
BEGIN
    FOR o IN
        WITH objects (kind, newobj, oldobj) AS (VALUES
            ('FUNCTION', 'pg_catalog.idem_claim(text,jsonb,text,interval,interval,boolean,boolean)'::pg_catalog.regprocedure::pg_catalog.oid,
                         'pg_catalog.idem_claim_before_0_4_0(text,jsonb,text,interval,interval,boolean)'::pg_catalog.regprocedure::pg_catalog.oid),
            ('FUNCTION', 'pg_catalog.idem_complete(text,integer,jsonb,text,bigint,jsonb,bytea)'::pg_catalog.regprocedure,
                         'pg_catalog.idem_complete_before_0_4_0(text,integer,jsonb,text,bigint)'::pg_catalog.regprocedure),
            ('FUNCTION', 'pg_catalog.idem_lookup(text,text)'::pg_catalog.regprocedure,
                         'pg_catalog.idem_lookup_before_0_4_0(text,text)'::pg_catalog.regprocedure),
            ('FUNCTION', 'idempotency.stats_info()'::pg_catalog.regprocedure,
                         'idempotency.stats_info_before_0_4_0()'::pg_catalog.regprocedure),
            ('TABLE', 'idempotency.stats'::pg_catalog.regclass,
                      'idempotency.stats_before_0_4_0'::pg_catalog.regclass),
            ('FUNCTION', 'pg_catalog.idem_recover(interval,text,integer)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'pg_catalog.idem_assign(text,text,integer[],bigint)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'pg_catalog.idem_advance(text,text,integer,bigint,bigint,bigint)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'pg_catalog.idem_positions(text,text)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'pg_catalog.idem_sequence(text,text,bigint,bigint,boolean)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'idempotency.export_positions(text[])'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'idempotency.import_position(record)'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'idempotency.export_sequences(text[])'::pg_catalog.regprocedure, NULL),
            ('FUNCTION', 'idempotency.import_sequence(record)'::pg_catalog.regprocedure, NULL),
            ('TABLE', 'idempotency.positions'::pg_catalog.regclass, NULL),
            ('TABLE', 'idempotency.sequences'::pg_catalog.regclass, NULL),
            ('TABLE', 'idempotency.lock_secret'::pg_catalog.regclass, NULL),
            ('TYPE', 'idempotency.position_record'::pg_catalog.regtype, NULL),
            ('TYPE', 'idempotency.sequence_record'::pg_catalog.regtype, NULL))
        SELECT x.kind, x.oldobj IS NOT NULL AS replaces,
               CASE x.kind WHEN 'FUNCTION' THEN x.newobj::pg_catalog.regprocedure::pg_catalog.text
                           WHEN 'TYPE' THEN x.newobj::pg_catalog.regtype::pg_catalog.text
                           ELSE x.newobj::pg_catalog.regclass::pg_catalog.text END AS name,
               coalesce(p.proacl, c.relacl, t.typacl) AS newacl,
               coalesce(p.proowner, c.relowner, t.typowner) AS owner,
               coalesce(op.proacl, oc.relacl) AS oldacl
          FROM objects AS x
          LEFT JOIN pg_catalog.pg_type AS t
            ON x.kind OPERATOR(pg_catalog.=) 'TYPE' AND t.oid OPERATOR(pg_catalog.=) x.newobj
          LEFT JOIN pg_catalog.pg_proc AS p
            ON x.kind OPERATOR(pg_catalog.=) 'FUNCTION' AND p.oid OPERATOR(pg_catalog.=) x.newobj
          LEFT JOIN pg_catalog.pg_class AS c
            ON x.kind OPERATOR(pg_catalog.=) 'TABLE' AND c.oid OPERATOR(pg_catalog.=) x.newobj
          LEFT JOIN pg_catalog.pg_proc AS op
            ON x.kind OPERATOR(pg_catalog.=) 'FUNCTION' AND op.oid OPERATOR(pg_catalog.=) x.oldobj
          LEFT JOIN pg_catalog.pg_class AS oc
            ON x.kind OPERATOR(pg_catalog.=) 'TABLE' AND oc.oid OPERATOR(pg_catalog.=) x.oldobj
    LOOP
        IF NOT o.replaces THEN
            -- a new object: take back what the default privileges of the
            -- role running this script gave to roles; PUBLIC keeps what a
            -- fresh install under the same default privileges has (this
            -- script revokes it where the install script does)
            FOR item IN
                SELECT DISTINCT a.grantee
                  FROM pg_catalog.aclexplode(o.newacl) AS a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
                   AND a.grantee OPERATOR(pg_catalog.<>) 0
            LOOP
                EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %I CASCADE', o.kind, o.name,
                                          pg_catalog.pg_get_userbyid(item.grantee));
            END LOOP;
            CONTINUE;
        END IF;
        -- a replacing object: exactly the privileges of the one it
        -- replaces; nothing to do when both have the built-in default
        CONTINUE WHEN o.newacl IS NULL AND o.oldacl IS NULL;
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC CASCADE', o.kind, o.name);
        FOR item IN
            SELECT DISTINCT a.grantee
              FROM pg_catalog.aclexplode(o.newacl) AS a
             WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
               AND a.grantee OPERATOR(pg_catalog.<>) 0
        LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %I CASCADE', o.kind, o.name,
                                      pg_catalog.pg_get_userbyid(item.grantee));
        END LOOP;
        IF o.oldacl IS NULL THEN
            -- the built-in default: EXECUTE to PUBLIC for a function
            IF o.kind OPERATOR(pg_catalog.=) 'FUNCTION' THEN
                EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', o.name);
            END IF;
        ELSE
            FOR item IN
                SELECT a.grantee, a.privilege_type, a.is_grantable
                  FROM pg_catalog.aclexplode(o.oldacl) AS a
                 WHERE a.grantee OPERATOR(pg_catalog.<>) o.owner
            LOOP
                EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %s%s',
                                          item.privilege_type, o.kind, o.name,
                                          CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                               ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END,
                                          CASE WHEN item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
    END LOOP;
END
$privileges$;

DROP VIEW idempotency.stats_before_0_4_0;
DROP FUNCTION idempotency.stats_info_before_0_4_0();
DROP FUNCTION pg_catalog.idem_claim_before_0_4_0(text, jsonb, text, interval, interval, boolean);
DROP FUNCTION pg_catalog.idem_complete_before_0_4_0(text, integer, jsonb, text, bigint);
DROP FUNCTION pg_catalog.idem_lookup_before_0_4_0(text, text);

-- The digest filters (idempotency.filter_memory): a fresh install's
-- privileges, whatever the default privileges gave
CREATE FUNCTION idempotency.filter_info(OUT partition regclass,
                                        OUT state text,
                                        OUT digests bigint,
                                        OUT capacity bigint,
                                        OUT bytes bigint,
                                        OUT segments integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_filter_info'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION idempotency.filter_info() IS
'the digest filters of this database''s ledger partitions (shared memory; only with shared_preload_libraries)';

REVOKE ALL ON FUNCTION idempotency.filter_info() FROM PUBLIC;

DO $filter_info$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT a.grantee
          FROM pg_catalog.pg_proc AS p,
               pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid OPERATOR(pg_catalog.=) 'idempotency.filter_info()'::pg_catalog.regprocedure
           AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION idempotency.filter_info() FROM %s CASCADE',
                                  CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                       ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
    END LOOP;
END
$filter_info$;

GRANT EXECUTE ON FUNCTION idempotency.filter_info() TO pg_monitor;

-- Key locks take their keyed form when this update commits (see
-- src/lock_secret.c).  A call that took a key's lock in the public form
-- checks the form again once it has locked the key's partitions, before it
-- probes; these locks make the update wait for every transaction that has
-- a ledger partition locked, and every call that locks one after them wait
-- for the update's commit, so that no probe under a lock of the public form
-- overlaps one under the keyed form.  (The index rebuild above takes them
-- already, unless every partition had its (role, digest) index.)
DO $lock$
DECLARE
    ledger pg_catalog.text;
BEGIN
    FOREACH ledger IN ARRAY ARRAY['messages', 'keys'] LOOP
        CONTINUE WHEN pg_catalog.to_regclass(pg_catalog.format('idempotency.%I', ledger)) IS NULL;
        EXECUTE pg_catalog.format('LOCK TABLE idempotency.%I IN SHARE MODE', ledger);
    END LOOP;
END
$lock$;
