-- bench/drop.sh: fill one partition of idempotency.messages with
-- current_setting('bench.rows') random UUID ids through idem_consume_messages,
-- 10,000 per batch, one transaction per batch.  Every batch gets the ttl that
-- makes its rows expire at current_setting('bench.expires_at'), so all rows
-- land in the one partition whose range holds that instant, however long the
-- fill takes.
DO $$
DECLARE
    n       int := current_setting('bench.rows')::int;
    target  timestamptz := current_setting('bench.expires_at')::timestamptz;
    done    int := 0;
    k       int;
BEGIN
    WHILE done < n LOOP
        IF target - clock_timestamp() < interval '2 s' THEN
            RAISE EXCEPTION 'fill too slow: % of % rows recorded, and their expiry % is less than 2 s away',
                done, n, target
                USING HINT = 'Set DROP_FILL_SECONDS to more than one fill takes.';
        END IF;
        k := least(10000, n - done);
        PERFORM count(*) FROM idem_consume_messages('fill',
            ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, k)),
            target - clock_timestamp());
        COMMIT;
        done := done + k;
    END LOOP;
END
$$;
