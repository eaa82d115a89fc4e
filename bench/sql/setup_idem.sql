-- Extension database: the partition settings come from ALTER DATABASE ... SET
-- (done by run.sh before connecting), so this session already sees them.
CREATE EXTENSION idempotency;
SELECT * FROM idem_maintain();
-- make sure the messages table exists (it may be created lazily on first use)
SELECT idem_consume_message('bench-probe', 'probe');
SELECT * FROM idem_maintain();
