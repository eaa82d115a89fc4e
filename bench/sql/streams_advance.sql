-- bench/streams.sh, advance_B: one idem_advance per transaction covering the
-- next B offsets of the client's own partition (:client_id, assigned with
-- generation 1 at set-up).  :n counts this client's transactions (pgbench
-- keeps a client's variables from one transaction to the next; -D n=0);
-- :base is larger in each pgbench run than any offset of the runs before,
-- so batches never overlap and every call moves its position.
\set n :n + 1
\set first :base + (:n - 1) * :B
\set last :first + :B - 1
SELECT first_offset, last_offset FROM idem_advance('bench', 'orders', :client_id, :first, :last, 1);
