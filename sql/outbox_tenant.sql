--
-- The outbox with a tenant (0.5.0, issue 37): idem_publish(),
-- idem_outbox_next(), idem_outbox_ack() and idem_outbox_dead_letter() take
-- the tenant in overloads of their own, with every argument.  Without
-- idempotency.tenant_events and the relays' tables (made by
-- idempotency.citus_distribute() on a Citus coordinator), the tenant is
-- not used: the event goes to the node's own outbox, the relay reads it
-- (the tenant and seq columns NULL), and a dead letter is recorded as
-- without a tenant.  test/t/038 and examples/citus/distributed-ledger
-- prove the distributed outbox on Citus.
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

CREATE ROLE regress_idem_outbox_tenant;
SET ROLE regress_idem_outbox_tenant;

-- published with a tenant: into the node's own outbox
SELECT idem_publish('tenant-topic', '{"n": 1}', NULL, NULL, NULL, 'acme') IS NOT NULL AS published;
SELECT idem_publish('tenant-topic', '{"n": 2}', 'k', '{"h": "v"}', NULL, NULL) IS NOT NULL AS published;
SELECT idem_publish('tenant-topic', NULL, NULL, NULL, '\x01'::bytea, 'globex') IS NOT NULL AS published;
-- the checks of the call without a tenant hold
SELECT pg_temp.try($$SELECT idem_publish('tenant-topic', '{"n": 3}', NULL, NULL, '\x01'::bytea, 'acme')$$);
SELECT pg_temp.try($$SELECT idem_publish(NULL, '{"n": 3}', NULL, NULL, NULL, 'acme')$$);
SELECT pg_temp.try($$SELECT idem_publish('tenant-topic', '{"n": 3}', NULL, '{"h": 1}', NULL, 'acme')$$);
-- the relay with a tenant reads them, tenant and seq NULL; the same batch
-- until acknowledged, by either form
SELECT batch, payload, key, headers, payload_raw, tenant, seq
  FROM idem_outbox_next('tenant-relay', 'tenant-topic', 10, NULL, 'acme');
SELECT batch, payload FROM idem_outbox_next('tenant-relay', 'tenant-topic');
-- a dead letter with a tenant is the one without it
SELECT idem_outbox_dead_letter('tenant-relay', 'tenant-topic',
       (SELECT event_id FROM idem_outbox_next('tenant-relay', 'tenant-topic', 10, NULL, 'acme')
         WHERE payload->>'n' = '2'), 'gone', 2, 'acme');
SELECT payload, reason, attempts FROM idem_outbox_dead_letters('tenant-relay', 'tenant-topic');
SELECT idem_outbox_ack('tenant-relay', 'tenant-topic', 1, NULL, 'acme');
SELECT idem_outbox_ack('tenant-relay', 'tenant-topic', 1, NULL, NULL);
SELECT count(*) FROM idem_outbox_next('tenant-relay', 'tenant-topic', 10, NULL, NULL);
-- the generation fence of the relay without a tenant
SELECT count(*) FROM idem_outbox_next('tenant-relay', 'tenant-topic', 10, 3, 'acme');
SELECT pg_temp.try($$SELECT * FROM idem_outbox_next('tenant-relay', 'tenant-topic', 10, 2, 'acme')$$);
SELECT pg_temp.try($$SELECT idem_outbox_ack('tenant-relay', 'tenant-topic', 2, NULL, 'acme')$$);
-- the overloads have no defaults: a call naming the tenant passes every argument
SELECT pg_temp.try($$SELECT idem_publish('tenant-topic', tenant => 'acme')$$);
RESET ROLE;
SELECT topic, payload FROM idempotency.outbox WHERE topic = 'tenant-topic' ORDER BY ev_id;

-- the relay's row goes with the role (maintenance would delete it)
DELETE FROM idempotency.outbox_relays WHERE role = 'regress_idem_outbox_tenant'::regrole;
DELETE FROM idempotency.outbox_dead_letters WHERE role = 'regress_idem_outbox_tenant'::regrole;
DROP OWNED BY regress_idem_outbox_tenant;
DROP ROLE regress_idem_outbox_tenant;
