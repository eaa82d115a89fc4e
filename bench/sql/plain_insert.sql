-- (a) plain baseline: one random UUID id per transaction into an ordinary table
INSERT INTO plain_messages(consumer, message_id) VALUES ('bench', gen_random_uuid()::text) ON CONFLICT DO NOTHING;
