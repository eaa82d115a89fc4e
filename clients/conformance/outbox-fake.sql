-- clients/conformance/outbox-fake.sql -- a stand-in for the extension's
-- outbox calls (SPEC "v3 additions", "The transactional outbox"), for the
-- client libraries' unit tests on a server whose extension has no outbox
-- yet.  Same signatures, same answers and SQLSTATEs as the extension's:
--
--   idem_publish(topic, payload, key, headers, payload_raw) RETURNS uuid
--   idem_outbox_next(relay, topic, max_events, generation)
--     RETURNS TABLE (batch, event_id, key, payload, payload_raw, headers,
--                    published_at)
--     the relay's current batch, the same again until it is acknowledged;
--   idem_outbox_ack(relay, topic, batch, generation) RETURNS boolean
--     true: moved past the batch; false: acknowledged before; 55000 for a
--     batch not handed out;
--   idem_outbox_dead_letter(relay, topic, event_id, reason, attempts)
--     records an event of the current batch in outbox_fake.dead_letters;
--   idem_outbox_dead_letters(relay, topic) shows the role's dead letters;
--   generations fence as idem_advance's (ID001, nothing changes).
--
-- Commit order the simple way: idem_publish takes one transaction-level
-- advisory lock before it numbers its event, so publishing transactions
-- run one after another from their first publish to their commit, and
-- event numbers follow commit order (a relay reading in number order never
-- skips an event that commits late).  The extension does it without
-- serializing publishers; its ordering is its own suite's business, and
-- the clients' end-to-end tests run against it when it has these calls.
--
-- Loaded into a schema of its own, "outbox_fake"; the tests put it first
-- on search_path, before pg_catalog (where the extension's own functions
-- are, when it has them: pg_catalog is searched first unless the path
-- names it later).  Idempotent (drops and recreates the schema).

SET client_min_messages = warning;
DROP SCHEMA IF EXISTS outbox_fake CASCADE;
CREATE SCHEMA outbox_fake;
GRANT USAGE ON SCHEMA outbox_fake TO PUBLIC;

