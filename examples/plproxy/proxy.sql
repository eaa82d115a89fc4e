-- examples/plproxy/proxy.sql -- the PL/Proxy routing node of the payments
-- service.  It holds no data: each call is sent to the partition that owns
-- the tenant, and runs there as one autocommit transaction.
--
-- Run it once in the proxy database, as a superuser, after creating the
-- application role "app", with the libpq connection string of each of the
-- four partitions (for unix sockets: host=<socket dir> port=<port>):
--
--   psql -X -v ON_ERROR_STOP=1 -d proxy \
--        -v p0='host=/run/pg1 port=5432 dbname=part0' \
--        -v p1='host=/run/pg2 port=5432 dbname=part1' \
--        -v p2='host=/run/pg3 port=5432 dbname=part2' \
--        -v p3='host=/run/pg1 port=5432 dbname=part3' \
--        -f examples/plproxy/proxy.sql
--
-- PL/Proxy maps a hash to a partition as hash & (partitions - 1), so the
-- partition count must be a power of two.  With three machines, give one of
-- them two partitions (part0 and part3 above), each its own database: moving
-- part3 to a fourth machine later moves a whole database, ledger included,
-- and changes no tenant's partition.  See README.md.

CREATE EXTENSION IF NOT EXISTS plproxy;

-- The cluster, defined with SQL/MED.  Connection strings without "user="
-- connect as the calling role (PL/Proxy appends user=CURRENT_USER), so the
-- idempotency keys on the partitions belong to the application role.
CREATE SERVER payments FOREIGN DATA WRAPPER plproxy OPTIONS (
    connection_lifetime '1800',
    p0 :'p0',
    p1 :'p1',
    p2 :'p2',
    p3 :'p3'
);
CREATE USER MAPPING FOR PUBLIC SERVER payments;
GRANT USAGE ON FOREIGN SERVER payments TO app;

-- Same name and signature as the partition function: PL/Proxy runs
--   SELECT status, response_code, response_body
--     FROM public.create_payment($1, $2, $3, $4)
-- on partition hashtext(tenant) & 3.
CREATE FUNCTION create_payment(tenant text, key text, request jsonb,
                               amount numeric,
                               OUT status text, OUT response_code int,
                               OUT response_body jsonb)
RETURNS record
LANGUAGE plproxy
AS $$
    CLUSTER 'payments';
    RUN ON hashtext(tenant);
$$;

COMMENT ON FUNCTION create_payment(text, text, jsonb, numeric) IS
    'routes a payment request to the partition of its tenant';

REVOKE ALL ON FUNCTION create_payment(text, text, jsonb, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION create_payment(text, text, jsonb, numeric) TO app;
