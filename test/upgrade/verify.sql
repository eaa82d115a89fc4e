-- test/upgrade/verify.sql -- after a cluster made by test/upgrade/setup.sql
-- was moved to a newer PostgreSQL major: every answer it gave is given
-- again.  Run as a superuser; each check prints "ok: ..." or stops with an
-- error that says what differs.

\set ON_ERROR_STOP on
SELECT value AS slow_token FROM public.upgrade_expect WHERE what = 'slow_token' \gset

CREATE FUNCTION pg_temp.check(ok boolean, what text, got text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  IF ok IS NOT TRUE THEN
    RAISE EXCEPTION 'not ok: %', what USING DETAIL = 'got: ' || coalesce(got, 'NULL');
  END IF;
  RETURN 'ok: ' || what;
END $$;

SET ROLE app;

-- a completed key replays its response byte for byte, and checks the request
SELECT pg_temp.check(format('%s %s %s', status, response_code, response_body) =
                     'completed ' || (SELECT value FROM public.upgrade_expect WHERE what = 'paid'),
                     'the completed key replays its stored response byte for byte',
                     format('%s %s %s', status, response_code, response_body))
  FROM idem_claim('paid', '{"currency": "EUR", "amount": 10}', scope => 'acct-1');
SELECT pg_temp.check(status = 'mismatch', 'a changed request is still a mismatch', status)
  FROM idem_claim('paid', '{"amount": 11, "currency": "EUR"}', scope => 'acct-1');

-- the two-phase claim is in progress for others; its holder's token works
SELECT pg_temp.check(status = 'in_progress', 'the two-phase claim is in progress for others', status)
  FROM idem_claim('slow', '{"amount": 30}', scope => 'acct-1');
SELECT pg_temp.check(recovery_point = 'charge_created' AND token = :slow_token,
                     'its checkpoint and token are kept', format('%s %s', recovery_point, token))
  FROM idem_lookup('slow', 'acct-1');
SELECT idem_checkpoint('slow', 'charge_captured', scope => 'acct-1', token => :slow_token);
SELECT idem_complete('slow', 200, '{"done": true}', scope => 'acct-1', token => :slow_token);
SELECT pg_temp.check(status = 'completed' AND recovery_point = 'charge_captured',
                     'its holder checkpoints and completes it with the token from before',
                     format('%s %s', status, recovery_point))
  FROM idem_lookup('slow', 'acct-1');

-- the released key starts fresh, with a larger token
BEGIN;
SELECT pg_temp.check(status = 'claimed' AND token > :slow_token,
                     'the released key is claimed afresh with a larger token',
                     format('%s %s', status, token))
  FROM idem_claim('released', '{"amount": 21}', scope => 'acct-1');
SELECT idem_complete('released', 201, '{}', scope => 'acct-1');
COMMIT;

-- headers and raw bytes replay; the lapsed kept claim is recovered with
-- its request (its lease lapsed one second after setup.sql)
SELECT pg_temp.check(format('%s %s %s %s', status, response_code, response_headers, response_raw) =
                     'completed 201 {"Location": "/exports/1", "Content-Type": "text/csv"} \x612c620a00ff',
                     'headers and raw bytes replay byte for byte',
                     format('%s %s %s %s', status, response_code, response_headers, response_raw))
  FROM idem_claim('csv', scope => 'acct-1');
DO $$
BEGIN
  WHILE (SELECT lease_expires_at > clock_timestamp() FROM idem_lookup('kept', 'acct-1')) LOOP
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
BEGIN;
SELECT pg_temp.check(count(*) = 1 AND min(key) = 'kept' AND min(request::text) = '{"amount": 40}',
                     'the lapsed kept claim is recovered, with its request',
                     string_agg(format('%s %s', key, request), ', '))
  FROM idem_recover('1 minute', 'acct-1');
SELECT idem_complete('kept', 200, '{"recovered": true}', scope => 'acct-1');
COMMIT;

-- consumed messages are still duplicates; new ones are new
SELECT pg_temp.check(NOT idem_consume_message('billing', 'm1'),
                     'a consumed message is still a duplicate', 'true');
SELECT pg_temp.check(string_agg(m, ',') = 'm4', 'a batch returns only the new ids',
                     string_agg(m, ','))
  FROM idem_consume_messages('billing', ARRAY['m2', 'm3', 'm4']) AS t(m);
SELECT pg_temp.check(idem_consume_message('billing', 'm5'),
                     'a new message id is consumed', 'false');
RESET ROLE;

-- maintenance resumes: it drops the partitions that ended meanwhile, keeps
-- the live ones, and the ledgers belong to the extension again
DO $$
BEGIN
  WHILE EXISTS (SELECT FROM idempotency.partitions WHERE lanes = 2 AND NOT expired) LOOP
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
-- (the background worker, if the new cluster preloads the library, may
-- have dropped them first)
SELECT pg_temp.check(partitions_created >= 0, 'idem_maintain() runs on the new major',
                     format('%s made, %s dropped', partitions_created, partitions_dropped))
  FROM idem_maintain();
SELECT pg_temp.check(count(*) = 0, 'the partitions that ended meanwhile are dropped',
                     count(*)::text)
  FROM idempotency.partitions WHERE lanes = 2 OR expired;
SELECT pg_temp.check(count(*) = 2, 'both ledger tables depend on the extension again',
                     count(*)::text)
  FROM pg_depend
 WHERE classid = 'pg_class'::regclass
   AND objid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
   AND refclassid = 'pg_extension'::regclass AND deptype = 'a';
SET ROLE app;
SELECT pg_temp.check(count(*) = 1, 'the keys are still found after maintenance', count(*)::text)
  FROM idem_lookup('paid', 'acct-1');
RESET ROLE;
