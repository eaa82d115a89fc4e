-- sizes of the key ledger after VACUUM FULL, ANALYZE and CHECKPOINT; one
-- line: rows|heap bytes|index bytes|TOAST bytes|relations|tuple bytes
-- (pgstattuple's tuple_len: headers, null bitmaps and data of the live
-- rows, without line pointers and page free space; NA without pgstattuple)
SELECT (SELECT count(*) FROM idempotency.keys),
       coalesce(sum(pg_relation_size(relid)), 0),
       coalesce(sum(pg_indexes_size(relid)), 0),
       coalesce(sum(pg_total_relation_size(relid) - pg_relation_size(relid)
                    - pg_indexes_size(relid)), 0),
       count(*) FILTER (WHERE pg_relation_size(relid) > 0),
       CASE WHEN to_regprocedure('pgstattuple(regclass)') IS NULL THEN 'NA'
            ELSE (SELECT sum((s).tuple_len)::text
                  FROM (SELECT pgstattuple(t.relid) AS s
                        FROM pg_partition_tree('idempotency.keys'::regclass) t
                        WHERE t.isleaf) x) END
FROM pg_partition_tree('idempotency.keys'::regclass) WHERE isleaf;
