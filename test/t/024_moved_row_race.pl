
# test/t/024_moved_row_race.pl -- completing a claim moves its row to another
# page while other callers probe for the key: still one claim per key.
#
# A probe reads the matching entries of a digest index first and visits the
# rows after.  When idem_complete() stores a response too big for a HOT
# update, the row's new version goes to another page and gets a new index
# entry.  A probe that had read the entries before that one was added, and
# reached the old version only after the completing transaction committed,
# saw neither version live and claimed the key again: two payments for one
# key (found by the PL/Proxy example, about 1 run in 13).  idem_complete()
# now takes the key lock for its own claim too, so moves and probes take
# turns.
#
# To make the window wide enough to hit in seconds, every key also has rows
# of 300 other roles (same digest, earlier in the index), which each probe
# visits and skips before it reaches the caller's row, and responses are
# 1.6 kB, so most completions move the row.  8 clients pay for a new key
# every 20 ms, all of them for the same key at once, with wait => true.
# Before the fix, an 8 s run paid 5 to 11 keys twice.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('moved_row_race');
$node->init;
$node->append_conf('postgresql.conf', q{
fsync = off
synchronous_commit = off
});
$node->start;

my $nroles = 300;
my $nkeys = 200;
$node->safe_psql('postgres', qq{
CREATE EXTENSION idempotency;
SELECT idem_maintain();
CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL);
DO \$\$
BEGIN
  FOR i IN 1..$nroles LOOP
    EXECUTE format('CREATE ROLE other%s', i);
  END LOOP;
END \$\$;
CREATE FUNCTION pay(nkeys int) RETURNS text
LANGUAGE plpgsql AS \$\$
DECLARE
  k  text := 'race-' || ((extract(epoch FROM clock_timestamp()) * 1000)::bigint / 20 % nkeys);
  st text;
BEGIN
  SELECT status INTO st FROM idem_claim(k, '{"amount": 1}', scope => 's', wait => true);
  IF st = 'claimed' THEN
    INSERT INTO payments (key) VALUES (k);
    PERFORM idem_complete(k, 201,
      jsonb_build_object('pad', (SELECT string_agg(md5(i::text || k), '')
                                   FROM generate_series(1, 50) i)),
      scope => 's');
  END IF;
  RETURN st;
END \$\$;
});

# other roles' rows of every key, one transaction per role
$node->safe_psql('postgres', qq{
DO \$\$
BEGIN
  FOR r IN 1..$nroles LOOP
    EXECUTE format('SET ROLE other%s', r);
    FOR k IN 0..$nkeys - 1 LOOP
      PERFORM idem_claim('race-' || k, scope => 's');
      PERFORM idem_complete('race-' || k, 200, scope => 's');
    END LOOP;
    RESET ROLE;
    COMMIT;
  END LOOP;
END \$\$;
});
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.keys'),
	$nroles * $nkeys, 'other roles hold every key');

$node->pgbench(
	'--no-vacuum --client=8 --jobs=2 --time=8',
	0,
	[ qr{processed: [1-9]}, qr{failed transactions: 0 \(}s ],
	[qr{^$}],
	'8 clients paying for the same keys at once: no call fails',
	{ 'moved_row_race' => "SELECT pay($nkeys);\n" });

is($node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT key) FROM payments'),
	'0', 'no key was paid twice');
is($node->safe_psql('postgres', 'SELECT count(DISTINCT key) FROM payments'),
	$nkeys, 'every key was paid');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.keys
	 WHERE role = current_user::regrole AND state = 'c' AND response_code = 201
}), $nkeys, 'one completed key of the paying role per key');

# the race needs completions that moved rows: check that many did
ok($node->poll_query_until('postgres', q{
	SELECT sum(n_tup_upd - n_tup_hot_upd) >= 50
	  FROM pg_stat_all_tables WHERE schemaname = 'idempotency'
}), 'completions moved rows to other pages (non-HOT updates)');

$node->stop;
done_testing();
