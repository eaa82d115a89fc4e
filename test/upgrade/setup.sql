-- test/upgrade/setup.sql -- the state a cluster holds before it is moved to
-- a newer PostgreSQL major (pg_upgrade, or pg_dump and pg_restore).  Run as
-- a superuser in a database with the extension; test/upgrade/verify.sql
-- checks it on the new major.
--
-- Live keys of role app: completed with a response, two-phase in progress
-- with a checkpoint, released; consumed messages; and a short-lived layout
-- whose partitions end while the cluster is moved, so that maintenance on
-- the new major has something to drop.  What verify.sql must see again is
-- kept in public.upgrade_expect (carried with the data).

\set ON_ERROR_STOP on

CREATE ROLE app;
GRANT USAGE, CREATE ON SCHEMA public TO app;
SELECT partitions_created > 0 AS made FROM idem_maintain();

CREATE TABLE public.upgrade_expect (what text PRIMARY KEY, value text NOT NULL);
GRANT SELECT ON public.upgrade_expect TO app;

SET ROLE app;

-- completed, with a response that must replay byte for byte
BEGIN;
SELECT status FROM idem_claim('paid', '{"amount": 10, "currency": "EUR"}', scope => 'acct-1');
SELECT idem_complete('paid', 201,
                     '{"charge": {"id": "ch_1", "amount": 10, "note": "caf\u00e9 \ud83d\ude00", "tags": ["a", "b"], "n": 1.50}}',
                     scope => 'acct-1');
COMMIT;

-- two-phase, in progress, with a checkpoint
SELECT token AS slow_token
  FROM idem_claim('slow', '{"amount": 30}', scope => 'acct-1',
                  ttl => '2 days', lease => '1 day') \gset
SELECT idem_checkpoint('slow', 'charge_created', scope => 'acct-1', token => :slow_token);

-- released
BEGIN;
SELECT status FROM idem_claim('released', '{"amount": 20}', scope => 'acct-1');
SELECT idem_release('released', scope => 'acct-1');
COMMIT;

-- since 0.4.0: completed with headers and raw bytes; a two-phase claim kept
-- with its request, whose one-second lease has lapsed by the time the
-- cluster is moved
BEGIN;
SELECT status FROM idem_claim('csv', scope => 'acct-1');
SELECT idem_complete('csv', 201, scope => 'acct-1',
                     response_headers => '{"Location": "/exports/1", "Content-Type": "text/csv"}',
                     response_raw => '\x612c620a00ff');
COMMIT;
SELECT status FROM idem_claim('kept', '{"amount": 40}', scope => 'acct-1',
                              ttl => '2 days', lease => '1 second', keep_request => true);

-- consumed messages
SELECT idem_consume_message('billing', 'm1');
SELECT count(*) AS consumed FROM idem_consume_messages('billing', ARRAY['m2', 'm3']);
RESET ROLE;

-- what the new major must answer: the stored response as text, the token
SET ROLE app;
CREATE TEMP TABLE seen AS
SELECT format('%s %s', response_code, response_body) AS paid
  FROM idem_lookup('paid', 'acct-1');
RESET ROLE;
INSERT INTO public.upgrade_expect VALUES
  ('paid', (SELECT paid FROM seen)),
  ('slow_token', :'slow_token');

-- a layout of two lanes of two-second partitions, with a message id that
-- expires at once: ended by the time the new major runs, for its
-- maintenance to drop (the default layouts have 7 and 1 lanes)
SET idempotency.partition_interval = '1s';
SET idempotency.message_ttl = '2s';
SET idempotency.key_ttl = '2s';
SET idempotency.premake = 0;
SELECT partitions_created > 0 AS made_short FROM idem_maintain();
SET ROLE app;
SELECT idem_consume_message('short', 'gone-soon', ttl => '1 second');
RESET ROLE;
RESET ALL;

SELECT count(*) > 0 AS has_rows FROM idempotency.keys;
