-- examples/consumer/schema.sql -- tables of the example queue consumer
-- (examples/consumer/consumer.py).  Load it after CREATE EXTENSION
-- idempotency:
--
--   psql -d app -c 'CREATE EXTENSION idempotency' -f examples/consumer/schema.sql
--
-- The processed-message ledger needs no table of ours:
-- idem_consume_messages() keeps it in the extension's storage, in the same
-- transaction as the effects below.

-- A table queue with at-least-once delivery.  One row per delivery: a
-- producer that publishes a message twice (its first publish timed out,
-- say) makes two rows with the same message_id.  In lease mode a consumer
-- hides the rows it received until visible_at; if it dies before deleting
-- (acking) them, they come back.
CREATE TABLE queue (
    seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text        NOT NULL,
    account    text        NOT NULL,
    amount     bigint      NOT NULL,
    visible_at timestamptz NOT NULL DEFAULT now(),
    receives   integer     NOT NULL DEFAULT 0   -- lease mode: times received
);

CREATE INDEX queue_visible ON queue (visible_at, seq);

-- The effects of a message: a balance and a ledger line.
CREATE TABLE accounts (
    account text   PRIMARY KEY,
    balance bigint NOT NULL
);

CREATE TABLE ledger (
    -- deliberately not UNIQUE: a message applied twice must show up as two
    -- lines rather than as an error
    message_id text        NOT NULL,
    account    text        NOT NULL,
    amount     bigint      NOT NULL,
    consumer   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per committed batch: what it delivered and what it applied.
CREATE TABLE batches (
    consumer            text        NOT NULL,
    mode                text        NOT NULL,
    delivered           integer     NOT NULL,  -- queue rows in the batch
    applied             integer     NOT NULL,  -- messages whose effect was applied
    redelivered         integer     NOT NULL,  -- rows a lease-mode consumer received before
    redelivered_skipped integer     NOT NULL,  -- ... of which already consumed
    at                  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- What the producer meant to send, each message once: the reference the
-- consumer's result is checked against (each balance = the sum of its
-- messages, each message one ledger line).
CREATE TABLE published (
    message_id text   PRIMARY KEY,
    account    text   NOT NULL,
    amount     bigint NOT NULL
);
