--
-- idem_consume_message / idem_consume_messages: the processed-message ledger
--
CREATE EXTENSION idempotency;

-- storage is made on first use, not by CREATE EXTENSION
SELECT to_regclass('idempotency.messages') IS NULL AS no_storage_yet;

-- the first call may be a batch of more ids than max_locks_per_transaction
-- (64 here): it makes the ledger, and other writers wait for that, not for
-- a lock per id (0.3.1 failed: "too many keys written into partitions made
-- by this transaction")
SHOW max_locks_per_transaction;
BEGIN;
SELECT count(*) AS new_ids
  FROM idem_consume_messages('first-batch', ARRAY(SELECT 'id-' || g FROM generate_series(1, 500) g));
ROLLBACK;
SELECT to_regclass('idempotency.messages') IS NULL AS rolled_back_with_it;

-- first delivery is new, a redelivery is not
SELECT idem_consume_message('billing', 'msg-1');
SELECT idem_consume_message('billing', 'msg-1');
SELECT to_regclass('idempotency.messages') IS NOT NULL AS storage_made;

-- consumers are independent namespaces
SELECT idem_consume_message('shipping', 'msg-1');
-- the namespace boundary is part of the identity: ('ab','c') <> ('a','bc')
SELECT idem_consume_message('ab', 'c') AS ab_c, idem_consume_message('a', 'bc') AS a_bc;

-- a rolled back delivery leaves no trace
BEGIN;
SELECT idem_consume_message('billing', 'msg-2');
ROLLBACK;
SELECT idem_consume_message('billing', 'msg-2');

-- the same message twice in one transaction: the second is a duplicate
BEGIN;
SELECT idem_consume_message('billing', 'msg-3');
SELECT idem_consume_message('billing', 'msg-3');
COMMIT;
SELECT idem_consume_message('billing', 'msg-3');

-- a rolled back savepoint takes its consumption with it
BEGIN;
SAVEPOINT s;
SELECT idem_consume_message('billing', 'msg-4');
ROLLBACK TO SAVEPOINT s;
SELECT idem_consume_message('billing', 'msg-4');
COMMIT;

-- the usual pattern: the business write happens only for a first delivery
CREATE TABLE orders (id serial PRIMARY KEY, message_id text NOT NULL, amount int NOT NULL);
INSERT INTO orders (message_id, amount)
SELECT 'msg-5', 100 WHERE idem_consume_message('orders', 'msg-5');
INSERT INTO orders (message_id, amount)
SELECT 'msg-5', 100 WHERE idem_consume_message('orders', 'msg-5');
SELECT message_id, count(*) FROM orders GROUP BY message_id;

-- the batch form returns the new ids, each once, in input order
SELECT * FROM idem_consume_messages('batch', ARRAY['a', 'b', 'a', 'c', 'b']);
SELECT * FROM idem_consume_messages('batch', ARRAY['c', 'd', 'a', 'e', 'd']);
SELECT * FROM idem_consume_messages('batch', ARRAY[]::text[]);
SELECT count(*) FROM idem_consume_messages('batch', ARRAY['a', 'b', 'c', 'd', 'e']);
-- ... and records all of them in the caller's transaction
BEGIN;
SELECT * FROM idem_consume_messages('batch', ARRAY['f', 'g']);
ROLLBACK;
SELECT * FROM idem_consume_messages('batch', ARRAY['g', 'f']);
-- singles and batches share the ledger
SELECT idem_consume_message('batch', 'g');
SELECT * FROM idem_consume_messages('batch', ARRAY['msg-1', 'h']);

-- one row per consumed message, none for duplicates
SELECT count(*) FROM idempotency.messages;

-- rows hold a digest, not the ids
SELECT count(*) FROM idempotency.messages m
 WHERE m.digest::text LIKE '%msg%' OR m.role <> 'postgres'::regrole;

-- a per-call ttl: the message can be consumed again once it expired
SELECT idem_consume_message('ttl', 'short', ttl => '1 second');
SELECT idem_consume_message('ttl', 'short', ttl => '1 second');
DO $$
BEGIN
  -- wait on the condition: every row of this test has expired
  WHILE clock_timestamp() <= (SELECT max(expires_at) FROM idempotency.messages
                               WHERE expires_at < now() + interval '1 minute') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT idem_consume_message('ttl', 'short', ttl => '1 second');
-- the expired row is still stored until its partition is dropped
SELECT count(*) FROM idempotency.messages WHERE expires_at < now() + interval '1 minute';

-- roles never see each other's messages
CREATE ROLE regress_idem_alice;
CREATE ROLE regress_idem_bob;
SET ROLE regress_idem_alice;
SELECT idem_consume_message('shared', 'm');
SELECT idem_consume_message('shared', 'm');
RESET ROLE;
SET ROLE regress_idem_bob;
SELECT idem_consume_message('shared', 'm');
-- ordinary roles cannot touch the storage
SELECT count(*) FROM idempotency.messages;
INSERT INTO idempotency.messages VALUES (now() + interval '1 day', gen_random_uuid(), 'regress_idem_alice', 256);
RESET ROLE;
SELECT role, count(*) FROM idempotency.messages
 WHERE role IN ('regress_idem_alice'::regrole, 'regress_idem_bob'::regrole)
 GROUP BY role ORDER BY role::text;
