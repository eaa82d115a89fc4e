-- tenant-spy.sql: which form of idem_consume_message(s) a client's call
-- resolves to, and what it passed, on a server whose message ledger is not
-- distributed (where the four-argument form ignores its tenant, so the
-- answers cannot tell).  Schema tenant_spy holds one function of each of
-- the four signatures, same argument types as the extension's, none with a
-- default: put it before pg_catalog in search_path
-- ("tenant_spy, pg_catalog, ...") and a client's unqualified call resolves
-- to the spy of the form it names.  Each spy logs the call in
-- tenant_spy.calls (nargs 3 or 4, the arguments as received) and then runs
-- the extension's own function of the same form, so the answers are the
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
