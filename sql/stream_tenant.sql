--
-- Stream positions and producer sequences with a tenant (0.5.0, issue
-- 37): idem_assign(), idem_advance(), idem_positions() and idem_sequence()
-- take the tenant in overloads of their own.  Without
-- idempotency.tenant_positions and tenant_sequences (made by
-- idempotency.citus_distribute() on a Citus coordinator), the tenant is not
-- used: the call is the one without it, on the node's own table.  With
-- them, the call is routed to the tenant's shard (test/t/038 and
-- examples/citus/distributed-ledger prove that on Citus); here, without
-- Citus, that is a clear error, and a NULL tenant is refused (22004).
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

CREATE ROLE regress_idem_tenant_a;
SET ROLE regress_idem_tenant_a;

-- ------------------------------------------------ not distributed: the same
-- an assignment with a tenant is the one without it
SELECT * FROM idem_assign('billing', 'orders', ARRAY[0, 1], 1, 'acme');
SELECT * FROM idem_advance('billing', 'orders', 0, 0, 99, 1, 'acme');
-- the call without a tenant sees that position: one row per partition
SELECT * FROM idem_advance('billing', 'orders', 0, 50, 149, 1);
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders', 'acme');
SELECT part, next_offset, generation FROM idem_positions('billing', 'orders');
-- another tenant's name changes nothing either (it is not used)
SELECT * FROM idem_advance('billing', 'orders', 0, 100, 160, 1, 'globex');
SELECT part, next_offset FROM idem_positions('billing', 'orders', 'globex');
-- a NULL tenant is not used either; generation NULL: an unfenced advance
SELECT * FROM idem_advance('billing', 'unfenced', 0, 0, 9, NULL, NULL);
SELECT * FROM idem_advance('billing', 'unfenced', 0, 5, 19, generation => NULL, tenant => 't');
SELECT part, next_offset, generation FROM idem_positions('billing', 'unfenced', NULL);
-- a producer's sequence with a tenant is the one without it
SELECT idem_sequence('billing', 'producer-1', 1, 1, false, 'acme');
SELECT idem_sequence('billing', 'producer-1', 1, 1);
SELECT idem_sequence('billing', 'producer-1', 1, 2, false, 'globex');
SELECT idem_sequence('billing', 'producer-1', 1, 4, strict => false, tenant => NULL);
SELECT pg_temp.try($$SELECT idem_sequence('billing', 'producer-1', 1, 6, true, 'acme')$$);
-- the checks of the calls without a tenant hold: a stale generation
SELECT pg_temp.try($$SELECT * FROM idem_assign('billing', 'orders', ARRAY[0], 0, 'acme')$$);
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 0, 0, 1, NULL, 'acme')$$);
RESET ROLE;
SELECT consumer, stream, part, next_offset, generation FROM idempotency.positions
 ORDER BY 1, 2, 3;
SELECT consumer, producer, epoch, seq FROM idempotency.sequences;

-- ------------------------------------------------ a tenant_positions table
-- idempotency.tenant_positions, as citus_distribute() makes it: a call with
-- a tenant is routed, which needs Citus (here: 55000, nothing written); a
-- NULL tenant is refused (22004); the calls without a tenant use the
-- node's own positions as before
CREATE TABLE idempotency.tenant_positions (
    role regrole NOT NULL, consumer text NOT NULL, stream text NOT NULL,
    part int4 NOT NULL, tenant text NOT NULL, next_offset int8, generation int8,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (role, consumer, stream, part, tenant));
SET ROLE regress_idem_tenant_a;
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 0, 200, 209, 1, 'acme')$$);
SELECT pg_temp.try($$SELECT * FROM idem_assign('billing', 'orders', ARRAY[0], 2, 'acme')$$);
SELECT pg_temp.try($$SELECT * FROM idem_positions('billing', 'orders', 'acme')$$);
SELECT pg_temp.try($$SELECT * FROM idem_advance('billing', 'orders', 0, 200, 209, 1, NULL)$$);
SELECT * FROM idem_advance('billing', 'orders', 0, 200, 209, 1);
RESET ROLE;
CREATE TABLE idempotency.tenant_sequences (
    role regrole NOT NULL, consumer text NOT NULL, producer text NOT NULL,
    tenant text NOT NULL, epoch int8 NOT NULL, seq int8 NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (role, consumer, producer, tenant));
SET ROLE regress_idem_tenant_a;
SELECT pg_temp.try($$SELECT idem_sequence('billing', 'producer-1', 1, 5, false, 'acme')$$);
SELECT pg_temp.try($$SELECT idem_sequence('billing', 'producer-1', 1, 5, false, NULL)$$);
SELECT idem_sequence('billing', 'producer-1', 1, 5);
RESET ROLE;
SELECT count(*) AS tenant_rows FROM idempotency.tenant_positions;
SELECT count(*) AS tenant_sequence_rows FROM idempotency.tenant_sequences;
SELECT part, next_offset FROM idempotency.positions
 WHERE consumer = 'billing' AND stream = 'orders' ORDER BY part;
-- maintenance leaves a tenant_positions table without Citus alone
SELECT partitions_created >= 0 AS ran FROM idem_maintain();
DROP TABLE idempotency.tenant_positions, idempotency.tenant_sequences;
-- and without it, a tenant call is the plain one again
SET ROLE regress_idem_tenant_a;
SELECT * FROM idem_advance('billing', 'orders', 0, 200, 219, 1, 'acme');
SELECT idem_sequence('billing', 'producer-1', 1, 6, false, 'acme');
RESET ROLE;

DROP EXTENSION idempotency;
DROP ROLE regress_idem_tenant_a;
