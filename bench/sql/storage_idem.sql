-- storage: N random UUID ids through idem_consume_messages, 10,000 per batch,
-- one transaction per batch
DO $$
DECLARE
    n     int := current_setting('bench.rows')::int;
    done  int := 0;
    k     int;
BEGIN
    WHILE done < n LOOP
        k := least(10000, n - done);
        PERFORM count(*) FROM idem_consume_messages('bench',
            ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, k)));
        COMMIT;
        done := done + k;
    END LOOP;
END
$$;
