--
-- idem_maintain(): partitions made ahead, lanes, expired partitions dropped
--
CREATE EXTENSION IF NOT EXISTS idempotency;

-- start from an empty ledger
DO $$
DECLARE p regclass;
BEGIN
  FOR p IN SELECT partition FROM idempotency.partitions LOOP
    EXECUTE format('DROP TABLE %s', p);
  END LOOP;
END $$;
SELECT count(*) FROM idempotency.partitions;

-- a day of ttl in hourly partitions: 24 lanes, each partition spans a day,
-- lane n starts n hours after lane 0, so one partition expires every hour
SET idempotency.message_ttl = '1d';
SET idempotency.partition_interval = '1h';
SET idempotency.premake = 0;
SELECT partitions_created > 0 AS made, partitions_dropped FROM idem_maintain();
SELECT count(DISTINCT lane) AS lanes, min(lanes) AS min_lanes, max(lanes) AS max_lanes,
       bool_and(upper_bound - lower_bound = interval '1 day') AS day_wide,
       count(DISTINCT extract(hour FROM lower_bound AT TIME ZONE 'UTC')) AS distinct_start_hours
  FROM idempotency.partitions WHERE table_name = 'messages';
-- every lane covers [now, now + ttl) without gaps or overlaps (the ttl is 86,400
-- seconds: '24 hours', not '1 day', which is 23 or 25 hours on the day of a
-- daylight-saving change in the session's TimeZone)
SELECT count(*) AS lanes_not_covered
  FROM generate_series(0, 23) AS l(lane)
 WHERE NOT EXISTS (SELECT 1 FROM idempotency.partitions p
                    WHERE p.table_name = 'messages' AND p.lane = l.lane AND p.lower_bound <= now()
                      AND p.upper_bound > now())
    OR NOT EXISTS (SELECT 1 FROM idempotency.partitions p
                    WHERE p.table_name = 'messages' AND p.lane = l.lane AND p.lower_bound <= now() + interval '24 hours'
                      AND p.upper_bound > now() + interval '24 hours');
SELECT count(*) AS overlaps
  FROM idempotency.partitions a JOIN idempotency.partitions b
    ON a.table_name = b.table_name AND a.lanes = b.lanes AND a.lane = b.lane
   AND a.partition <> b.partition
   AND a.lower_bound < b.upper_bound AND b.lower_bound < a.upper_bound;
-- live partitions per lane: the one holding now and the one holding now + ttl
SELECT max(n) <= 2 AS at_most_two_per_lane
  FROM (SELECT table_name, lane, count(*) AS n FROM idempotency.partitions
         GROUP BY table_name, lane) s;

-- a second run has nothing to do
SELECT * FROM idem_maintain();

-- premake adds one more partition per lane
SET idempotency.premake = 1;
SELECT partitions_created AS premade FROM idem_maintain();
SELECT table_name, count(*) FROM idempotency.partitions GROUP BY 1 ORDER BY 1;
RESET idempotency.premake;

-- calls route into the partitions of their lane
SELECT count(*) FROM idem_consume_messages('maint', ARRAY(SELECT 'm' || g FROM generate_series(1, 200) g));
SELECT count(*) AS misrouted FROM idempotency.messages m
 WHERE NOT EXISTS (SELECT 1 FROM idempotency.partitions p
                    WHERE p.partition = m.tableoid
                      AND m.lane < 0 AND (m.lane::int & 32767) = ((p.lanes << 8) | p.lane)
                      AND m.expires_at >= p.lower_bound AND m.expires_at < p.upper_bound);
SELECT count(DISTINCT tableoid) > 10 AS spread_over_lanes FROM idempotency.messages;

-- a ttl beyond everything made ahead: the partition is made on the spot
SELECT idem_consume_message('maint', 'far', ttl => '20 days');
SELECT idem_consume_message('maint', 'far', ttl => '1 hour');
SELECT count(*) AS far_partitions FROM idempotency.partitions
 WHERE table_name = 'messages' AND lower_bound > now() + interval '10 days';

-- changing the layout never loses live messages: old partitions are still
-- probed until they expire
SET idempotency.partition_interval = '6h';
SELECT partitions_created > 0 AS made_new_layout FROM idem_maintain();
SELECT array_agg(DISTINCT lanes ORDER BY lanes) AS layouts FROM idempotency.partitions
 WHERE table_name = 'messages';
SELECT count(*) FROM idem_consume_messages('maint', ARRAY(SELECT 'm' || g FROM generate_series(1, 200) g));
SELECT idem_consume_message('maint', 'new-after-change');
SELECT idem_consume_message('maint', 'new-after-change');

-- expired partitions are dropped: tiny partitions that expire within seconds
SET idempotency.partition_interval = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.key_ttl = '1s';
SELECT partitions_created > 0 AS made_short FROM idem_maintain();
SELECT idem_consume_message('maint', 'short-lived', ttl => '1 second');
DO $$
BEGIN
  WHILE clock_timestamp() <= (SELECT max(upper_bound) FROM idempotency.partitions p
                               JOIN idempotency.messages m ON m.tableoid = p.partition
                              WHERE p.table_name = 'messages' AND p.lanes = 1) LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
-- (the clock as seconds since the epoch: a timestamp's text in the session's
-- DateStyle names zones by abbreviations some cannot be read back from, SST)
SELECT extract(epoch FROM clock_timestamp()) AS expired_by \gset
-- an ended partition this session itself reads is left for the next run,
-- and the run goes on (before, it failed: cannot DROP TABLE "messages_..."
-- because it is being used by active queries in this session): read by
-- the statement that runs maintenance ...
SELECT m.partitions_dropped >= 0 AS ran,
       (SELECT count(*) FROM idempotency.messages) > 0 AS read
  FROM idem_maintain() AS m;
SELECT count(*) > 0 AS ended_kept FROM idempotency.partitions
 WHERE table_name = 'messages' AND upper_bound <= pg_catalog.to_timestamp(:'expired_by'::float8);
-- ... or by a cursor of its transaction
BEGIN;
DECLARE reader CURSOR FOR SELECT 1 AS one FROM idempotency.messages;
FETCH 1 FROM reader;
SELECT m.partitions_dropped >= 0 AS ran FROM idem_maintain() AS m;
SELECT count(*) > 0 AS ended_kept FROM idempotency.partitions
 WHERE table_name = 'messages' AND upper_bound <= pg_catalog.to_timestamp(:'expired_by'::float8);
CLOSE reader;
COMMIT;
SELECT extract(epoch FROM clock_timestamp()) AS before_maintain \gset
SELECT partitions_dropped > 0 AS dropped FROM idem_maintain();
SELECT count(*) AS expired_left FROM idempotency.partitions
 WHERE upper_bound <= pg_catalog.to_timestamp(:'before_maintain'::float8);
SELECT count(*) AS short_lived_rows FROM idempotency.messages m
  JOIN pg_class c ON c.oid = m.tableoid WHERE c.relname LIKE 'messages\_1\_%';
-- the message can be consumed again
SELECT idem_consume_message('maint', 'short-lived', ttl => '1 second');
RESET idempotency.partition_interval;
RESET idempotency.message_ttl;
RESET idempotency.key_ttl;

-- the view is for pg_monitor; ordinary roles see nothing
CREATE ROLE regress_idem_monitor IN ROLE pg_monitor;
CREATE ROLE regress_idem_nobody;
SET ROLE regress_idem_monitor;
SELECT count(*) > 0 AS monitor_sees_partitions FROM idempotency.partitions;
RESET ROLE;
SET ROLE regress_idem_nobody;
SELECT count(*) FROM idempotency.partitions;
RESET ROLE;
DROP ROLE regress_idem_monitor;
DROP ROLE regress_idem_nobody;

-- DROP EXTENSION takes the storage with it
DROP EXTENSION idempotency;
SELECT count(*) AS leftovers FROM pg_class WHERE relname ~ '^(messages|keys)(_|$)';
SELECT to_regnamespace('idempotency') IS NULL AS schema_gone;
CREATE EXTENSION idempotency;
SELECT idem_consume_message('billing', 'msg-1') AS fresh_start;
