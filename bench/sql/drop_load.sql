-- bench/drop.sh steady load: one idempotency key claimed and completed and one
-- message consumed per transaction, fresh random key and id every time, with
-- ttl :ttl (set by drop.sh with pgbench -D ttl=...), far beyond the
-- partitions the benchmark drops
\set k random(1, 9223372036854775806)
BEGIN;
SELECT status FROM idem_claim('k' || :k, '{"amount": 100, "currency": "eur"}', ttl => :ttl);
SELECT idem_complete('k' || :k, 201, '{"charge": 1}');
SELECT idem_consume_message('load', 'm' || :k, :ttl);
COMMIT;
