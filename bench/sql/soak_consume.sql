-- bench/soak.sh: one message id from 20,000, so some are redeliveries
\set m random(1, 20000)
SELECT idem_consume_message('soak', 'm' || :m);
