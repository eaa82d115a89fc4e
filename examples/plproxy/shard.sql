-- examples/plproxy/shard.sql -- one partition of the payments service.
--
-- Run it in every partition database (each partition is its own database;
-- several may share a PostgreSQL instance), as a superuser, after creating
-- the application role "app" in that instance:
--
--   psql -X -v ON_ERROR_STOP=1 -d part0 -f examples/plproxy/shard.sql
--
-- The business table and the idempotency ledger live in the same database,
-- so create_payment() claims the key, writes the payment and stores the
-- response in ONE local transaction.  The proxy (proxy.sql) sends every call
-- for a tenant to the same partition, so a tenant's keys are always claimed
-- where its payments are written.

CREATE EXTENSION IF NOT EXISTS idempotency;

-- No UNIQUE (tenant, key) constraint on purpose: the key ledger is what keeps
-- a payment single, and examples/plproxy/test.sh counts rows to prove it.
CREATE TABLE payments (
    id         bigserial     PRIMARY KEY,
    tenant     text          NOT NULL,
    key        text          NOT NULL,
    amount     numeric(12,2) NOT NULL,
    created_at timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX payments_tenant_key ON payments (tenant, key);

-- create_payment: the whole request handler, run where the tenant lives.
--
--   status      'created'     first request for the key: the payment was made
--               'replayed'    the key was completed before: stored response
--               'mismatch'    the key was first used with another request (422)
--               'in_progress' the key is held by a two-phase claim (409)
--   response_code, response_body: what the HTTP layer sends back.
--
-- wait => true: a retry that arrives while the first request is still in its
-- transaction waits for it and then replays its response, so concurrent
-- duplicates all get the same answer.  The key's scope is the tenant, which
-- is also the routing key: see README.md ("Limitations").
CREATE FUNCTION create_payment(tenant text, key text, request jsonb,
                               amount numeric,
                               OUT status text, OUT response_code int,
                               OUT response_body jsonb)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    claim   record;
    payment bigint;
BEGIN
    SELECT c.status, c.response_code, c.response_body
      INTO claim
      FROM idem_claim(create_payment.key,
                      request => create_payment.request,
                      scope   => create_payment.tenant,
                      wait    => true) AS c;

    IF claim.status = 'claimed' THEN
        INSERT INTO public.payments (tenant, key, amount)
        VALUES (create_payment.tenant, create_payment.key, create_payment.amount)
        RETURNING id INTO payment;

        status := 'created';
        response_code := 201;
        response_body := jsonb_build_object('payment_id', payment,
                                            'tenant', create_payment.tenant,
                                            'amount', create_payment.amount,
                                            'partition', current_database());
        PERFORM idem_complete(create_payment.key, response_code, response_body,
                              scope => create_payment.tenant);
    ELSIF claim.status = 'completed' THEN
        status := 'replayed';
        response_code := claim.response_code;
        response_body := claim.response_body;
    ELSIF claim.status = 'mismatch' THEN
        status := 'mismatch';
        response_code := 422;
    ELSE
        status := claim.status;       -- in_progress
        response_code := 409;
    END IF;
END
$$;

COMMENT ON FUNCTION create_payment(text, text, jsonb, numeric) IS
    'claims idempotency key "key" of tenant "tenant", makes the payment and stores the response in one transaction';

REVOKE ALL ON FUNCTION create_payment(text, text, jsonb, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION create_payment(text, text, jsonb, numeric) TO app;
GRANT SELECT, INSERT ON payments TO app;
GRANT USAGE ON SEQUENCE payments_id_seq TO app;
