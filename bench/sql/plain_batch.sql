-- (extra) plain baseline for the batch: 1000 random UUID ids per transaction
INSERT INTO plain_messages(consumer, message_id)
SELECT 'bench', gen_random_uuid()::text FROM generate_series(1,1000) ON CONFLICT DO NOTHING;
