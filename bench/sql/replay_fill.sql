-- completed keys r1..rN in both designs (same request body), N =
-- current_setting('bench.replay_keys') (bench/run.sh: BENCH_REPLAY_KEYS)
SELECT count(*) FROM (
  SELECT idem_claim('r' || g, '{"amount": 100, "currency": "eur"}', lease => '1 hour')
    FROM generate_series(1, current_setting('bench.replay_keys')::int) g) s;
SELECT count(*) FROM (
  SELECT idem_complete('r' || g, 201, '{"charge": 1}', token => (idem_lookup('r' || g)).token)
    FROM generate_series(1, current_setting('bench.replay_keys')::int) g) s;
SELECT count(*) FROM (
  SELECT pl_claim('r' || g, '{"amount": 100, "currency": "eur"}')
    FROM generate_series(1, current_setting('bench.replay_keys')::int) g) s;
SELECT count(*) FROM (
  SELECT pl_complete('r' || g, 201, '{"charge": 1}')
    FROM generate_series(1, current_setting('bench.replay_keys')::int) g) s;
