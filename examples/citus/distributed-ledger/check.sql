-- examples/citus/distributed-ledger/check.sql -- per tenant, the ledger
-- rows (read through Citus, i.e. the tenant's shards) match its payments
-- and its applied events, and its stream position the offsets it processed.
SELECT (SELECT count(*) FROM idempotency.keys) AS key_rows, (SELECT count(*) FROM payments) AS payments,
       (SELECT count(*) FROM idempotency.messages) AS message_rows, (SELECT count(*) FROM applied) AS applied;
DO $$
DECLARE t text; a bigint; b bigint; c bigint; d bigint; bad int := 0;
BEGIN
  FOR t IN SELECT DISTINCT tenant FROM payments UNION SELECT DISTINCT tenant FROM applied LOOP
    SELECT count(*) INTO a FROM idempotency.keys WHERE tenant = t;
    SELECT count(*) INTO b FROM payments WHERE tenant = t;
    SELECT count(*) INTO c FROM idempotency.messages WHERE tenant = t;
    SELECT count(*) INTO d FROM applied WHERE tenant = t;
    IF a <> b OR c <> d THEN
      bad := bad + 1;
      RAISE NOTICE 'tenant %: % key rows, % payments, % message rows, % applied', t, a, b, c, d;
    END IF;
  END LOOP;
  RAISE NOTICE 'tenants whose ledger rows differ from their payments or applied events: %', bad;
  IF bad > 0 THEN
    RAISE EXCEPTION 'the ledger rows of % tenants do not match their payments and events', bad;
  END IF;
END $$;
-- per tenant, its stream position (read through Citus: the tenant's shard
-- of idempotency.tenant_positions) is one past the last offset processed,
-- every offset up to it was processed, and none twice; its producer
-- sequence (idempotency.tenant_sequences) is that of the last batch
DO $$
DECLARE t text; pos bigint; cnt bigint; mx bigint; dups bigint; sq bigint; bad int := 0;
BEGIN
  FOR t IN SELECT DISTINCT tenant FROM processed LOOP
    SELECT p.next_offset INTO pos FROM idempotency.tenant_positions AS p
     WHERE p.tenant = t AND p.consumer = 'ledger-consumer' AND p.stream = 'payments:' || t AND p.part = 0;
    SELECT s.seq INTO sq FROM idempotency.tenant_sequences AS s
     WHERE s.tenant = t AND s.consumer = 'ledger-consumer' AND s.producer = 'producer:' || t;
    SELECT count(*), max(off), count(*) - count(DISTINCT off) INTO cnt, mx, dups
      FROM processed WHERE tenant = t;
    IF pos IS DISTINCT FROM cnt OR pos IS DISTINCT FROM mx + 1 OR dups <> 0
       OR sq IS DISTINCT FROM mx / 5 THEN
      bad := bad + 1;
      RAISE NOTICE 'tenant %: stream position %, % offsets processed (% twice), the last %, producer sequence %', t, pos, cnt, dups, mx, sq;
    END IF;
  END LOOP;
  RAISE NOTICE 'tenants whose stream position differs from the offsets they processed: %', bad;
  IF bad > 0 THEN
    RAISE EXCEPTION 'the stream positions of % tenants do not match the offsets processed', bad;
  END IF;
END $$;
