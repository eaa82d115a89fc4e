-- the round-trip floor of a one-statement transaction (consume, replay): one
-- statement that does no work, measured beside them in every round
SELECT 1;
