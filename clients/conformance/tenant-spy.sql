-- tenant-spy.sql: which form of idem_consume_message(s), of the ordered
-- stream calls (idem_assign, idem_advance, idem_positions, idem_sequence)
-- and of the outbox calls (idem_publish, idem_outbox_next, idem_outbox_ack,
-- idem_outbox_dead_letter) a client's call resolves to, and what it passed,
-- on a server whose ledger, stream positions, producer sequences and outbox
-- are not distributed (where the forms with a tenant ignore it, so the
-- answers cannot tell).  Schema
-- tenant_spy holds one function of each of the signatures, same argument
-- types as the extension's, none with a default: put it before pg_catalog
-- in search_path ("tenant_spy, pg_catalog, ...") and a client's unqualified
-- call resolves to the spy of the form it names.  Each spy logs the call in
-- tenant_spy.calls (nargs: how many arguments the form has; the arguments
-- as received: a stream call's stream, or producer, in "stream" and its
-- other arguments but the tenant, as text, in "args"; an outbox call's
-- relay in "consumer", its topic in "stream") and then runs the
-- extension's own function of the same form, so the answers are the
-- extension's.  Loaded, as a superuser, by clients/python/tests/test_tenant.py
-- and clients/node/test/tenant.test.js.

DROP SCHEMA IF EXISTS tenant_spy CASCADE;
CREATE SCHEMA tenant_spy;
GRANT USAGE ON SCHEMA tenant_spy TO PUBLIC;

CREATE TABLE tenant_spy.calls (
    n           bigserial PRIMARY KEY,
    fn          text NOT NULL,
    nargs       int NOT NULL,
    consumer    text,
    message_ids text[],
    ttl         interval,
    tenant      text,
    stream      text,
    args        text[],
    caller      name NOT NULL DEFAULT current_user
);
GRANT SELECT, INSERT ON tenant_spy.calls TO PUBLIC;
GRANT USAGE ON SEQUENCE tenant_spy.calls_n_seq TO PUBLIC;

-- Not SECURITY DEFINER: the extension's identity is the calling role, which
-- must stay the client's.
CREATE FUNCTION tenant_spy.idem_consume_message(consumer text, message_id text,
                                                ttl interval)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, message_ids, ttl)
    VALUES ('idem_consume_message', 3, $1, ARRAY[$2], $3);
    SELECT pg_catalog.idem_consume_message($1, $2, $3);
$$;

CREATE FUNCTION tenant_spy.idem_consume_message(consumer text, message_id text,
                                                ttl interval, tenant text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, message_ids, ttl, tenant)
    VALUES ('idem_consume_message', 4, $1, ARRAY[$2], $3, $4);
    SELECT pg_catalog.idem_consume_message($1, $2, $3, $4);
$$;

CREATE FUNCTION tenant_spy.idem_consume_messages(consumer text,
                                                 message_ids text[],
                                                 ttl interval)
RETURNS SETOF text LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, message_ids, ttl)
    VALUES ('idem_consume_messages', 3, $1, $2, $3);
    SELECT pg_catalog.idem_consume_messages($1, $2, $3);
$$;

CREATE FUNCTION tenant_spy.idem_consume_messages(consumer text,
                                                 message_ids text[],
                                                 ttl interval, tenant text)
RETURNS SETOF text LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, message_ids, ttl, tenant)
    VALUES ('idem_consume_messages', 4, $1, $2, $3, $4);
    SELECT pg_catalog.idem_consume_messages($1, $2, $3, $4);
$$;

-- The ordered stream calls: 0.4.0's forms as the clients call them (every
-- argument given) and 0.5.0's tenant overloads.

CREATE FUNCTION tenant_spy.idem_assign(consumer text, stream text,
                                       parts integer[], generation bigint)
RETURNS TABLE (part integer, next_offset bigint) LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_assign', 4, $1, $2, ARRAY[$3::text, $4::text]);
    SELECT * FROM pg_catalog.idem_assign($1, $2, $3, $4);
$$;

CREATE FUNCTION tenant_spy.idem_assign(consumer text, stream text,
                                       parts integer[], generation bigint,
                                       tenant text)
RETURNS TABLE (part integer, next_offset bigint) LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_assign', 5, $1, $2, ARRAY[$3::text, $4::text], $5);
    SELECT * FROM pg_catalog.idem_assign($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_advance(consumer text, stream text,
                                        part integer, first bigint,
                                        last bigint, generation bigint)
RETURNS TABLE (first_offset bigint, last_offset bigint)
LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_advance', 6, $1, $2,
            ARRAY[$3::text, $4::text, $5::text, $6::text]);
    SELECT * FROM pg_catalog.idem_advance($1, $2, $3, $4, $5, $6);
$$;

