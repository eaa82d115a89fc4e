-- bench/streams.sh: the hand-written offsets table, one row per (consumer,
-- stream, partition) holding the next offset to process; the 4 clients'
-- partitions start at offset 0
CREATE TABLE offsets (
    consumer    text   NOT NULL,
    stream      text   NOT NULL,
    part        int    NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (consumer, stream, part)
);
INSERT INTO offsets SELECT 'bench', 'orders', p, 0 FROM generate_series(0, 3) p;
