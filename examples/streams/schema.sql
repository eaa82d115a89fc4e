-- examples/streams/schema.sql -- the tables of the example consumer
-- (consumer.py): what applying a payment record does.  The positions are
-- the extension's (idempotency.positions, through idem_assign and
-- idem_advance); nothing here records which records were applied.

-- one line per record applied.  No unique constraint on (stream, part,
-- off): the position is what keeps a record from being applied twice (the
-- test counts duplicates to show it).  An application may add one as a
-- second guard; it costs an index entry per record.
CREATE TABLE ledger (
    stream     text        NOT NULL,
    part       integer     NOT NULL,
    off        bigint      NOT NULL,
    account    text        NOT NULL,
    amount     bigint      NOT NULL,
    consumer   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE balances (
    account text PRIMARY KEY,
    balance bigint NOT NULL
);
