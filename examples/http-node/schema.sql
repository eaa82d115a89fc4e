-- examples/http-node/schema.sql -- the table of the example payments API
-- (examples/http-node/server.js).  Load it after CREATE EXTENSION idempotency:
--
--   psql -d payments -c 'CREATE EXTENSION idempotency' -f examples/http-node/schema.sql
--
-- The idempotency keys need no table of ours: the middleware's idem_claim()
-- and idem_complete() keep them, with the stored responses, in the
-- extension's ledger, in the same transaction as the INSERT below.

CREATE TABLE payments (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    amount          bigint      NOT NULL CHECK (amount > 0),   -- minor units (cents)
    currency        text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- kept for support work only; deliberately not UNIQUE, so that the
    -- example's test would see a payment made twice instead of an error
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE payments IS 'payments made through POST /payments (examples/http-node/server.js)';
