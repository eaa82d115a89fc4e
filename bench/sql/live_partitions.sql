-- live partitions of idempotency.messages: leaves of the table whose range
-- has not ended (upper bound in the future), per the idempotency.partitions view
SELECT count(*)
FROM idempotency.partitions p
JOIN pg_partition_tree('idempotency.messages'::regclass) t ON t.relid = p.partition
WHERE t.isleaf AND p.upper_bound > now();
