-- live partitions of idempotency.keys: leaves of the table whose range has
-- not ended (upper bound in the future), per the idempotency.partitions view
SELECT count(*)
FROM idempotency.partitions p
JOIN pg_partition_tree('idempotency.keys'::regclass) t ON t.relid = p.partition
WHERE p.table_name = 'keys' AND t.isleaf AND p.upper_bound > now();
