-- bench/streams.sh, bytes on disk of design :design (psql -v design=...)
-- as the load left them (no VACUUM of ours: HOT pruning and autovacuum
-- included); one line: rows|total bytes|heap bytes|index bytes|relations
-- (total = heap + indexes + TOAST; the ledger summed over the leaf
-- partitions of idempotency.messages, as bench/sql/storage_sizes.sql does)
SELECT :'design' = 'advance' AS is_advance, :'design' = 'ledger' AS is_ledger \gset
\if :is_advance
SELECT (SELECT count(*) FROM idempotency.positions),
       pg_total_relation_size('idempotency.positions'),
       pg_relation_size('idempotency.positions'),
       pg_indexes_size('idempotency.positions'), 1;
\elif :is_ledger
SELECT (SELECT count(*) FROM idempotency.messages),
       coalesce(sum(pg_total_relation_size(relid)), 0),
       coalesce(sum(pg_relation_size(relid)), 0),
       coalesce(sum(pg_indexes_size(relid)), 0),
       count(*) FILTER (WHERE pg_total_relation_size(relid) > 0)
FROM pg_partition_tree('idempotency.messages'::regclass) WHERE isleaf;
\else
SELECT (SELECT count(*) FROM offsets),
       pg_total_relation_size('offsets'),
       pg_relation_size('offsets'),
       pg_indexes_size('offsets'), 1;
\endif
