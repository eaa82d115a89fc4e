-- examples/citus/distributed-ledger/setup.sql -- the key and message
-- ledgers distributed by Citus, co-located with the payments (issue 37).
-- Run on the coordinator (psql -v w1host=... -v w1port=... -v distribute=on),
-- after CREATE EXTENSION citus on every node and citus_set_coordinator_host();
-- run.sh adds the second worker later, under load.  With distribute=off
-- (run.sh's control) the ledgers stay each node's own, as before 0.5.0.
\set ON_ERROR_STOP 1
SELECT citus_add_node(:'w1host', :w1port);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, key text NOT NULL, amount numeric NOT NULL,
                       id bigserial, created_at timestamptz NOT NULL DEFAULT now(),
                       PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
-- what an event's consumer did, once per event (not enforced here: the
-- checks count events applied twice)
CREATE TABLE applied (tenant text NOT NULL, id text NOT NULL, n bigserial,
                      at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, n));
SELECT create_distributed_table('applied', 'tenant', colocate_with => 'payments');
-- Both ledgers distributed by tenant and co-located with payments, before
-- the first call: that is all an operator does.
\if :distribute
SELECT idempotency.citus_distribute('payments');
\endif
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
    -- the payment's event, in the tenant's outbox (distributed: numbered
    -- in the tenant's order, carried by Citus' shard operations, relayed
    -- on the coordinator by relay.py); published last, as the tenant's
    -- publishers of the topic wait for each other from here to the commit
    PERFORM idem_publish('payments', jsonb_build_object('key', create_payment.key, 'payment_id', payment),
                         create_payment.key, NULL, NULL, create_payment.tenant);
  ELSE
    status := claim.status; response_body := claim.response_body;
  END IF;
END $$;
SELECT create_distributed_function('create_payment(text,text,numeric)', 'tenant', colocate_with => 'payments');
-- The consumer of an event: applies it once (the message ledger's row in
-- the tenant's shard, written in the same transaction as "applied").
CREATE FUNCTION apply_event(tenant text, id text)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
BEGIN
  IF idem_consume_message('payment-events', apply_event.id, ttl => NULL,
                          tenant => apply_event.tenant) THEN
    INSERT INTO public.applied (tenant, id) VALUES (apply_event.tenant, apply_event.id);
    RETURN true;
  END IF;
  RETURN false;
END $$;
SELECT create_distributed_function('apply_event(text,text)', 'tenant', colocate_with => 'payments');
-- A stream per tenant (issue 37, stream positions): the consumer of
-- partition 0 of the tenant's stream "payments:<tenant>" processes each
-- batch of offsets once, recording each offset in "processed" in the same
-- transaction as idem_advance(..., tenant) moves the tenant's position (in
-- its shard of idempotency.tenant_positions when distributed; in the
-- worker's own idempotency.positions in the control, where the tenant is
-- not used: hence the tenant in the stream's name, as before 0.5.0).
CREATE TABLE processed (tenant text NOT NULL, off bigint NOT NULL, n bigserial,
                        PRIMARY KEY (tenant, n));
SELECT create_distributed_table('processed', 'tenant', colocate_with => 'payments');
-- each batch is also numbered by its producer (batch n: sequence n, epoch
-- 1): idem_sequence(..., tenant) answers new or gap for a batch not seen,
-- duplicate for one seen; the answers other than duplicate are kept here
CREATE TABLE sequenced (tenant text NOT NULL, seq bigint NOT NULL, answer text NOT NULL,
                        n bigserial, PRIMARY KEY (tenant, n));
SELECT create_distributed_table('sequenced', 'tenant', colocate_with => 'payments');
CREATE FUNCTION consume_offsets(tenant text, first_offset bigint, last_offset bigint)
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE r record; o bigint; n bigint := 0; answer text;
BEGIN
  answer := idem_sequence('ledger-consumer', 'producer:' || consume_offsets.tenant, 1,
                          consume_offsets.first_offset / 5, false, consume_offsets.tenant);
  IF answer <> 'duplicate' THEN
    INSERT INTO public.sequenced (tenant, seq, answer)
    VALUES (consume_offsets.tenant, consume_offsets.first_offset / 5, answer);
  END IF;
  FOR r IN SELECT a.first_offset AS f, a.last_offset AS l
             FROM idem_advance('ledger-consumer', 'payments:' || consume_offsets.tenant, 0,
                               consume_offsets.first_offset,
                               consume_offsets.last_offset, NULL, consume_offsets.tenant) AS a LOOP
    -- one INSERT ... VALUES per offset: Citus' INSERT ... SELECT in a
    -- delegated call just after a split failed now and then with XX000
    -- "could not find valid entry for shard" (the old shard; retried)
    FOR o IN r.f .. r.l LOOP
      INSERT INTO public.processed (tenant, off) VALUES (consume_offsets.tenant, o);
      n := n + 1;
    END LOOP;
  END LOOP;
  RETURN n;
END $$;
SELECT create_distributed_function('consume_offsets(text,bigint,bigint)', 'tenant', colocate_with => 'payments');
-- where the tenant's consumer resumes after a restart (NULL: never)
CREATE FUNCTION stream_position(tenant text)
RETURNS bigint LANGUAGE sql VOLATILE
SET search_path = pg_catalog, public
AS $$ SELECT p.next_offset
       FROM idem_positions('ledger-consumer', 'payments:' || stream_position.tenant, stream_position.tenant) AS p
      WHERE p.part = 0 $$;
SELECT create_distributed_function('stream_position(text)', 'tenant', colocate_with => 'payments');
-- The application's role, an ordinary role (run.sh makes it before this
-- script; Citus makes it on each node it adds, where it gets another
-- OID): the clients call the handlers and the relay reads the outbox as
-- this role, so that its keys, message ids, positions, sequences and
-- events moved by Citus are shown to stay its own (idempotency.role_ref).
GRANT SELECT, INSERT ON payments, applied, processed, sequenced TO idem_app;
GRANT USAGE ON SEQUENCE payments_id_seq, applied_n_seq, processed_n_seq, sequenced_n_seq TO idem_app;
