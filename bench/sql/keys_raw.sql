\set r random(1, 9223372036854775806)
BEGIN;
INSERT INTO raw_keys (key, status) VALUES ('k' || :r, 'in_progress') ON CONFLICT DO NOTHING;
UPDATE raw_keys SET status = 'completed', response_code = 201, response_body = '{"charge": 1}' WHERE key = 'k' || :r;
COMMIT;
