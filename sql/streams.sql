--
-- Ordered streams (0.4.0): positions (idem_assign, idem_advance,
-- idem_positions) and producer sequences (idem_sequence)
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

CREATE ROLE regress_idem_stream_a;
CREATE ROLE regress_idem_stream_b;
SET ROLE regress_idem_stream_a;

-- ------------------------------------------------------------ positions
-- assignment: where to seek (NULL: never seen), in partition order
SELECT * FROM idem_assign('billing', 'orders', ARRAY[2, 0, 1, 0], 1);
-- a batch: the whole batch is new; the position moves past it
SELECT * FROM idem_advance('billing', 'orders', 0, 0, 99, 1);
-- a redelivery overlapping it: only the part past the position
SELECT * FROM idem_advance('billing', 'orders', 0, 50, 149, 1);
-- all of it processed already: no row, position unchanged
SELECT * FROM idem_advance('billing', 'orders', 0, 10, 20, 1);
-- a gap (compacted topic): never an error
SELECT * FROM idem_advance('billing', 'orders', 0, 400, 499, 1);
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders');
-- a rolled-back batch leaves the position where it was: delivered again
BEGIN;
SELECT * FROM idem_advance('billing', 'orders', 1, 0, 9, 1);
ROLLBACK;
SELECT * FROM idem_advance('billing', 'orders', 1, 0, 9, 1);
-- within one transaction a second call sees the first
BEGIN;
SELECT * FROM idem_advance('billing', 'orders', 2, 0, 9, 1);
SELECT * FROM idem_advance('billing', 'orders', 2, 5, 14, 1);
COMMIT;

-- generations: a reassignment with a higher one; the old owner (a zombie)
-- is refused with ID001 and changes nothing
SELECT * FROM idem_assign('billing', 'orders', ARRAY[0, 1], 2);
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 0, 500, 599, 1)$$);
SELECT pg_temp.try($$SELECT * FROM idem_assign('billing', 'orders', ARRAY[0, 2], 1)$$);
-- nothing changed: partition 2 kept generation 1 (the refused assignment
-- named it too)
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders');
-- the new owner advances; a higher generation is stored even when the
-- whole range was processed already
SELECT * FROM idem_advance('billing', 'orders', 0, 500, 599, 2);
SELECT * FROM idem_advance('billing', 'orders', 1, 0, 5, 3);
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders') WHERE part = 1;
-- without a generation (NULL) on a partition that has one stored: a zombie
-- that leaves the argument out is refused with ID001 too, and changes
-- nothing (before 0.4.0 was released, it was not fenced)
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 1, 10, 19)$$);
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 1, 10, 19, NULL)$$);
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders') WHERE part = 1;
-- an unfenced stream never stores a generation
SELECT * FROM idem_advance('billing', 'clicks', 7, 100, 199);
SELECT part, next_offset, generation FROM idem_positions('billing', 'clicks');

-- consumers, streams and roles are apart
SELECT count(*) FROM idem_positions('shipping', 'orders');
SET ROLE regress_idem_stream_b;
SELECT count(*) FROM idem_positions('billing', 'orders');
SELECT * FROM idem_advance('billing', 'orders', 0, 0, 9, 1);
SET ROLE regress_idem_stream_a;

-- ------------------------------------------------------------ sequences
SELECT label, idem_sequence('ingest', 'producer-1', epoch, seq) FROM (VALUES
  ('first seen',          1, 0),
  ('again',               1, 0),
  ('next',                1, 1),
  ('older',               1, 0),
  ('gap: 2 to 4 missing', 1, 5),
  ('after the gap',       1, 6),
  ('zombie, old epoch',   0, 99),
  ('new epoch restarts',  2, 0),
  ('next in the epoch',   2, 1)
) AS t(label, epoch, seq);
-- strict: a gap is an error (ID002) and changes nothing
SELECT pg_temp.try($$SELECT idem_sequence('ingest', 'producer-1', 2, 9, strict => true)$$);
SELECT idem_sequence('ingest', 'producer-1', 2, 2, strict => true);
-- a rolled-back call changes nothing
BEGIN;
SELECT idem_sequence('ingest', 'producer-1', 2, 3);
ROLLBACK;
SELECT idem_sequence('ingest', 'producer-1', 2, 3);
SET ROLE regress_idem_stream_b;
SELECT idem_sequence('ingest', 'producer-1', 2, 3);
SET ROLE regress_idem_stream_a;

