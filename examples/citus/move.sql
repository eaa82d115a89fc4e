-- examples/citus/move.sql -- move a shard with its tenants' idempotency
-- ledger, key memory and outbox.  Run on the coordinator, as a superuser,
-- after schema.sql.
--
--   SELECT * FROM move_tenant_shard(102008, 'worker-2', 5432);
--
-- Citus moves a shard's rows, not the rows of each worker's own ledger: a
-- retry after a plain citus_move_shard_placement() finds no key on the new
-- node and pays again.  This does the move and carries the tenants' rows
-- of the extension in one coordinator transaction:
--
--   1. citus_move_shard_placement(..., 'block_writes') copies the shard
--      group and switches its placement.  Until this transaction commits it
--      holds the shards' metadata locks on every node: it first waits for
--      the calls running on the tenants (each holds the lock in SHARE mode,
--      see tenant_shard_here() in schema.sql), and calls that start after
--      wait for the commit.  So from here on no ledger row, remembered key
--      or outbox event of these tenants changes on the source, and none is
--      read on the target.
--   2. The tenants of the shard group are read from the source placement.
--   3. The target pulls, in one transaction, every part of an export that
--      idempotency.export_manifest() lists, in its order, straight from the
--      source, read there in one snapshot (dblink): each tenant's live keys
--      and the keys it remembers after they expired (scope = tenant),
--      its consumed message ids, remembered ids, stream positions and
--      producer sequences (consumer = 'events:' || tenant), and its outbox
--      (topic = 'payments:' || tenant): its relays, the events they have
--      not delivered, in the order to import them, and its dead letters.
--      A part this function does not know (a newer version's) stops the
--      move rather than being left behind.
--   4. COMMIT: the placement switches on every node at once.  The calls
--      that waited on the source find their tenant gone and refuse with
--      40001; their clients retry, and the retries run on the target, which
--      has every key and id by then.  The tenants' relays are started on
--      the target: each delivers there exactly what it had not
--      acknowledged on the source.
--
-- The tenants' relays must be stopped on the source before the move (the
-- shard lock does not stop them: a relay writes no business table), and the
-- key memory goes along only where idempotency.key_memory is on, on both
-- nodes (the source exports what it remembers under its setting; the
-- target keeps nothing with 0).
--
-- If anything fails, the whole move rolls back, the target's import with
-- it.  The source keeps its copy of the ledger rows and outbox events
-- until they expire; no call reaches them any more, and no relay must read
-- them there.  A tenant that comes back finds its old copies outdated by
-- the import (an import never makes a key older, and keeps an event it
-- has already).
--
-- The rebalancer (rebalance_table_shards, citus_rebalance_start) moves
-- shards in transactions of their own and cannot carry the ledger: plan with
-- get_rebalance_table_shards_plan() and run each of its moves with this.
-- (Or distribute the ledgers: idempotency.citus_distribute(), see
-- distributed-ledger/.)

CREATE FUNCTION move_tenant_shard(shard bigint, target_host text,
                                  target_port integer,
                                  OUT tenants integer,
                                  OUT keys_imported bigint,
                                  OUT messages_imported bigint,
                                  OUT imported jsonb)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    src       record;
    src_conn  text;
    tgt_conn  text;
    scopes    text[];
    consumers text[];
    topics    text[];
    part      record;
    selection text[];
    cols      text;
    ordered   boolean;
    script    text;
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
    SELECT coalesce(array_agg('events:' || s), '{}'),
           coalesce(array_agg('payments:' || s), '{}')
      INTO consumers, topics
      FROM unnest(scopes) AS s;

    -- 3. the script the target runs, one transaction (the statements of
    --    one query string): a connection to the source, one snapshot there
    --    for every export, then each part of the manifest in its order,
    --    imported from the source's export of the tenants' rows.  Column
    --    lists are those of the installed version's record types, so this
    --    function outlives an ALTER EXTENSION UPDATE (Citus updates every
    --    node with the coordinator).  dblink() returns the last statement's
    --    rows; the others' are dropped, so each is one text column.
    script := format($s$SELECT dblink_connect('source', %L);
SELECT dblink_exec('source', 'BEGIN ISOLATION LEVEL REPEATABLE READ');
CREATE TEMP TABLE moved (part text, written bigint);
$s$, src_conn);
    FOR part IN
        SELECT m.part, m.record_type,
               (SELECT format('%I.%I', n.nspname, p.proname)
                  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE p.oid = m.export_function) AS export_fn,
               (SELECT format('%I.%I', n.nspname, p.proname)
                  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE p.oid = m.import_function) AS import_fn
          FROM idempotency.export_manifest() AS m
         ORDER BY m.import_order
    LOOP
        selection := CASE
            WHEN part.part IN ('keys', 'key_memory') THEN scopes
            WHEN part.part IN ('messages', 'message_memory', 'positions', 'sequences') THEN consumers
            WHEN part.part IN ('outbox_relays', 'outbox_events', 'outbox_dead_letters') THEN topics
        END;
        IF selection IS NULL OR part.export_fn IS NULL OR part.import_fn IS NULL THEN
            RAISE EXCEPTION 'move_tenant_shard() does not know which rows of part "%" of an export are a tenant''s', part.part
                  USING HINT = 'The extension exports more than this function carries: teach it how that part is selected.';
        END IF;
        SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod),
                          ', ' ORDER BY a.attnum),
               bool_or(a.attname = 'ord')
          INTO cols, ordered
          FROM pg_attribute a
         WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE oid = part.record_type)
           AND a.attnum > 0 AND NOT a.attisdropped;
        -- written: what the import stored (not what this node had already,
        -- nor what expired meanwhile); the outbox's events in their "ord"
        script := script || format(
            $s$INSERT INTO moved
SELECT %L, count(*) FILTER (WHERE s.outcome IN ('inserted', 'replaced'))
  FROM (SELECT %s(r) AS outcome FROM dblink('source', %L) AS r(%s)%s) AS s;
$s$,
            part.part, part.import_fn,
            format('SELECT * FROM %s(%L)', part.export_fn, selection),
            cols, CASE WHEN ordered THEN ' ORDER BY r.ord' ELSE '' END);
    END LOOP;
    script := script || $s$SELECT dblink_disconnect('source');
SELECT jsonb_object_agg(part, written)::text FROM moved;
$s$;
    SELECT r.moved::jsonb INTO imported FROM dblink(tgt_conn, script) AS r(moved text);
    keys_imported := (imported ->> 'keys')::bigint;
    messages_imported := (imported ->> 'messages')::bigint;
    -- 4. the caller's COMMIT switches the placement
END
$$;

COMMENT ON FUNCTION move_tenant_shard(bigint, text, integer) IS
    'moves a shard group to another worker together with its tenants'' idempotency keys, consumed message ids, key memory, stream positions and outbox';
