\set r random(1, :replay_keys)
SELECT status, response_code, response_body FROM idem_claim('r' || :r, '{"amount": 100, "currency": "eur"}');
