/* idempotency--0.2.0--0.3.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- 0.3.0 reads a digest's lane as a little-endian integer on every machine
-- (0.2.0 used the machine's byte order: the same on little-endian
-- machines).  On a big-endian machine, the rows 0.2.0 wrote move to their
-- lanes here, in the updating transaction; elsewhere nothing is read or
-- written.  The ledgers are otherwise unchanged.

-- idem_claim() returns a named row type instead of OUT parameters (the
-- same columns): cheaper for the executor to set up at every call.
DROP FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean);

-- idem_claim()'s result.  A named row type rather than OUT parameters:
-- the executor then takes the result's shape from the type cache instead
-- of building it from pg_proc at every execution.
CREATE TYPE idempotency.claim_result AS (
    status         text,
    token          bigint,
    recovery_point text,
    response_code  integer,
    response_body  jsonb,
    expires_at     timestamptz
);

COMMENT ON TYPE idempotency.claim_result IS
'what idem_claim() answers: status, token, recovery_point, response_code, response_body, expires_at';

CREATE FUNCTION pg_catalog.idem_claim(key text,
                                      request jsonb DEFAULT NULL,
                                      scope text DEFAULT '',
                                      ttl interval DEFAULT NULL,
                                      lease interval DEFAULT NULL,
                                      wait boolean DEFAULT false)
RETURNS idempotency.claim_result
AS 'MODULE_PATHNAME', 'idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409) or mismatch (422)';

CREATE FUNCTION idempotency.relocate_lanes(always boolean DEFAULT true)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_relocate_lanes'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.relocate_lanes(boolean) IS
'moves ledger rows written by 0.2.0 on a big-endian machine to the lanes 0.3.0 looks them up in';

REVOKE ALL ON FUNCTION idempotency.relocate_lanes(boolean) FROM PUBLIC;

-- Moving tenants between nodes (see src/transfer.c)

CREATE TYPE idempotency.key_record AS (
    role             name,
    digest           uuid,
    expires_at       timestamptz,
    status           text,
    token            bigint,
    claimed_at       timestamptz,
    lease_expires_at timestamptz,
    fingerprint      bytea,
    recovery_point   text,
    response_code    integer,
    response_body    jsonb
);

COMMENT ON TYPE idempotency.key_record IS
'one live idempotency key as idempotency.export_keys() gives it and idempotency.import_key() takes it';

CREATE TYPE idempotency.message_record AS (
    role       name,
    digest     uuid,
    expires_at timestamptz
);

COMMENT ON TYPE idempotency.message_record IS
'one consumed message id as idempotency.export_messages() gives it and idempotency.import_message() takes it';

CREATE FUNCTION idempotency.export_keys(scopes text[] DEFAULT NULL)
RETURNS SETOF idempotency.key_record
AS 'MODULE_PATHNAME', 'idem_export_keys'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_keys(text[]) IS
'the live idempotency keys of the given scopes (all if NULL), of every role, for idempotency.import_key() on another node';

CREATE FUNCTION idempotency.import_key(k record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_key'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_key(record) IS
'stores an exported idempotency key unless this node has a version at least as new: inserted, replaced, kept or expired';

CREATE FUNCTION idempotency.export_messages(consumers text[] DEFAULT NULL)
RETURNS SETOF idempotency.message_record
AS 'MODULE_PATHNAME', 'idem_export_messages'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.export_messages(text[]) IS
'the live consumed message ids of the given consumers (all if NULL), of every role, for idempotency.import_message() on another node';

CREATE FUNCTION idempotency.import_message(m record)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_import_message'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.import_message(record) IS
'records an exported message id as consumed unless this node has it already: inserted, kept or expired';

REVOKE ALL ON FUNCTION idempotency.export_keys(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_key(record) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.export_messages(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempotency.import_message(record) FROM PUBLIC;

SELECT idempotency.relocate_lanes(false);
