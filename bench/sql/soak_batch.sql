-- bench/soak.sh: a batch of 100 ids from 1,000,000, some already consumed
SELECT count(*) FROM idem_consume_messages('soak-batch',
    ARRAY(SELECT 'b' || floor(random() * 1000000)::int FROM generate_series(1, 100)));
