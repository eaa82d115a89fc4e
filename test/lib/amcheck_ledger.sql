-- test/lib/amcheck_ledger.sql -- amcheck over every ledger index: each
-- btree index of each partition of both ledgers checked against its heap
-- with bt_index_check(index, heapallindexed => true).  Run by the load tests
-- at their end (Torture::amcheck_ledger, examples_amcheck in
-- test/lib/examples.sh) and by "make amcheck" (test/release.mk), as a
-- superuser, outside a transaction block (psql -f or -c).
--
-- Maintenance (the background worker, idem_maintain()) may be dropping
-- expired partitions meanwhile: each partition is locked (ACCESS SHARE)
-- before its indexes are checked, so that it cannot go during the check,
-- and one dropped between the listing and the lock is counted as gone,
-- not as an error.  Each check commits, so that no lock is held longer
-- than one check and a drop waits for one check at most.  Any other error
-- (a corrupt index: XX002) ends the script with that error.  The last
-- NOTICE says "amcheck: N ledger indexes checked, M dropped meanwhile".
-- (not CREATE EXTENSION IF NOT EXISTS: a Citus worker refuses extension
-- DDL, even one with nothing to do, once the coordinator has propagated it)
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'amcheck') THEN
		CREATE EXTENSION amcheck;
	END IF;
END
$$;
DO $amcheck$
DECLARE
	r record;
	checked int := 0;
	gone int := 0;
BEGIN
	FOR r IN
		SELECT i.indexrelid AS idx, format('%I.%I', n.nspname, t.relname) AS tab
		  FROM idempotency.partitions p
		  JOIN pg_index i ON i.indrelid = p.partition
		  JOIN pg_class t ON t.oid = i.indrelid
		  JOIN pg_namespace n ON n.oid = t.relnamespace
		  JOIN pg_class c ON c.oid = i.indexrelid
		  JOIN pg_am am ON am.oid = c.relam
		 WHERE am.amname = 'btree' AND i.indisvalid
		 ORDER BY 1
	LOOP
		BEGIN
			EXECUTE format('LOCK TABLE %s IN ACCESS SHARE MODE', r.tab);
			IF EXISTS (SELECT FROM pg_index WHERE indexrelid = r.idx) THEN
				PERFORM bt_index_check(r.idx, true);
				checked := checked + 1;
			ELSE
				gone := gone + 1;
			END IF;
		EXCEPTION WHEN undefined_table THEN
			gone := gone + 1;
		END;
		COMMIT;
	END LOOP;
	RAISE NOTICE 'amcheck: % ledger indexes checked, % dropped meanwhile', checked, gone;
END
$amcheck$;
