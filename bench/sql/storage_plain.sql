-- storage: N random UUID ids into the plain table (one INSERT ... SELECT)
INSERT INTO plain_messages(consumer, message_id)
SELECT 'bench', gen_random_uuid()::text FROM generate_series(1, current_setting('bench.rows')::int);
