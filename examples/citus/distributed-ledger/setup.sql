-- examples/citus/distributed-ledger/setup.sql -- PROTOTYPE for issue 37:
-- the key ledger distributed by Citus, co-located with the payments.
-- Run on the coordinator (psql -v w1host=... -v w1port=...), after CREATE
-- EXTENSION citus on every node and citus_set_coordinator_host(); run.sh
-- adds the second worker later, under load.
\set ON_ERROR_STOP 1
SELECT citus_add_node(:'w1host', :w1port);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, key text NOT NULL, amount numeric NOT NULL,
                       id bigserial, created_at timestamptz NOT NULL DEFAULT now(),
                       PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
-- The ledger, made here by the extension (idem_maintain() makes the table
-- and its partitions ahead), then distributed by the scope (kept_scope
-- stands in for the design's tenant column) and co-located with payments.
-- Its partitions get a replica identity, so that Citus can move them
-- logically (and 'auto', the rebalancer's default, does not refuse).
SELECT * FROM idem_maintain();
DO $$
DECLARE p regclass;
BEGIN
  FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass LOOP
    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', p);
  END LOOP;
END $$;
SELECT create_distributed_table('idempotency.keys', 'kept_scope', colocate_with => 'payments');
-- The handler: one delegated function per request, run on the tenant's
-- worker.  No tenant_shard_here(): the extension checks the shard itself.
CREATE FUNCTION create_payment(tenant text, key text, amount numeric,
                               OUT status text, OUT response_body jsonb)
RETURNS record LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE claim record; payment bigint;
BEGIN
  SELECT c.status, c.response_body INTO claim
    FROM idem_claim(create_payment.key, request => jsonb_build_object('amount', create_payment.amount),
                    scope => create_payment.tenant) AS c;
  IF claim.status = 'claimed' THEN
    INSERT INTO public.payments (tenant, key, amount)
    VALUES (create_payment.tenant, create_payment.key, create_payment.amount)
    RETURNING id INTO payment;
    status := 'created';
    response_body := jsonb_build_object('payment_id', payment, 'node', current_setting('port'));
    PERFORM idem_complete(create_payment.key, 201, response_body, scope => create_payment.tenant);
  ELSE
    status := claim.status; response_body := claim.response_body;
  END IF;
END $$;
SELECT create_distributed_function('create_payment(text,text,numeric)', 'tenant', colocate_with => 'payments');
