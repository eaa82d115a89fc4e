-- test/lib/sqlsmith_setup.sql -- the database "make sqlsmith" fuzzes
-- (test/release.sh): the extension with a populated ledger, a business
-- table, an unprivileged role, and the denylist sqlsmith reads its functions
-- through.  Run by psql as a superuser, in a fresh database, on a server
-- that preloads the library with short partitions (see sqlsmith_start in
-- test/release.sh), outside a transaction block.

\set ON_ERROR_STOP 1
CREATE EXTENSION idempotency;

-- the unprivileged role sqlsmith runs as first: no superuser, no
-- membership of any predefined role, owns nothing but what it gets here
CREATE ROLE sqlsmith_user LOGIN;
GRANT CREATE ON SCHEMA public TO sqlsmith_user;

-- What sqlsmith may call: every function of the catalog except those that
-- would end its session or another (pg_terminate_backend,
-- pg_cancel_backend), spend its time doing nothing (pg_sleep*), read or
-- write the server's files (lo_import, lo_export, pg_read_file,
-- pg_read_binary_file: as superuser they could overwrite the data
-- directory or read /dev/zero into memory), or leave state behind that
-- outlives the rolled-back transaction each query runs in and holds WAL
-- (replication slots).  Everything else stays, on purpose: set_config (the
-- statement timeout sqlsmith sets is armed before a query changes it),
-- pg_reload_conf, pg_promote (an ERROR on a primary), advisory locks (the
-- extension's own lock tags are of another kind), the extension's own
-- functions and those of its schema.
--
-- sqlsmith reads the functions it may call with an unqualified
-- "SELECT ... FROM pg_proc": with this schema before pg_catalog in its
-- search_path (set in its connection string), that query reads this view.
-- A materialized one: information_schema.tables, where sqlsmith finds the
-- tables it queries, does not list those (a plain view was one more table
-- for it to query, a copy of pg_proc).
CREATE SCHEMA sqlsmith_denylist;
CREATE MATERIALIZED VIEW sqlsmith_denylist.pg_proc AS
SELECT * FROM pg_catalog.pg_proc
 WHERE proname NOT IN ('pg_terminate_backend', 'pg_cancel_backend',
                       'lo_import', 'lo_export', 'pg_read_file', 'pg_read_binary_file',
                       'pg_create_physical_replication_slot',
                       'pg_create_logical_replication_slot',
                       'pg_copy_physical_replication_slot',
                       'pg_copy_logical_replication_slot')
   AND proname NOT LIKE 'pg\_sleep%';
GRANT USAGE ON SCHEMA sqlsmith_denylist TO PUBLIC;
GRANT SELECT ON sqlsmith_denylist.pg_proc TO PUBLIC;

-- a business table written in the same transactions as the ledger, as the
-- README's examples do; sqlsmith updates and deletes in it too
CREATE TABLE public.orders (id bigserial PRIMARY KEY, message_id text, key text,
                            amount numeric, body jsonb, at timestamptz DEFAULT now());
GRANT ALL ON public.orders TO sqlsmith_user;
GRANT ALL ON SEQUENCE public.orders_id_seq TO sqlsmith_user;

-- The ledger, for the superuser and for sqlsmith_user (keys are per role):
-- completed keys with responses, open two-phase claims with checkpoints,
-- released keys, claims whose lease has lapsed, consumed messages (single
-- and batches), each with a long ttl (they outlive the run) and with a
-- short one (their partitions end and are dropped during the run).
CREATE PROCEDURE public.sqlsmith_populate(tag text, ttl interval)
LANGUAGE plpgsql AS $$
DECLARE
	g int;
	t bigint;
BEGIN
	FOR g IN 1 .. 100 LOOP
		-- same-transaction mode: claim, the business write, complete
		PERFORM idem_claim(tag || '-done-' || g, jsonb_build_object('n', g), ttl => ttl);
		INSERT INTO public.orders (key, amount, body) VALUES (tag || '-done-' || g, g, jsonb_build_object('n', g));
		PERFORM idem_complete(tag || '-done-' || g, 200 + g % 3, jsonb_build_object('charge', g, 'tag', tag));
		COMMIT;
	END LOOP;
	FOR g IN 1 .. 40 LOOP
		-- two-phase mode: a committed claim with a lease, a checkpoint;
		-- a quarter released, a quarter completed, the rest left open
		SELECT token INTO t FROM idem_claim(tag || '-2p-' || g, jsonb_build_object('n', g),
		                                    scope => 'two-phase', ttl => ttl,
		                                    lease => least(ttl, interval '10 minutes'));
		COMMIT;
		PERFORM idem_checkpoint(tag || '-2p-' || g, 'step-' || g, scope => 'two-phase', token => t);
		COMMIT;
		IF g % 4 = 0 THEN
			PERFORM idem_release(tag || '-2p-' || g, scope => 'two-phase', token => t);
		ELSIF g % 4 = 1 THEN
			PERFORM idem_complete(tag || '-2p-' || g, 201, jsonb_build_object('step', g),
			                      scope => 'two-phase', token => t);
		END IF;
		COMMIT;
	END LOOP;
	FOR g IN 1 .. 20 LOOP
		-- leases that lapse during the run
		PERFORM idem_claim(tag || '-lapsed-' || g, scope => 'two-phase', ttl => ttl, lease => '1 second');
		COMMIT;
	END LOOP;
	FOR g IN 1 .. 100 LOOP
		IF idem_consume_message(tag || '-billing', 'msg-' || g, ttl) THEN
			INSERT INTO public.orders (message_id, amount) VALUES ('msg-' || g, g);
		END IF;
		COMMIT;
	END LOOP;
	PERFORM idem_consume_messages(tag || '-batch',
	                              ARRAY(SELECT 'b-' || s FROM generate_series(1, 500) s), ttl);
	COMMIT;
END
$$;

-- the long ttls outlive every pass (test/release.sh checks the superuser's
-- keys and messages at the end): a day
CALL public.sqlsmith_populate('su', '1 day');
CALL public.sqlsmith_populate('su-short', '2 seconds');
-- security invoker: the keys are sqlsmith_user's
SET ROLE sqlsmith_user;
CALL public.sqlsmith_populate('user', '1 day');
CALL public.sqlsmith_populate('user-short', '2 seconds');
RESET ROLE;
-- not for sqlsmith to call
DROP PROCEDURE public.sqlsmith_populate(text, interval);