CREATE FUNCTION tenant_spy.idem_advance(consumer text, stream text,
                                        part integer, first bigint,
                                        last bigint, generation bigint,
                                        tenant text)
RETURNS TABLE (first_offset bigint, last_offset bigint)
LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_advance', 7, $1, $2,
            ARRAY[$3::text, $4::text, $5::text, $6::text], $7);
    SELECT * FROM pg_catalog.idem_advance($1, $2, $3, $4, $5, $6, $7);
$$;

CREATE FUNCTION tenant_spy.idem_positions(consumer text, stream text)
RETURNS TABLE (part integer, next_offset bigint, generation bigint,
               updated_at timestamptz) LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_positions', 2, $1, $2, ARRAY[]::text[]);
    SELECT * FROM pg_catalog.idem_positions($1, $2);
$$;

CREATE FUNCTION tenant_spy.idem_positions(consumer text, stream text,
                                          tenant text)
RETURNS TABLE (part integer, next_offset bigint, generation bigint,
               updated_at timestamptz) LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_positions', 3, $1, $2, ARRAY[]::text[], $3);
    SELECT * FROM pg_catalog.idem_positions($1, $2, $3);
$$;

CREATE FUNCTION tenant_spy.idem_sequence(consumer text, producer text,
                                         epoch bigint, seq bigint,
                                         strict boolean)
RETURNS text LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_sequence', 5, $1, $2, ARRAY[$3::text, $4::text, $5::text]);
    SELECT pg_catalog.idem_sequence($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_sequence(consumer text, producer text,
                                         epoch bigint, seq bigint,
                                         strict boolean, tenant text)
RETURNS text LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_sequence', 6, $1, $2, ARRAY[$3::text, $4::text, $5::text], $6);
    SELECT pg_catalog.idem_sequence($1, $2, $3, $4, $5, $6);
$$;

-- The outbox calls: 0.4.0's forms as the clients call them (every argument
-- given) and 0.5.0's tenant overloads.  A relay's relay name goes in
-- "consumer" (publish: none), the topic in "stream".

CREATE FUNCTION tenant_spy.idem_publish(topic text, payload jsonb, key text,
                                        headers jsonb, payload_raw bytea)
RETURNS uuid LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, stream, args)
    VALUES ('idem_publish', 5, $1, ARRAY[$2::text, $3, $4::text, $5::text]);
    SELECT pg_catalog.idem_publish($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_publish(topic text, payload jsonb, key text,
                                        headers jsonb, payload_raw bytea,
                                        tenant text)
RETURNS uuid LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, stream, args, tenant)
    VALUES ('idem_publish', 6, $1, ARRAY[$2::text, $3, $4::text, $5::text], $6);
    SELECT pg_catalog.idem_publish($1, $2, $3, $4, $5, $6);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_next(relay text, topic text,
                                            max_events integer,
                                            generation bigint)
RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
               payload_raw bytea, headers jsonb, published_at timestamptz)
LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_outbox_next', 4, $1, $2, ARRAY[$3::text, $4::text]);
    SELECT * FROM pg_catalog.idem_outbox_next($1, $2, $3, $4);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_next(relay text, topic text,
                                            max_events integer,
                                            generation bigint, tenant text)
RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
               payload_raw bytea, headers jsonb, published_at timestamptz,
               tenant text, seq bigint)
LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_outbox_next', 5, $1, $2, ARRAY[$3::text, $4::text], $5);
    SELECT * FROM pg_catalog.idem_outbox_next($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_ack(relay text, topic text,
                                           batch bigint, generation bigint)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_outbox_ack', 4, $1, $2, ARRAY[$3::text, $4::text]);
    SELECT pg_catalog.idem_outbox_ack($1, $2, $3, $4);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_ack(relay text, topic text,
                                           batch bigint, generation bigint,
                                           tenant text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_outbox_ack', 5, $1, $2, ARRAY[$3::text, $4::text], $5);
    SELECT pg_catalog.idem_outbox_ack($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_dead_letter(relay text, topic text,
                                                   event_id uuid, reason text,
                                                   attempts integer)
RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args)
    VALUES ('idem_outbox_dead_letter', 5, $1, $2,
            ARRAY[$3::text, $4, $5::text]);
    SELECT pg_catalog.idem_outbox_dead_letter($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION tenant_spy.idem_outbox_dead_letter(relay text, topic text,
                                                   event_id uuid, reason text,
                                                   attempts integer,
                                                   tenant text)
RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO tenant_spy.calls (fn, nargs, consumer, stream, args, tenant)
    VALUES ('idem_outbox_dead_letter', 6, $1, $2,
            ARRAY[$3::text, $4, $5::text], $6);
    SELECT pg_catalog.idem_outbox_dead_letter($1, $2, $3, $4, $5, $6);
$$;
