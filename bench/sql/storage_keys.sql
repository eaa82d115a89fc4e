-- storage of keys that use none of 0.4.0's features: N keys claimed and
-- completed in the same transaction with the request and response of
-- keys_idem.sql, 10,000 per transaction
DO $$
DECLARE
    n     int := current_setting('bench.rows')::int;
    i     int := 0;
BEGIN
    WHILE i < n LOOP
        i := i + 1;
        PERFORM idem_claim('s' || i, '{"amount": 100, "currency": "eur"}');
        PERFORM idem_complete('s' || i, 201, '{"charge": 1}');
        IF i % 10000 = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
END
$$;
