-- examples/http/schema.sql -- the tables of the example payments service
-- (examples/http/server.py, recoverer.py).  Load it after CREATE EXTENSION
-- idempotency:
--
--   psql -d payments -c 'CREATE EXTENSION idempotency' -f examples/http/schema.sql
--
-- The idempotency keys themselves need no table of ours: idem_claim(),
-- idem_complete() and idem_recover() keep them, with the requests the
-- recoverer needs, in the extension's ledger.

CREATE TABLE charges (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id         text        NOT NULL,
    amount             bigint      NOT NULL CHECK (amount > 0),   -- minor units (cents)
    currency           text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    description        text,
    -- kept for support work only; deliberately not UNIQUE, so that the
    -- example's test would see a charge made twice instead of an error
    idempotency_key    text        NOT NULL,
    -- the card network's charge (provider_charges.id; no foreign key: in
    -- a real service it lives in another system)
    provider_charge_id bigint      NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX charges_account_key ON charges (account_id, idempotency_key);

COMMENT ON TABLE charges IS 'charges made through POST /charges (examples/http/server.py)';

-- Stands for the card network (Stripe, Adyen, a bank), whose API the
-- service calls between its two transactions.  Like those APIs it is
-- idempotent by a key the caller sends: payments.py's CardNetwork inserts
-- with ON CONFLICT (idempotency_key) DO NOTHING, in autocommit, and
-- returns the row that holds the key.  In the same database only to keep
-- the example self-contained.
CREATE TABLE provider_charges (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL UNIQUE,
    amount          bigint      NOT NULL,
    currency        text        NOT NULL,
    outcome         text        NOT NULL CHECK (outcome IN ('succeeded', 'declined')),
    metadata        jsonb       NOT NULL,   -- what the merchant sent along (account, its key)
    created_at      timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE provider_charges IS 'the simulated card network of examples/http (payments.py, CardNetwork)';
