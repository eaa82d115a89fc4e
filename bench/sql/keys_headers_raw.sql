\set r random(1, 9223372036854775806)
BEGIN;
SELECT status FROM idem_claim('k' || :r, '{"amount": 100, "currency": "eur"}');
SELECT idem_complete('k' || :r, 201, response_headers => '{"Location": "/charges/1", "Content-Type": "text/csv"}', response_raw => '\x6368617267652c310a');
COMMIT;
