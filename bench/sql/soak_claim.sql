-- bench/soak.sh: a fresh key claimed and completed in one transaction
\set k random(1, 9223372036854775806)
BEGIN;
SELECT status FROM idem_claim('c' || :k, '{"amount": 100, "currency": "eur"}');
SELECT idem_complete('c' || :k, 201, '{"charge": 1}');
COMMIT;
