-- test/upgrade/strip_attver.sql -- run in every database of a cluster of
-- Debian's PostgreSQL 15.20 or 17.12 before it is moved to 18.6.
--
-- Those releases store an attribute option "pg_attver" on every column of
-- every table; pg_dump carries it (ALTER TABLE ... ALTER COLUMN ... SET
-- (pg_attver=...)), and PostgreSQL 18.6 does not know it, so pg_restore and
-- pg_upgrade into 18.6 fail for any database that has a table, with or
-- without this extension: 'unrecognized parameter "pg_attver"'.  Until the
-- newer major knows the option, it has to go from the old cluster's
-- catalogs first (README, "Supported versions").  Prints how many columns
-- had it.
SET allow_system_table_mods = on;
WITH stripped AS (
  UPDATE pg_catalog.pg_attribute
     SET attoptions = (SELECT pg_catalog.array_agg(o)
                         FROM pg_catalog.unnest(attoptions) AS o
                        WHERE o NOT LIKE 'pg_attver=%')
   WHERE attoptions::text LIKE '%pg_attver=%'
  RETURNING 1)
SELECT count(*) AS pg_attver_stripped FROM stripped;
RESET allow_system_table_mods;
