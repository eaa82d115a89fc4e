-- the round-trip floor of claim + complete: the same four statements and four
-- round trips as keys_idem.sql and keys_raw.sql, none of them doing any work
BEGIN;
SELECT 1;
SELECT 1;
COMMIT;
