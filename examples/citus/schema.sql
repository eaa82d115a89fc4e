-- examples/citus/schema.sql -- the payments service on a Citus cluster.
--
-- Run it on the coordinator, as a superuser, once the workers are added
-- (citus_add_node) and the application role "app" exists:
--
--   psql -X -v ON_ERROR_STOP=1 -d postgres -f examples/citus/schema.sql
--
-- Citus propagates CREATE EXTENSION idempotency (and dblink) to every
-- worker, and runs each call of create_payment() and apply_event() on the
-- worker that holds the tenant's shard ("delegation"): claim, business
-- write and completion are one local transaction there, against that
-- worker's own ledger and outbox.  move_tenant_shard() (move.sql) moves a
-- shard with its tenants' ledger rows, key memory and outbox.

CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE EXTENSION IF NOT EXISTS dblink;

-- The business tables, distributed by tenant and co-located.  No UNIQUE
-- (tenant, key) on purpose: the ledger keeps payments single, and the test
-- counts rows to prove it.
CREATE TABLE payments (
    tenant     text          NOT NULL,
    key        text          NOT NULL,
    amount     numeric(12,2) NOT NULL,
    id         bigserial,
    created_at timestamptz   NOT NULL DEFAULT now()
);
CREATE TABLE events (
    tenant     text          NOT NULL,
    event_id   text          NOT NULL,
    amount     numeric(12,2) NOT NULL,
    applied_at timestamptz   NOT NULL DEFAULT now()
);
SELECT create_distributed_table('payments', 'tenant', shard_count := 8);
SELECT create_distributed_table('events', 'tenant', colocate_with := 'payments');
GRANT SELECT, INSERT ON payments, events TO app;
GRANT USAGE ON SEQUENCE payments_id_seq TO app;

-- tenant_shard_here(table, tenant): the shard of the tenant, after making
-- sure it is on this node and holding it there until this transaction ends.
--
-- A shard move (move_tenant_shard() below, citus_move_shard_placement in
-- block_writes mode) takes the shard's metadata lock in EXCLUSIVE mode on
-- every node until it commits; this takes it in SHARE mode.  So a move
-- waits for the calls in progress on the tenant, and a call that starts
-- during a move waits for it to end, then finds the shard gone and refuses:
-- its client retries, and Citus sends the retry to the new node, whose
-- ledger has the tenant's keys by then.  A call that runs anywhere but on
-- the node of the tenant's shard (not delegated: inside a transaction block
-- on the coordinator, or distributed by another argument) refuses too, so
-- a claim can never go to one node's ledger while the write goes to
-- another's.
--
-- SECURITY DEFINER: lock_shard_metadata() is for the owner of the table.
CREATE FUNCTION tenant_shard_here(tbl regclass, tenant text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
DECLARE
    shard bigint := get_shard_id_for_distribution_column(tbl, tenant);
    holder text;
BEGIN
    PERFORM lock_shard_metadata(5, ARRAY[shard]);
    -- a fresh snapshot after the lock: a move that just committed is seen
    IF EXISTS (SELECT 1 FROM pg_dist_placement p
                 JOIN pg_dist_local_group l ON l.groupid = p.groupid
                WHERE p.shardid = shard) THEN
        RETURN shard;
    END IF;
    SELECT n.nodename || ':' || n.nodeport INTO holder
      FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
     WHERE p.shardid = shard;
    IF citus_is_coordinator() THEN
        RAISE EXCEPTION 'call for tenant "%" was not delegated to its worker', tenant
              USING ERRCODE = 'feature_not_supported',
                    DETAIL = format('The tenant''s shard %s is on %s.', shard, holder),
                    HINT = 'Call the function alone, outside a transaction block, with the tenant as its distribution argument.';
    END IF;
    RAISE EXCEPTION 'tenant "%" is not on this node', tenant
          USING ERRCODE = 'serialization_failure',
                DETAIL = format('The tenant''s shard %s is on %s.', shard, holder),
                HINT = 'Retry: the tenant has moved, and the retry goes to its new node.';
END
$$;

-- create_payment: the whole request handler, run where the tenant lives.
--   status 'created' (201), 'replayed' (the stored response), 'mismatch'
--   (422: the key was used with another request), 'in_progress' (409),
--   'expired' (409: the key ran and expired, and is remembered:
--   idempotency.key_memory).  A payment publishes its event to the outbox
--   topic 'payments:<tenant>' in the same transaction.
-- Every table is schema-qualified: Citus does not carry the caller's
-- search_path to the worker that runs a delegated call.
CREATE FUNCTION create_payment(tenant text, key text, request jsonb,
                               amount numeric,
                               OUT status text, OUT response_code int,
                               OUT response_body jsonb)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    claim   record;
    payment bigint;
BEGIN
    PERFORM public.tenant_shard_here('public.payments', create_payment.tenant);

    SELECT c.status, c.response_code, c.response_body INTO claim
      FROM idem_claim(create_payment.key, request => create_payment.request,
                      scope => create_payment.tenant, wait => true) AS c;

    IF claim.status = 'claimed' THEN
        INSERT INTO public.payments (tenant, key, amount)
        VALUES (create_payment.tenant, create_payment.key, create_payment.amount)
        RETURNING id INTO payment;
        status := 'created';
        response_code := 201;
        response_body := jsonb_build_object('payment_id', payment,
                                            'tenant', create_payment.tenant,
                                            'amount', create_payment.amount);
        -- the payment's event, for the tenant's relays (its outbox topic
        -- names the tenant, so the event moves with it: move.sql)
        PERFORM idem_publish('payments:' || create_payment.tenant,
                             response_body, key => create_payment.key);
        PERFORM idem_complete(create_payment.key, response_code, response_body,
                              scope => create_payment.tenant);
    ELSIF claim.status = 'completed' THEN
        status := 'replayed';
        response_code := claim.response_code;
        response_body := claim.response_body;
    ELSIF claim.status = 'mismatch' THEN
        status := 'mismatch';
        response_code := 422;
    ELSE
        status := claim.status;
        response_code := 409;
    END IF;
END
$$;

-- apply_event: a queue consumer's handler.  The consumer is per tenant
-- ("events:<tenant>"), so a tenant's consumed ids move with it.  true: the
-- event was applied now; false: it had been applied before.
CREATE FUNCTION apply_event(tenant text, event_id text, amount numeric)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
BEGIN
    PERFORM public.tenant_shard_here('public.events', apply_event.tenant);
    IF NOT idem_consume_message('events:' || apply_event.tenant, apply_event.event_id) THEN
        RETURN false;
    END IF;
    INSERT INTO public.events (tenant, event_id, amount)
    VALUES (apply_event.tenant, apply_event.event_id, apply_event.amount);
    RETURN true;
END
$$;

SELECT create_distributed_function('create_payment(text,text,jsonb,numeric)',
                                   distribution_arg_name := 'tenant',
                                   colocate_with := 'payments');
SELECT create_distributed_function('apply_event(text,text,numeric)',
                                   distribution_arg_name := 'tenant',
                                   colocate_with := 'payments');

REVOKE ALL ON FUNCTION tenant_shard_here(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION create_payment(text, text, jsonb, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION apply_event(text, text, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tenant_shard_here(regclass, text) TO app;
GRANT EXECUTE ON FUNCTION create_payment(text, text, jsonb, numeric) TO app;
GRANT EXECUTE ON FUNCTION apply_event(text, text, numeric) TO app;
