--
-- Bad input: every misuse is a clean error with its SQLSTATE, and nothing is
-- written by a call that fails.
--
CREATE EXTENSION IF NOT EXISTS idempotency;

-- runs a statement and reports SQLSTATE and message instead of failing.
-- PostgreSQL 17 gives the unit in a setting's valid range ("1 s .. 2 s");
-- it is masked so that one expected output serves every major
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '\(([-0-9]+) [a-z]+ \.\. ([-0-9]+) [a-z]+\)', '(\1 .. \2)');
END $$;

SELECT idem_consume_message('errors', 'baseline');
SELECT count(*) AS rows_before FROM idempotency.messages \gset

-- NULL and empty arguments
SELECT pg_temp.try($$SELECT idem_consume_message(NULL, 'x')$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', NULL)$$);
SELECT pg_temp.try($$SELECT idem_consume_message('', 'x')$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', '')$$);
SELECT pg_temp.try($$SELECT idem_consume_messages(NULL, ARRAY['x'])$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', NULL)$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY['x', NULL])$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY['x', ''])$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY[['x'], ['y']])$$);

-- over the length limit (255 bytes by default), in bytes not characters
SELECT pg_temp.try($$SELECT idem_consume_message('c', repeat('x', 255))$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', repeat('x', 256))$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', repeat('é', 128))$$);
SELECT pg_temp.try($$SELECT idem_consume_message(repeat('c', 256), 'x')$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY['ok', repeat('x', 300)])$$);
SET idempotency.max_key_length = 8;
SELECT pg_temp.try($$SELECT idem_consume_message('c', '123456789')$$);
RESET idempotency.max_key_length;

-- ttl not positive, or over idempotency.max_ttl
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ttl', interval '0')$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ttl', interval '-1 hour')$$);
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ttl', interval '31 days')$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY['ttl'], interval '-1 second')$$);
SET idempotency.max_ttl = '1h';
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ttl', interval '2 hours')$$);
-- the default ttl itself over the limit
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ttl')$$);
RESET idempotency.max_ttl;

-- read-only transactions
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'ro')$$);
SELECT pg_temp.try($$SELECT idem_consume_messages('c', ARRAY['ro'])$$);
SELECT pg_temp.try($$SELECT idem_maintain()$$);
COMMIT;

-- nothing was written by any failed call: the one row is the accepted
-- 255-byte id above
SELECT count(*) - :rows_before AS rows_written FROM idempotency.messages;

-- invalid settings
SELECT pg_temp.try($$SET idempotency.partition_interval = 0$$);
SELECT pg_temp.try($$SET idempotency.partition_interval = '-1h'$$);
SELECT pg_temp.try($$SET idempotency.message_ttl = 'forever'$$);
SELECT pg_temp.try($$SET idempotency.max_key_length = 0$$);
SELECT pg_temp.try($$SET idempotency.premake = 65$$);
SELECT pg_temp.try($$SET idempotency.no_such_setting = 1$$);

-- ordinary roles may consume but not maintain, nor change storage settings
CREATE ROLE regress_idem_errors;
SET ROLE regress_idem_errors;
SELECT pg_temp.try($$SELECT idem_consume_message('c', 'as-ordinary-role')$$);
SELECT pg_temp.try($$SELECT idem_maintain()$$);
SELECT pg_temp.try($$SET idempotency.partition_interval = '1h'$$);
SELECT pg_temp.try($$SET idempotency.message_ttl = '1h'$$);
RESET ROLE;
DROP ROLE regress_idem_errors;
