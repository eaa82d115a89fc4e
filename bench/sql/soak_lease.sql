-- bench/soak.sh: two-phase mode: claim a fresh key with a lease and commit,
-- record a recovery point, then complete it with the fencing token
\set k random(1, 9223372036854775806)
SELECT token FROM idem_claim('l' || :k, '{"amount": 100}', lease => '5 s') \gset
SELECT idem_checkpoint('l' || :k, 'charge_created', token => :token);
SELECT idem_complete('l' || :k, 201, '{"payment": 9}', token => :token);
