-- sizes after VACUUM ANALYZE + CHECKPOINT; one line each:
-- kind|rows|total bytes|heap bytes|index bytes|relations
SELECT 'plain', (SELECT count(*) FROM plain_messages),
       pg_total_relation_size('plain_messages'),
       pg_relation_size('plain_messages'),
       pg_indexes_size('plain_messages'), 1;
SELECT 'idem', (SELECT count(*) FROM idempotency.messages),
       coalesce(sum(pg_total_relation_size(relid)), 0),
       coalesce(sum(pg_relation_size(relid)), 0),
       coalesce(sum(pg_indexes_size(relid)), 0),
       count(*) FILTER (WHERE pg_total_relation_size(relid) > 0)
FROM pg_partition_tree('idempotency.messages'::regclass) WHERE isleaf;
