-- bench/streams.sh, offsets_B: the hand-written offsets table, one upsert per
-- transaction covering B records (the offsets as in streams_advance.sql)
\set n :n + 1
\set first :base + (:n - 1) * :B
\set next :first + :B
INSERT INTO offsets (consumer, stream, part, next_offset) VALUES ('bench', 'orders', :client_id, :next)
ON CONFLICT (consumer, stream, part) DO UPDATE SET next_offset = greatest(offsets.next_offset, EXCLUDED.next_offset);