-- ------------------------------------------------------------ bad input
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('assign: null consumer',    $$SELECT * FROM idem_assign(NULL, 's', ARRAY[0], 1)$$),
  ('assign: empty stream',     $$SELECT * FROM idem_assign('c', '', ARRAY[0], 1)$$),
  ('assign: null parts',       $$SELECT * FROM idem_assign('c', 's', NULL, 1)$$),
  ('assign: null element',     $$SELECT * FROM idem_assign('c', 's', ARRAY[0, NULL], 1)$$),
  ('assign: negative part',    $$SELECT * FROM idem_assign('c', 's', ARRAY[-1], 1)$$),
  ('assign: 2-D parts',        $$SELECT * FROM idem_assign('c', 's', ARRAY[[0]], 1)$$),
  ('assign: null generation',  $$SELECT * FROM idem_assign('c', 's', ARRAY[0], NULL)$$),
  ('assign: no parts',         $$SELECT * FROM idem_assign('c', 's', ARRAY[]::int[], 1)$$),
  ('advance: null part',       $$SELECT * FROM idem_advance('c', 's', NULL, 0, 1)$$),
  ('advance: null first',      $$SELECT * FROM idem_advance('c', 's', 0, NULL, 1)$$),
  ('advance: negative last',   $$SELECT * FROM idem_advance('c', 's', 0, 0, -1)$$),
  ('advance: first past last', $$SELECT * FROM idem_advance('c', 's', 0, 5, 4)$$),
  ('advance: last at max',     $$SELECT * FROM idem_advance('c', 's', 0, 0, 9223372036854775807)$$),
  ('advance: negative gen',    $$SELECT * FROM idem_advance('c', 's', 0, 0, 1, -1)$$),
  ('advance: long consumer',   format('SELECT * FROM idem_advance(%L, %L, 0, 0, 1)', repeat('c', 256), 's')),
  ('positions: null stream',   $$SELECT * FROM idem_positions('c', NULL)$$),
  ('sequence: null epoch',     $$SELECT idem_sequence('c', 'p', NULL, 0)$$),
  ('sequence: negative seq',   $$SELECT idem_sequence('c', 'p', 0, -1)$$),
  ('sequence: null strict',    $$SELECT idem_sequence('c', 'p', 0, 0, NULL)$$),
  ('sequence: empty producer', $$SELECT idem_sequence('c', '', 0, 0)$$)
) AS t(label, stmt);
SELECT count(*) AS positions_of_c FROM idem_positions('c', 's');
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT * FROM idem_advance('c', 's', 0, 0, 1)$$);
SELECT count(*) FROM idem_positions('billing', 'orders');
ROLLBACK;

-- the tables are the extension's, readable and writable by its functions
-- only
SELECT pg_temp.try($$SELECT count(*) FROM idempotency.positions$$);
SELECT pg_temp.try($$UPDATE idempotency.sequences SET seq = 0$$);
RESET ROLE;

-- ------------------------------------------------------------ moving
CREATE TABLE moved_positions AS SELECT * FROM idempotency.export_positions(ARRAY['billing']);
CREATE TABLE moved_sequences AS SELECT * FROM idempotency.export_sequences();
SELECT role, consumer, stream, part, next_offset, generation FROM moved_positions;
SELECT role, consumer, producer, epoch, seq FROM moved_sequences;
-- importing them again: kept; behind: replaced; gone: inserted
SELECT idempotency.import_position(p) FROM moved_positions p ORDER BY stream, part;
DELETE FROM idempotency.positions WHERE part = 7;
UPDATE idempotency.positions SET next_offset = 1 WHERE part = 2;
SELECT idempotency.import_position(p) FROM moved_positions p ORDER BY stream, part;
SELECT idempotency.import_sequence(s) FROM moved_sequences s ORDER BY role;
SELECT idempotency.import_sequence((s.role, s.consumer, s.producer, s.epoch + 1, 0, now())::idempotency.sequence_record)
  FROM moved_sequences s WHERE s.role = 'regress_idem_stream_a';
SELECT role, epoch, seq FROM idempotency.sequences ORDER BY role::text;
SELECT pg_temp.try($$SELECT idempotency.import_position(('nobody_here', 'c', 's', 0, 1, 1, now())::idempotency.position_record)$$);
SELECT pg_temp.try($$SELECT idempotency.import_position(('regress_idem_stream_a', 'c', 's', -1, 1, 1, now())::idempotency.position_record)$$);
SELECT pg_temp.try($$SELECT idempotency.import_sequence(('regress_idem_stream_a', 'c', 'p', NULL, 1, now())::idempotency.sequence_record)$$);
DROP TABLE moved_positions, moved_sequences;

