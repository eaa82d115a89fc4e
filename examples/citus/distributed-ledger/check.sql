-- examples/citus/distributed-ledger/check.sql -- per tenant, the ledger
-- rows (read through Citus, i.e. the tenant's shards) match its payments
-- and its applied events.
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
