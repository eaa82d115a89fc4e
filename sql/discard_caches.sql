--
-- Calls with debug_discard_caches = 1: every cache entry discarded at every
-- chance.  Only a server built with assertions takes the setting; elsewhere
-- it stays 0 and these are ordinary calls (the same output either way).
-- Every call must end: up to 0.4.0 in development, a call that probed the
-- ledgers never did there, as IdemOpenLivePartitions started over whenever
-- the partition caches had moved while it locked the partitions, and with
-- every cache discarded at each lock taken they always had.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
DO $$
BEGIN
  PERFORM set_config('debug_discard_caches', '1', false);
EXCEPTION WHEN invalid_parameter_value THEN
  NULL;  -- a server without assertions
END $$;
-- a call that does not end fails the test instead of hanging it
SET statement_timeout = '300s';

SELECT idem_consume_message('discard-caches', 'm-1') AS first,
       idem_consume_message('discard-caches', 'm-1') AS again;
SELECT * FROM idem_consume_messages('discard-caches', ARRAY['m-1', 'm-2', 'm-3', 'm-2']);
BEGIN;
SELECT status FROM idem_claim('discard-caches', '{"a": 1}');
SELECT idem_complete('discard-caches', 201, '{"ok": true}');
COMMIT;
SELECT status, response_code, response_body FROM idem_claim('discard-caches', '{"a": 1}');
SELECT status, response_code FROM idem_lookup('discard-caches');

RESET statement_timeout;
RESET debug_discard_caches;