CREATE TABLE outbox_fake.events (
	ev				bigserial PRIMARY KEY,
	role			name NOT NULL DEFAULT current_user,
	topic			text NOT NULL,
	event_id		uuid NOT NULL DEFAULT gen_random_uuid(),
	key				text,
	payload			jsonb,
	payload_raw		bytea,
	headers			jsonb,
	published_at	timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE outbox_fake.relays (
	role		name NOT NULL,
	relay		text NOT NULL,
	topic		text NOT NULL,
	generation	bigint,
	batch		bigint NOT NULL DEFAULT 1,
	acked_ev	bigint NOT NULL DEFAULT 0,
	batch_end	bigint,				-- NULL: no batch handed out
	lost_events	bigint NOT NULL DEFAULT 0,	-- a loss to report (outbox_fake.lose)
	PRIMARY KEY (role, relay, topic)
);

CREATE TABLE outbox_fake.dead_letters (
	role			name NOT NULL,
	relay			text NOT NULL,
	topic			text NOT NULL,
	event_id		uuid NOT NULL,
	key				text,
	headers			jsonb,
	payload			jsonb,
	payload_raw		bytea,
	published_at	timestamptz,
	reason			text,
	attempts		integer,
	failed_at		timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (role, relay, topic, event_id)
);

GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox_fake TO PUBLIC;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA outbox_fake TO PUBLIC;

CREATE FUNCTION outbox_fake.idem_publish(topic text, payload jsonb DEFAULT NULL,
	key text DEFAULT NULL, headers jsonb DEFAULT NULL, payload_raw bytea DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
	id uuid;
BEGIN
	IF topic IS NULL THEN
		RAISE EXCEPTION 'topic must not be null' USING ERRCODE = '22004';
	END IF;
	PERFORM pg_advisory_xact_lock(hashtext('outbox_fake.events'));
	INSERT INTO outbox_fake.events (topic, key, payload, payload_raw, headers)
		VALUES (idem_publish.topic, idem_publish.key, idem_publish.payload,
				idem_publish.payload_raw, idem_publish.headers)
		RETURNING event_id INTO id;
	RETURN id;
END $$;

-- the relay's row, locked; fenced by GENERATION as idem_advance's
CREATE FUNCTION outbox_fake.relay_row(p_relay text, p_topic text, p_generation bigint,
	p_create boolean)
RETURNS outbox_fake.relays LANGUAGE plpgsql AS $$
DECLARE
	r outbox_fake.relays;
BEGIN
	IF p_relay IS NULL OR p_topic IS NULL THEN
		RAISE EXCEPTION 'relay and topic must not be null' USING ERRCODE = '22004';
	END IF;
	IF p_generation < 0 THEN
		RAISE EXCEPTION 'generation must not be negative' USING ERRCODE = '22023';
	END IF;
	IF p_create THEN
		INSERT INTO outbox_fake.relays (role, relay, topic)
			VALUES (current_user, p_relay, p_topic) ON CONFLICT DO NOTHING;
	END IF;
	SELECT * INTO r FROM outbox_fake.relays
		WHERE role = current_user AND relay = p_relay AND topic = p_topic FOR UPDATE;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'relay "%" of topic "%" has taken no batch', p_relay, p_topic
			USING ERRCODE = '55000';
	END IF;
	IF p_generation IS NULL AND r.generation IS NOT NULL THEN
		RAISE EXCEPTION 'relay "%" of topic "%" is fenced, and no generation was given',
			p_relay, p_topic USING ERRCODE = 'ID001';
	END IF;
	IF p_generation < r.generation THEN
		RAISE EXCEPTION 'generation % of relay "%" of topic "%" is stale',
			p_generation, p_relay, p_topic USING ERRCODE = 'ID001';
	END IF;
	IF p_generation IS NOT NULL AND p_generation IS DISTINCT FROM r.generation THEN
		UPDATE outbox_fake.relays SET generation = p_generation
			WHERE role = r.role AND relay = r.relay AND topic = r.topic;
		r.generation := p_generation;
	END IF;
	RETURN r;
END $$;

CREATE FUNCTION outbox_fake.idem_outbox_next(relay text, topic text,
	max_events integer DEFAULT 100, generation bigint DEFAULT NULL)
RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
	payload_raw bytea, headers jsonb, published_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
	r outbox_fake.relays;
	last_ev bigint;
BEGIN
	IF max_events IS NULL OR max_events < 1 THEN
		RAISE EXCEPTION 'max_events must be at least 1' USING ERRCODE = '22023';
	END IF;
	r := outbox_fake.relay_row(idem_outbox_next.relay, idem_outbox_next.topic,
							   idem_outbox_next.generation, true);
	IF r.batch_end IS NULL AND r.lost_events > 0 THEN
		RAISE EXCEPTION 'relay "%" of topic "%" lost % events that expired before it acknowledged them',
			r.relay, r.topic, r.lost_events USING ERRCODE = 'ID003',
			DETAIL = format('Events were dropped after "idempotency.outbox_max_age"; the loss is batch %s.', r.batch),
			HINT = format('Acknowledge the loss with idem_outbox_ack(relay, topic, %s) to go on.', r.batch);
	END IF;
	IF r.batch_end IS NULL THEN
		SELECT max(e.ev) INTO last_ev FROM (
			SELECT e.ev FROM outbox_fake.events e
			 WHERE e.role = r.role AND e.topic = r.topic AND e.ev > r.acked_ev
			 ORDER BY e.ev LIMIT max_events) e;
		IF last_ev IS NULL THEN
			RETURN;
		END IF;
		UPDATE outbox_fake.relays x SET batch_end = last_ev
			WHERE x.role = r.role AND x.relay = r.relay AND x.topic = r.topic;
		r.batch_end := last_ev;
	END IF;
	RETURN QUERY SELECT r.batch, e.event_id, e.key, e.payload, e.payload_raw,
			e.headers, e.published_at
		FROM outbox_fake.events e
		WHERE e.role = r.role AND e.topic = r.topic
		  AND e.ev > r.acked_ev AND e.ev <= r.batch_end
		ORDER BY e.ev;
END $$;

CREATE FUNCTION outbox_fake.idem_outbox_ack(relay text, topic text, batch bigint,
	generation bigint DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	r outbox_fake.relays;
BEGIN
	IF batch IS NULL THEN
		RAISE EXCEPTION 'batch must not be null' USING ERRCODE = '22004';
	END IF;
	r := outbox_fake.relay_row(idem_outbox_ack.relay, idem_outbox_ack.topic,
							   idem_outbox_ack.generation, false);
	IF batch < r.batch THEN
		RETURN false;
	END IF;
	IF batch = r.batch AND r.batch_end IS NULL AND r.lost_events > 0 THEN
		UPDATE outbox_fake.relays x SET lost_events = 0, batch = x.batch + 1
		 WHERE x.role = r.role AND x.relay = r.relay AND x.topic = r.topic;
		RETURN true;
	END IF;
	IF batch > r.batch OR r.batch_end IS NULL THEN
		RAISE EXCEPTION 'batch % of relay "%" of topic "%" has not been handed out',
			batch, r.relay, r.topic USING ERRCODE = '55000';
	END IF;
	UPDATE outbox_fake.relays x
	   SET acked_ev = x.batch_end, batch_end = NULL, batch = x.batch + 1
	 WHERE x.role = r.role AND x.relay = r.relay AND x.topic = r.topic;
	RETURN true;
END $$;

CREATE FUNCTION outbox_fake.idem_outbox_dead_letter(relay text, topic text,
	event_id uuid, reason text DEFAULT NULL, attempts integer DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	r outbox_fake.relays;
	e outbox_fake.events;
BEGIN
	IF event_id IS NULL THEN
		RAISE EXCEPTION 'event_id must not be null' USING ERRCODE = '22004';
	END IF;
	SELECT * INTO r FROM outbox_fake.relays x
	 WHERE x.role = current_user AND x.relay = idem_outbox_dead_letter.relay
	   AND x.topic = idem_outbox_dead_letter.topic FOR UPDATE;
	IF FOUND AND r.batch_end IS NOT NULL THEN
		SELECT * INTO e FROM outbox_fake.events x
		 WHERE x.role = r.role AND x.topic = r.topic AND x.ev > r.acked_ev
		   AND x.ev <= r.batch_end AND x.event_id = idem_outbox_dead_letter.event_id;
	END IF;
	IF e.ev IS NULL THEN
		RAISE EXCEPTION 'event % is not in the current batch of relay "%" of topic "%"',
			idem_outbox_dead_letter.event_id, idem_outbox_dead_letter.relay,
			idem_outbox_dead_letter.topic USING ERRCODE = '55000';
	END IF;
	INSERT INTO outbox_fake.dead_letters AS d (role, relay, topic, event_id, key,
			headers, payload, payload_raw, published_at, reason, attempts)
		VALUES (r.role, r.relay, r.topic, e.event_id, e.key, e.headers, e.payload,
				e.payload_raw, e.published_at, idem_outbox_dead_letter.reason,
				idem_outbox_dead_letter.attempts)
		ON CONFLICT ON CONSTRAINT dead_letters_pkey DO UPDATE
		   SET reason = excluded.reason, attempts = excluded.attempts,
			   failed_at = excluded.failed_at;
END $$;

CREATE FUNCTION outbox_fake.idem_outbox_dead_letters(relay text DEFAULT NULL,
	topic text DEFAULT NULL)
RETURNS TABLE (relay text, topic text, event_id uuid, key text,
	payload jsonb, payload_raw bytea, headers jsonb,
	published_at timestamptz, reason text, attempts integer,
	failed_at timestamptz)
LANGUAGE sql AS $$
	SELECT d.relay, d.topic, d.event_id, d.key, d.payload, d.payload_raw,
		   d.headers, d.published_at, d.reason, d.attempts, d.failed_at
	  FROM outbox_fake.dead_letters d
	 WHERE d.role = current_user
	   AND (idem_outbox_dead_letters.relay IS NULL OR d.relay = idem_outbox_dead_letters.relay)
	   AND (idem_outbox_dead_letters.topic IS NULL OR d.topic = idem_outbox_dead_letters.topic)
	 ORDER BY d.failed_at, d.event_id
$$;

-- outbox_fake.lose(relay, topic): what maintenance does to a relay past
-- idempotency.outbox_max_age, for the tests: the events it has not taken
-- are dropped, and its next call reports the loss (ID003) as its next
-- batch, which it acknowledges to go on.
CREATE FUNCTION outbox_fake.lose(p_relay text, p_topic text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	r outbox_fake.relays;
	n bigint;
BEGIN
	r := outbox_fake.relay_row(p_relay, p_topic, NULL, true);
	IF r.batch_end IS NOT NULL THEN
		RAISE EXCEPTION 'relay "%" has a batch handed out', p_relay USING ERRCODE = '55000';
	END IF;
	DELETE FROM outbox_fake.events e
	 WHERE e.role = r.role AND e.topic = r.topic AND e.ev > r.acked_ev;
	GET DIAGNOSTICS n = ROW_COUNT;
	UPDATE outbox_fake.relays x SET lost_events = n
	 WHERE x.role = r.role AND x.relay = r.relay AND x.topic = r.topic;
	RETURN n;
END $$;
