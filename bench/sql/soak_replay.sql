-- bench/soak.sh: a key from a small key space (2,000 keys, ttl 20 s), so
-- most claims find it completed and replay the response; a claim that gets
-- 'claimed' completes it; also a lookup of the key
\set k random(1, 2000)
BEGIN;
SELECT (status = 'claimed')::int AS fresh FROM idem_claim('r' || :k, '{"amount": 100, "currency": "eur"}') \gset
\if :fresh
SELECT idem_complete('r' || :k, 201, '{"charge": 1}');
\endif
COMMIT;
SELECT status, response_code FROM idem_lookup('r' || :k);
