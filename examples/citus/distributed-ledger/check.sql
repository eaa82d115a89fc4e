SELECT (SELECT count(*) FROM idempotency.keys) AS ledger_rows, (SELECT count(*) FROM payments) AS payments;
DO $$
DECLARE t text; a bigint; b bigint; bad int := 0;
BEGIN
  FOREACH t IN ARRAY array['acme','t00','t01','t02','t03','t04','t05','t06','t07','t08','t09','t10','t11','t12','t13','t14','t15','t16','t17','t18','t19','t20','t21','t22','t23'] LOOP
    SELECT count(*) INTO a FROM idempotency.keys WHERE kept_scope = t;
    SELECT count(*) INTO b FROM payments WHERE tenant = t;
    IF a <> b THEN bad := bad + 1; RAISE NOTICE 'tenant %: % ledger rows, % payments', t, a, b; END IF;
  END LOOP;
  RAISE NOTICE 'tenants whose ledger rows (read through their shard) differ from their payments: %', bad;
  IF bad > 0 THEN
    RAISE EXCEPTION 'the ledger rows of % tenants do not match their payments', bad;
  END IF;
END $$;
