\set r random(1, 9223372036854775806)
SELECT token FROM idem_claim('k' || :r, '{"amount": 100, "currency": "eur"}', lease => '1 min') \gset
SELECT idem_complete('k' || :r, 201, '{"charge": 1}', token => :token);
