-- examples/http/schema.sql -- the table of the example payments service
-- (examples/http/server.py).  Load it after CREATE EXTENSION idempotency:
--
--   psql -d payments -c 'CREATE EXTENSION idempotency' -f examples/http/schema.sql
--
-- The idempotency keys themselves need no table of ours: idem_claim() and
-- idem_complete() keep them in the extension's ledger, in the same
-- transaction as the INSERT below.

CREATE TABLE charges (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id      text        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0),   -- minor units (cents)
    currency        text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    description     text,
    -- kept for support work only; deliberately not UNIQUE, so that the
    -- example's test would see a charge made twice instead of an error
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX charges_account_key ON charges (account_id, idempotency_key);

COMMENT ON TABLE charges IS 'charges made through POST /charges (examples/http/server.py)';