-- ------------------------------------------------------------ maintenance
-- positions and sequences unused for idempotency.position_ttl are deleted
UPDATE idempotency.positions SET updated_at = now() - interval '31 days' WHERE stream = 'clicks';
UPDATE idempotency.sequences SET updated_at = now() - interval '31 days' WHERE role = 'regress_idem_stream_b'::regrole;
SHOW idempotency.position_ttl;
SELECT idem_maintain() IS NOT NULL AS maintained;
SELECT stream, count(*) FROM idempotency.positions GROUP BY 1 ORDER BY 1;
SELECT role FROM idempotency.sequences;
-- reading a position counts as using it
UPDATE idempotency.positions SET updated_at = now() - interval '20 days' WHERE part = 0;
SET ROLE regress_idem_stream_a;
SELECT count(*) FROM idem_positions('billing', 'orders');
RESET ROLE;
SELECT count(*) AS touched FROM idempotency.positions WHERE part = 0 AND updated_at > now() - interval '1 day';

-- ------------------------------------------------------------ locks
-- Each position or producer a transaction assigns, advances, checks or
-- imports keeps a lock, in the lock table every session shares, until the
-- transaction ends: at most max_locks_per_transaction of them (before
-- 0.4.0 was released, one idem_assign of 15,000 partitions filled the
-- table, and other roles' calls and new connections failed with 53200).
-- The next one is refused with 53000, and only this transaction fails.
SET ROLE regress_idem_stream_a;
SELECT current_setting('max_locks_per_transaction')::int AS budget \gset
-- one assignment of more: refused, nothing stored
SELECT pg_temp.try(format($$SELECT count(*) FROM idem_assign('wide', 'orders', ARRAY(SELECT generate_series(0, %s)), 1)$$, :budget));
SELECT count(*) FROM idem_positions('wide', 'orders');
BEGIN;
-- a savepoint rolled back gives its locks back
SAVEPOINT s;
SELECT count(*) = :budget AS all_assigned FROM idem_assign('wide', 'orders', ARRAY(SELECT generate_series(1, :budget)), 1);
ROLLBACK TO SAVEPOINT s;
-- and so does every refusal caught in a subtransaction (the lock it took
-- goes with it): here twice the budget of stale generations
DO $$
DECLARE
  refused int := 0;
BEGIN
  FOR p IN 1..2 * current_setting('max_locks_per_transaction')::int LOOP
    BEGIN
      PERFORM idem_advance('billing', 'orders', 0, p, p, 1);
    EXCEPTION WHEN SQLSTATE 'ID001' THEN
      refused := refused + 1;
    END;
  END LOOP;
  RAISE NOTICE 'refused and caught: % times the budget', refused / current_setting('max_locks_per_transaction')::int;
END $$;
SELECT count(*) = :budget AS all_assigned FROM idem_assign('wide', 'orders', ARRAY(SELECT generate_series(1001, 1000 + :budget)), 1);
-- at the limit: a partition it holds is taken again, a new one is refused,
-- and producer sequences count too
SELECT * FROM idem_advance('wide', 'orders', 1001, 0, 9, 1);
SELECT pg_temp.try($$SELECT * FROM idem_advance('wide', 'orders', 0, 0, 9, 1)$$);
SELECT pg_temp.try($$SELECT idem_sequence('wide', 'producer', 1, 1)$$);
COMMIT;
SELECT count(*) = :budget AS all_kept FROM idem_positions('wide', 'orders');
RESET ROLE;

-- ------------------------------------------------------------ look-alikes
-- The stream statements run as the storage owner.  A role that puts
-- look-alike operators and tables first on its path (and in pg_temp), in a
-- new session where the statements are prepared for the first time, does
-- not change what they do: no look-alike runs, the right rows move.
CREATE SCHEMA regress_idem_evil AUTHORIZATION regress_idem_stream_a;
\c -
SET ROLE regress_idem_stream_a;
CREATE FUNCTION regress_idem_evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike text = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = text, rightarg = text, function = regress_idem_evil.eq);
CREATE FUNCTION regress_idem_evil.oideq(oid, oid) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'look-alike oid = ran'; RETURN true; END$$;
CREATE OPERATOR regress_idem_evil.= (leftarg = oid, rightarg = oid, function = regress_idem_evil.oideq);
CREATE TABLE regress_idem_evil.positions (role regrole, consumer text, stream text, part int,
  next_offset bigint, generation bigint, updated_at timestamptz);
