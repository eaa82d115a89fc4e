-- examples/citus/move.sql -- move a shard with its tenants' idempotency
-- ledger.  Run on the coordinator, as a superuser, after schema.sql.
--
--   SELECT * FROM move_tenant_shard(102008, 'worker-2', 5432);
--
-- Citus moves a shard's rows, not the rows of each worker's own ledger: a
-- retry after a plain citus_move_shard_placement() finds no key on the new
-- node and pays again.  This does the move and carries the ledger in one
-- coordinator transaction:
--
--   1. citus_move_shard_placement(..., 'block_writes') copies the shard
--      group and switches its placement.  Until this transaction commits it
--      holds the shards' metadata locks on every node: it first waits for
--      the calls running on the tenants (each holds the lock in SHARE mode,
--      see tenant_shard_here() in schema.sql), and calls that start after
--      wait for the commit.  So from here on no ledger row of these
--      tenants changes on the source, and none is read on the target.
--   2. The tenants of the shard group are read from the source placement.
--   3. The target pulls their live keys (scope = tenant) and consumed
--      message ids (consumer = 'events:' || tenant) straight from the
--      source, with idempotency.export_keys() / export_messages() there
--      and idempotency.import_key() / import_message() here (dblink), and
--      commits them.
--   4. COMMIT: the placement switches on every node at once.  The calls
--      that waited on the source find their tenant gone and refuse with
--      40001; their clients retry, and the retries run on the target, which
--      has every key and id by then.
--
-- If anything fails, the whole move rolls back; rows already imported on
-- the target stay there unused (an import never makes a key older, so a
-- later move brings them up to date).  The source keeps its copy of the
-- ledger rows until they expire; no call reaches them any more.
--
-- The rebalancer (rebalance_table_shards, citus_rebalance_start) moves
-- shards in transactions of its own and cannot carry the ledger: plan with
-- get_rebalance_table_shards_plan() and run each of its moves with this.

CREATE FUNCTION move_tenant_shard(shard bigint, target_host text,
                                  target_port integer,
                                  OUT tenants integer,
                                  OUT keys_imported bigint,
                                  OUT messages_imported bigint)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    src      record;
    src_conn text;
    tgt_conn text;
    scopes   text[];
    consumers text[];
    key_cols text;
    msg_cols text;
BEGIN
    SELECT n.nodename, n.nodeport INTO src
      FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
     WHERE p.shardid = shard;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'shard % does not exist', shard;
    END IF;
    src_conn := format('host=%s port=%s dbname=%s user=%s', src.nodename,
                       src.nodeport, current_database(), current_user);
    tgt_conn := format('host=%s port=%s dbname=%s user=%s', target_host,
                       target_port, current_database(), current_user);

    -- 1. move, holding writes on the shard group until we commit
    PERFORM citus_move_shard_placement(shard, src.nodename, src.nodeport,
                                       target_host, target_port,
                                       shard_transfer_mode := 'block_writes');

    -- 2. the tenants of the shard group, from its placement on the source
    SELECT coalesce(array_agg(DISTINCT t.tenant), '{}') INTO scopes
      FROM dblink(src_conn,
                  format('SELECT tenant FROM public.%I UNION SELECT tenant FROM public.%I',
                         'payments_' || shard,
                         'events_' || (SELECT s.shardid FROM pg_dist_shard s
                                        WHERE s.logicalrelid = 'public.events'::regclass
                                          AND s.shardminvalue = (SELECT shardminvalue FROM pg_dist_shard
                                                                  WHERE shardid = shard))))
           AS t(tenant text);
    tenants := cardinality(scopes);
    SELECT coalesce(array_agg('events:' || s), '{}') INTO consumers
      FROM unnest(scopes) AS s;

    -- 3. the target pulls their ledger rows from the source, and commits;
    --    the column lists are those of the installed version's record types
    --    (0.4.0 added columns to idempotency.key_record), so this function
    --    outlives an ALTER EXTENSION UPDATE
    SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod),
                      ', ' ORDER BY a.attnum) INTO key_cols
      FROM pg_attribute a
     WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'idempotency.key_record'::regtype)
       AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod),
                      ', ' ORDER BY a.attnum) INTO msg_cols
      FROM pg_attribute a
     WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'idempotency.message_record'::regtype)
       AND a.attnum > 0 AND NOT a.attisdropped;
    SELECT count(*) INTO keys_imported
      FROM dblink(tgt_conn, format(
             $q$SELECT idempotency.import_key(k)
                  FROM dblink(%L, %L) AS k(%s)$q$,
             src_conn,
             format('SELECT * FROM idempotency.export_keys(%L)', scopes),
             key_cols))
           AS r(outcome text)
     WHERE r.outcome IN ('inserted', 'replaced');
    SELECT count(*) INTO messages_imported
      FROM dblink(tgt_conn, format(
             $q$SELECT idempotency.import_message(m)
                  FROM dblink(%L, %L) AS m(%s)$q$,
             src_conn,
             format('SELECT * FROM idempotency.export_messages(%L)', consumers),
             msg_cols))
           AS r(outcome text)
     WHERE r.outcome = 'inserted';
    -- 4. the caller's COMMIT switches the placement
END
$$;

COMMENT ON FUNCTION move_tenant_shard(bigint, text, integer) IS
    'moves a shard group to another worker together with its tenants'' idempotency keys and consumed message ids';
