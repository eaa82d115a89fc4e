--
-- A key claimed and completed, checkpointed or released by the same SQL
-- statement (a CTE, or two calls in one select list), and claimed twice in
-- one statement.  The second call must see the row the first one wrote.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

BEGIN;
WITH c AS (SELECT (idem_claim('same-1', '{"a": 1}')).status)
SELECT c.status, idem_complete('same-1', 201, '{"ok": true}') AS completed FROM c;
COMMIT;
SELECT status, response_code, response_body FROM idem_claim('same-1', '{"a": 1}');

BEGIN;
SELECT (idem_claim('same-2')).status, idem_release('same-2') AS released;
COMMIT;
SELECT status FROM idem_lookup('same-2');

SELECT (c).status, idem_checkpoint('same-3', 'step-1', token => (c).token) AS checkpointed
  FROM (SELECT idem_claim('same-3', lease => '1 minute') AS c) s;
SELECT status, recovery_point FROM idem_lookup('same-3');

-- two claims of one key in one statement: the second sees the first
BEGIN;
SELECT (idem_claim('same-4')).status AS first, (idem_claim('same-4')).status AS second;
SELECT idem_release('same-4');
COMMIT;

-- a fresh claim after a release, in the statement that released it
BEGIN;
SELECT (idem_claim('same-5')).status;
SELECT idem_release('same-5') AS released, (idem_claim('same-5')).status AS again;
SELECT idem_complete('same-5', 200);
COMMIT;
SELECT status FROM idem_lookup('same-5');

-- the same message id twice in one statement: once
SELECT idem_consume_message('same', 'm-1') AS first, idem_consume_message('same', 'm-1') AS second;

-- idem_lookup() sees a claim made earlier in its own statement
BEGIN;
WITH c AS (SELECT (idem_claim('same-6', lease => '1 minute')).status)
SELECT c.status AS claimed, l.status AS looked_up
  FROM c, LATERAL (SELECT status FROM idem_lookup('same-6') WHERE c.status IS NOT NULL) l;
ROLLBACK;
