-- Plain-table baseline: what applications hand-roll today.
CREATE TABLE plain_messages (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE FUNCTION plain_consume(consumer text, message_id text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO plain_messages(consumer, message_id)
    VALUES (plain_consume.consumer, plain_consume.message_id)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
