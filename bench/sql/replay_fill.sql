-- 100,000 completed keys r1..r100000 in both designs (same request body)
SELECT count(*) FROM (
  SELECT idem_claim('r' || g, '{"amount": 100, "currency": "eur"}', lease => '1 hour')
    FROM generate_series(1, 100000) g) s;
SELECT count(*) FROM (
  SELECT idem_complete('r' || g, 201, '{"charge": 1}', token => (idem_lookup('r' || g)).token)
    FROM generate_series(1, 100000) g) s;
SELECT count(*) FROM (
  SELECT pl_claim('r' || g, '{"amount": 100, "currency": "eur"}') FROM generate_series(1, 100000) g) s;
SELECT count(*) FROM (
  SELECT pl_complete('r' || g, 201, '{"charge": 1}') FROM generate_series(1, 100000) g) s;