CREATE TEMP TABLE positions (LIKE regress_idem_evil.positions);
SET search_path = regress_idem_evil, pg_catalog;
SELECT * FROM idem_advance('billing', 'orders', 0, 600, 609, 2);
SELECT part, next_offset FROM idem_positions('billing', 'orders');
SELECT idem_sequence('ingest', 'producer-1', 3, 1);
SELECT (SELECT count(*) FROM regress_idem_evil.positions) AS evil_rows,
       (SELECT count(*) FROM pg_temp.positions) AS temp_rows;
RESET search_path;
DROP TABLE pg_temp.positions;
RESET ROLE;
DROP SCHEMA regress_idem_evil CASCADE;

-- ------------------------------------------------------------ direct rows
-- The rows are read and written without SQL (src/keyed_rows.c).  Calls of
-- one statement see each other's writes: each advances past the one before,
-- and a repeated sequence number is a duplicate.
SET ROLE regress_idem_stream_a;
SELECT g, a.* FROM generate_series(0, 2) AS g,
  LATERAL idem_advance('scratch', 'orders', 3, g * 10, g * 10 + 19, 1) AS a;
SELECT s, idem_sequence('scratch', 'producer-9', 1, s) FROM (VALUES (1), (1), (2), (4)) AS v(s);
-- a row updated in every call stays on its page (HOT updates, the page
-- pruned before each read): 500 calls, each its own transaction, would
-- leave 500 row versions, five pages' worth, if the dead ones piled up
DO $$
BEGIN
  FOR i IN 1..500 LOOP
    PERFORM idem_advance('scratch', 'hot', 0, i * 10, i * 10 + 9);
    COMMIT;
  END LOOP;
END $$;
SELECT part, next_offset FROM idem_positions('scratch', 'hot');
RESET ROLE;
SELECT pg_relation_size('idempotency.positions') <= 2 * 8192 AS stays_on_its_page;
-- a DBA's change of the table is refused, in a session that used the
-- table before too: the check is made again after the table's relcache
-- invalidation (src/keyed_rows.c, IdemKeyedOpen)
ALTER TABLE idempotency.positions DROP CONSTRAINT positions_pkey;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6000, 6009);
RESET ROLE;
ALTER TABLE idempotency.positions ADD PRIMARY KEY (role, consumer, stream, part);
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6000, 6009);
RESET ROLE;
-- so is a column whose type a DBA changed: the values are formed and read
-- as the extension's types, and a bigint taken for a numeric or a text
-- ended the server (SIGSEGV); nothing is written
ALTER TABLE idempotency.positions ALTER COLUMN generation TYPE numeric;
ALTER TABLE idempotency.sequences ALTER COLUMN seq TYPE text USING seq::text;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6010, 6019);
SELECT * FROM idem_assign('scratch', 'hot', ARRAY[0], 1);
SELECT idem_sequence('scratch', 'producer-9', 1, 5);
RESET ROLE;
ALTER TABLE idempotency.positions ALTER COLUMN generation TYPE bigint;
ALTER TABLE idempotency.sequences ALTER COLUMN seq TYPE bigint USING seq::bigint;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6010, 6019);
SELECT idem_sequence('scratch', 'producer-9', 1, 5);
RESET ROLE;
-- a column a DBA added is refused too (the statements gave it its
-- default, which the direct writes do not know), and once it is dropped
-- again the table is the extension's (before, it was refused for good:
-- a dropped column still counts among the table's attributes)
ALTER TABLE idempotency.positions ADD COLUMN note text;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6010, 6019);
RESET ROLE;
ALTER TABLE idempotency.positions DROP COLUMN note;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6015, 6024);
SELECT * FROM idem_advance('scratch', 'dropped', 0, 0, 9);
SELECT * FROM idem_advance('scratch', 'dropped', 0, 5, 14);
RESET ROLE;
-- an update is refused, as an UPDATE statement is, when the table
-- publishes updates without a replica identity: no subscriber could apply
-- it (before, the row was updated and the subscription stopped)
ALTER TABLE idempotency.positions REPLICA IDENTITY NOTHING;
SET client_min_messages = error;	-- (the warning about wal_level)
CREATE PUBLICATION regress_idem_positions FOR TABLE idempotency.positions;
RESET client_min_messages;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'hot', 0, 6020, 6029);
-- a new row is an INSERT, which needs no replica identity
SELECT * FROM idem_advance('scratch', 'published', 0, 0, 9);
RESET ROLE;
SELECT stream, next_offset FROM idempotency.positions WHERE consumer = 'scratch' AND part = 0 ORDER BY 1;
DROP PUBLICATION regress_idem_positions;
ALTER TABLE idempotency.positions REPLICA IDENTITY DEFAULT;
-- a DBA's maintenance of the table between calls: each call finds its row
-- (the version its backend remembers is checked, never trusted, after a
-- rewrite), indexes added are kept complete, a trigger is not fired
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'dba', 0, 0, 9);
RESET ROLE;
VACUUM FULL idempotency.positions;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'dba', 0, 5, 19);
RESET ROLE;
CLUSTER idempotency.positions USING positions_pkey;
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'dba', 0, 15, 29);
RESET ROLE;
REINDEX TABLE CONCURRENTLY idempotency.positions;
CREATE INDEX regress_idem_hash ON idempotency.positions USING hash (stream);
CREATE INDEX regress_idem_next ON idempotency.positions (next_offset) WHERE part = 0;
CREATE FUNCTION pg_temp.regress_idem_trigger() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'trigger fired'; RETURN NEW; END$$;
CREATE TRIGGER regress_idem_trigger BEFORE INSERT OR UPDATE ON idempotency.positions
  FOR EACH ROW EXECUTE FUNCTION pg_temp.regress_idem_trigger();
