-- bench/streams.sh, bytes on disk: records bench.first_record .. bench.end_record - 1
-- through design bench.design (advance | ledger | offsets), bench.batch
-- records per call, one transaction per call.  Record r of batch
-- j = r / bench.batch is offset r of partition j % 4 (offsets grow in each
-- partition, with gaps, as in a topic whose partitions share a producer);
-- the ledger's ids are 'p<partition>-<offset>', as in streams_ledger.sql.
DO $$
DECLARE
    design text := current_setting('bench.design');
    r      bigint := current_setting('bench.first_record')::bigint;
    stop   bigint := current_setting('bench.end_record')::bigint;
    batch  bigint := current_setting('bench.batch')::bigint;
    last   bigint;
    p      int;
BEGIN
    WHILE r < stop LOOP
        last := least(r + batch - (r % batch), stop) - 1;
        p := ((r / batch) % 4)::int;
        IF design = 'advance' THEN
            PERFORM * FROM idem_advance('bench', 'orders', p, r, last, 1);
        ELSIF design = 'ledger' THEN
            PERFORM count(*) FROM idem_consume_messages('bench',
                ARRAY(SELECT 'p' || p || '-' || g FROM generate_series(r, last) g));
        ELSIF design = 'offsets' THEN
            INSERT INTO offsets (consumer, stream, part, next_offset) VALUES ('bench', 'orders', p, last + 1)
            ON CONFLICT (consumer, stream, part)
            DO UPDATE SET next_offset = greatest(offsets.next_offset, EXCLUDED.next_offset);
        ELSE
            RAISE EXCEPTION 'unknown design %', design;
        END IF;
        COMMIT;
        r := last + 1;
    END LOOP;
END
$$;
