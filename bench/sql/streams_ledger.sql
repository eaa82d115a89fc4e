-- bench/streams.sh, ledger_B: the per-message ledger, B message ids per
-- transaction in one idem_consume_messages call; the ids are the records'
-- offsets on the client's own partition, 'p<partition>-<offset>', each new
-- (the offsets as in streams_advance.sql)
\set n :n + 1
\set first :base + (:n - 1) * :B
\set last :first + :B - 1
SELECT count(*) FROM idem_consume_messages('bench', ARRAY(SELECT 'p' || :client_id || '-' || g FROM generate_series(:first::bigint, :last::bigint) g));