SET ROLE regress_idem_stream_a;
SELECT * FROM idem_advance('scratch', 'dba', 0, 25, 39);
SELECT * FROM idem_advance('scratch', 'dba', 1, 0, 9);
RESET ROLE;
SET enable_seqscan = off;
SELECT stream, part, next_offset FROM idempotency.positions
 WHERE stream = 'dba' ORDER BY part;
SELECT count(*) AS by_next_offset FROM idempotency.positions
 WHERE part = 0 AND next_offset = 40;
RESET enable_seqscan;
DROP TRIGGER regress_idem_trigger ON idempotency.positions;
DROP INDEX idempotency.regress_idem_hash, idempotency.regress_idem_next;

-- ------------------------------------------------------------ dropped roles
-- A dropped role's positions and sequences go at the next maintenance run:
-- rows are keyed by the role's OID, which a role made later can get again,
-- and would then start its streams from the dropped role's offsets (before,
-- they stayed until unused for position_ttl)
CREATE ROLE regress_idem_stream_gone;
SET ROLE regress_idem_stream_gone;
SELECT * FROM idem_advance('gone', 'orders', 0, 0, 9);
SELECT idem_sequence('gone', 'producer-1', 1, 1);
RESET ROLE;
SELECT oid AS gone_oid FROM pg_roles WHERE rolname = 'regress_idem_stream_gone' \gset
DROP ROLE regress_idem_stream_gone;
SELECT (SELECT count(*) FROM idempotency.positions WHERE role::oid = :gone_oid) AS positions,
       (SELECT count(*) FROM idempotency.sequences WHERE role::oid = :gone_oid) AS sequences;
SELECT count(*) AS rows_before FROM idempotency.positions \gset
SELECT partitions_created >= 0 AS ran FROM idem_maintain();
SELECT (SELECT count(*) FROM idempotency.positions WHERE role::oid = :gone_oid) AS positions,
       (SELECT count(*) FROM idempotency.sequences WHERE role::oid = :gone_oid) AS sequences;
-- every other role's rows stay
SELECT count(*) = :rows_before - 1 AS others_kept FROM idempotency.positions;

-- The cutoff maintenance deletes by is written into its statement in a
-- form no setting of the caller's changes (ISO, with its UTC offset, read
-- back under pinned settings): a caller of idem_maintain() (a grantee, or
-- pg_cron's session with a database's settings) whose DateStyle reads
-- dates day first and whose TimeZone is far from UTC deletes no position
-- used within position_ttl.  The cutoff is set to the 12th of January of
-- last year: read month first, "12/01" would be the 1st of December, and
-- every position unused since then would go.
SELECT extract(epoch FROM now() - (date_trunc('year', now()) - interval '1 year' + interval '11 days'))::int AS cutoff_ttl \gset
SELECT idempotency.import_position(ROW('regress_idem_stream_a', 'styled', 'orders', p, 0, NULL,
         date_trunc('year', now()) - interval '1 year' + interval '11 days' + d)::idempotency.position_record)
  FROM (VALUES (0, interval '1 day'), (1, interval '-1 day')) AS v(p, d);
SET idempotency.position_ttl = :cutoff_ttl;
SET DateStyle = 'SQL, DMY';
SET TimeZone = 'Asia/Kathmandu';
SELECT partitions_created >= 0 AS ran FROM idem_maintain();
RESET DateStyle;
RESET TimeZone;
RESET idempotency.position_ttl;
-- the position used after the cutoff stays, the one unused since goes
SELECT part FROM idempotency.positions WHERE consumer = 'styled' ORDER BY part;

DROP EXTENSION idempotency;
DROP ROLE regress_idem_stream_a, regress_idem_stream_b;
