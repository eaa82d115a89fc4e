-- extension, 1000 ids per transaction
SELECT count(*) FROM idem_consume_messages('bench', ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1,1000)));
