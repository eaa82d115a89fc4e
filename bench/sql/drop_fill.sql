-- bench/drop.sh: fill one partition of idempotency.messages with
-- current_setting('bench.rows') random UUID ids through idem_consume_messages,
-- one transaction per batch.  Every batch gets the ttl that makes its rows
-- expire at current_setting('bench.expires_at'), so that they land in the
-- one partition whose range holds that instant (its upper bound is
-- current_setting('bench.upper')), however long the fill takes.
--
-- A record's ttl counts from when that record is written, so the rows of a
-- batch that takes longer than the room left above bench.expires_at (a slow
-- or busy machine) would expire past the upper bound, in the next
-- partition.  Each batch is checked for that in a subtransaction: if any
-- of its rows went past the upper bound, the batch is rolled back and tried
-- again at half the size.  No batch size is assumed to be fast enough.
DO $$
DECLARE
    n       int := current_setting('bench.rows')::int;
    target  timestamptz := current_setting('bench.expires_at')::timestamptz;
    upper   timestamptz := current_setting('bench.upper')::timestamptz;
    done    int := 0;
    k       int := 10000;
    beyond  bigint;
    after   bigint;
BEGIN
    WHILE done < n LOOP
        IF target - clock_timestamp() < interval '2 s' THEN
            RAISE EXCEPTION 'fill too slow: % of % rows recorded, and their expiry % is less than 2 s away',
                done, n, target
                USING HINT = 'Set DROP_FILL_SECONDS to more than one fill takes.';
        END IF;
        k := least(k, n - done);
        BEGIN
            SELECT count(*) INTO beyond FROM idempotency.messages
             WHERE expires_at >= upper;
            PERFORM count(*) FROM idem_consume_messages('fill',
                ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, k)),
                target - clock_timestamp());
            SELECT count(*) INTO after FROM idempotency.messages
             WHERE expires_at >= upper;
            IF after > beyond THEN
                RAISE EXCEPTION USING ERRCODE = 'IDFIL',
                    MESSAGE = format('%s of a batch of %s ids expire past %s', after - beyond, k, upper);
            END IF;
            done := done + k;
        EXCEPTION WHEN SQLSTATE 'IDFIL' THEN
            IF k = 1 THEN
                RAISE EXCEPTION 'fill too slow: one id took longer than the % s left before %',
                    round(extract(epoch FROM upper - target), 3), upper;
            END IF;
            RAISE NOTICE '%: batch rolled back, next batches of % ids', SQLERRM, k / 2;
            k := k / 2;
        END;
        COMMIT;
    END LOOP;
END
$$;
