-- Key-ledger database (keys_idem, and the replay database): the settings come
-- from ALTER DATABASE ... SET idempotency.key_ttl / partition_interval /
-- premake = 0 (done by run.sh before connecting), so this session sees them.
CREATE EXTENSION idempotency;
SELECT * FROM idem_maintain();
-- one same-transaction claim + complete, so a broken key ledger fails here
BEGIN;
SELECT status FROM idem_claim('bench-probe', '{"probe": true}');
SELECT idem_complete('bench-probe', 200);
COMMIT;
SELECT * FROM idem_maintain();
