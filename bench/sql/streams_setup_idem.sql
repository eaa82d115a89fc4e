-- bench/streams.sh: a database of the extension's variants.  The ledger's
-- settings come from ALTER DATABASE ... SET (1 lane, 2 live partitions, as
-- bench/run.sh's idem_p2).  The 4 clients' partitions 0-3 of stream
-- 'orders' are assigned to consumer 'bench' with generation 1, and the
-- message ledger's partitions are made (a probe id).
CREATE EXTENSION idempotency;
SELECT * FROM idem_maintain();
SELECT idem_consume_message('bench-probe', 'probe');
SELECT * FROM idem_assign('bench', 'orders', ARRAY[0, 1, 2, 3], 1);
SELECT * FROM idem_maintain();
