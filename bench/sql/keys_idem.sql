\set r random(1, 9223372036854775806)
BEGIN;
SELECT status FROM idem_claim('k' || :r, '{"amount": 100, "currency": "eur"}');
SELECT idem_complete('k' || :r, 201, '{"charge": 1}');
COMMIT;
