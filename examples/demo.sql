-- examples/demo.sql -- an idempotent queue consumer with the idempotency
-- extension.  Run by examples/demo.sh (psql -a echoes every line).
--
-- At-least-once brokers (Kafka, SQS, RabbitMQ, pgmq) redeliver messages.
-- The consumer records "message processed" in the SAME transaction as its
-- business write, so both commit or roll back together: a redelivered
-- message is skipped, a delivery whose transaction rolled back is processed
-- again on redelivery.

\set ON_ERROR_STOP on
\set QUIET on
\pset pager off
\set QUIET off
SET client_min_messages = warning;

CREATE EXTENSION idempotency;

CREATE TABLE orders (
    id         bigserial PRIMARY KEY,
    message_id text          NOT NULL,
    customer   text          NOT NULL,
    amount     numeric(10,2) NOT NULL
);

-- 1. First delivery of msg-42.  idem_consume_message() returns true: this
--    transaction is the one that processes the message.
BEGIN;
SELECT idem_consume_message('billing', 'msg-42') AS process_it;
INSERT INTO orders (message_id, customer, amount) VALUES ('msg-42', 'alice', 19.99);
COMMIT;

-- 2. The broker redelivers msg-42 (say the ack was lost).  Now the call
--    returns false: skip the business logic and ack.
BEGIN;
SELECT idem_consume_message('billing', 'msg-42') AS process_it;
COMMIT;

--    The same check can guard the write itself in one statement: the
--    INSERT happens only on the first delivery.  Here: INSERT 0 0.
BEGIN;
INSERT INTO orders (message_id, customer, amount)
SELECT 'msg-42', 'alice', 19.99
 WHERE idem_consume_message('billing', 'msg-42');
COMMIT;

-- 3. msg-43 arrives, the order is written, then the consumer fails and the
--    transaction rolls back: the order AND the "consumed" mark disappear.
BEGIN;
INSERT INTO orders (message_id, customer, amount)
SELECT 'msg-43', 'bob', 5.00
 WHERE idem_consume_message('billing', 'msg-43')
RETURNING message_id, customer;
ROLLBACK;

--    So when msg-43 is redelivered it is processed (INSERT 0 1), exactly once.
BEGIN;
INSERT INTO orders (message_id, customer, amount)
SELECT 'msg-43', 'bob', 5.00
 WHERE idem_consume_message('billing', 'msg-43')
RETURNING message_id, customer;
COMMIT;

-- 4. Each consumer has its own ledger: another service may process msg-42 too.
SELECT idem_consume_message('shipping', 'msg-42') AS shipping_processes_it;

-- 5. Batches: idem_consume_messages() records every id of the batch and
--    returns only the new ones, each once, in input order.  msg-42 and
--    msg-43 are done already and msg-44 appears twice, so two orders are
--    written: msg-44 and msg-45.
BEGIN;
INSERT INTO orders (message_id, customer, amount)
SELECT m.id, 'carol', 7.50
  FROM idem_consume_messages('billing',
           ARRAY['msg-42', 'msg-44', 'msg-43', 'msg-45', 'msg-44']) AS m(id)
RETURNING message_id;
COMMIT;

--    The whole batch redelivered: nothing is new.
SELECT * FROM idem_consume_messages('billing',
           ARRAY['msg-42', 'msg-43', 'msg-44', 'msg-45']) AS new_ids;

-- 6. Every message was applied exactly once.
SELECT message_id, count(*) AS times_applied
  FROM orders GROUP BY message_id ORDER BY message_id;
SELECT count(*) AS orders FROM orders;

DO $$
BEGIN
    IF (SELECT count(*) FROM orders) <> 4
       OR EXISTS (SELECT FROM orders GROUP BY message_id HAVING count(*) > 1) THEN
        RAISE EXCEPTION 'demo failed: a message was not applied exactly once';
    END IF;
END
$$;

-- 7. Housekeeping.  Consumed ids expire after idempotency.message_ttl (7 days
--    by default, or the ttl argument); expired ones go away by dropping whole
--    partitions.  With shared_preload_libraries = 'idempotency' a background
--    worker does this; otherwise call idem_maintain(), e.g. from pg_cron:
--      SELECT cron.schedule('idempotency', '* * * * *', 'SELECT idem_maintain()');
SELECT * FROM idem_maintain();
SELECT count(*) AS partitions FROM idempotency.partitions;
\x on
SELECT * FROM idempotency.partitions LIMIT 2;
\x off
