
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
# Before the fix, an 8 s run paid 5 to 14 keys twice.  The keys go round
# every 4 s; an 8 s run pays every key on a quiet machine, and on a busy one
# that has missed a key's 20 ms both times, runs go on until every key is
# paid (at most for the TAP timeout).
#
# idem_lookup() takes no key lock, so it can still meet a row being moved;
# when its probe finds nothing but passed a dead index entry, it probes
# again.  Alongside, role "tp" claims the same keys with a lease (committed
# in progress) and completes them in a second transaction, and lookup
# clients check that the last keys tp has claimed are never missing.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use Torture qw(amcheck_ledger);

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

# role tp: two-phase claims of the same keys, and lookups of them
$node->safe_psql('postgres', qq{
CREATE ROLE tp;
CREATE TABLE tp_claimed (id bigserial PRIMARY KEY, b int NOT NULL);
CREATE TABLE lookup_misses (b int NOT NULL, at timestamptz DEFAULT clock_timestamp());
ALTER TABLE tp_claimed OWNER TO tp;
ALTER TABLE lookup_misses OWNER TO tp;
CREATE FUNCTION tp_claim(nkeys int, OUT b int, OUT tok bigint)
LANGUAGE plpgsql SECURITY DEFINER AS \$\$
DECLARE
  st text;
BEGIN
  b := (extract(epoch FROM clock_timestamp()) * 1000)::bigint / 20 % nkeys;
  SELECT c.status, c.token INTO st, tok
    FROM idem_claim('race-' || b, scope => 's', lease => '1 minute') c;
  IF st = 'claimed' THEN
    INSERT INTO tp_claimed (b) VALUES (b);
  ELSE
    tok := 0;
  END IF;
END \$\$;
CREATE FUNCTION tp_complete(b int, tok bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS \$\$
BEGIN
  IF tok <> 0 THEN
    PERFORM idem_complete('race-' || b, 201,
      jsonb_build_object('pad', (SELECT string_agg(md5(i::text || b), '')
                                   FROM generate_series(1, 50) i)),
      scope => 's', token => tok);
  END IF;
END \$\$;
-- the last keys tp claimed (committed before the lookup starts) must show
CREATE FUNCTION tp_check() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS \$\$
BEGIN
  INSERT INTO lookup_misses (b)
  SELECT c.b FROM (SELECT b FROM tp_claimed ORDER BY id DESC LIMIT 2) c
   WHERE NOT EXISTS (SELECT FROM idem_lookup('race-' || c.b, 's'));
END \$\$;
ALTER FUNCTION tp_claim(int) OWNER TO tp;
ALTER FUNCTION tp_complete(int, bigint) OWNER TO tp;
ALTER FUNCTION tp_check() OWNER TO tp;
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

# what the checks below need the runs to have done: every key paid, and
# claimed by tp (half of them are enough)
my $covered = qq{SELECT (SELECT count(DISTINCT key) FROM payments) = $nkeys
                    AND (SELECT count(DISTINCT b) FROM tp_claimed) >= $nkeys / 2};
my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
my $run = 0;
do
{
	$run++;
	$node->pgbench(
		'--no-vacuum --client=8 --jobs=2 --time=8',
		0,
		[ qr{processed: [1-9]}, qr{failed transactions: 0 \(}s ],
		[qr{^$}],
		"run $run: 8 clients paying for the same keys at once: no call fails",
		{
			"moved_row_pay_$run\@4" => "SELECT pay($nkeys);\n",
			"moved_row_two_phase_$run\@2" =>
			  "SELECT b, tok FROM tp_claim($nkeys) \\gset\nSELECT tp_complete(:b, :tok);\n",
			"moved_row_lookup_$run\@2" => "SELECT tp_check();\n",
		});
} until ($node->safe_psql('postgres', $covered) eq 't' || time > $deadline);
note("$run run(s) of 8 s: "
	  . $node->safe_psql('postgres',
		q{SELECT format('%s payments of %s keys, %s two-phase claims of %s keys',
		                (SELECT count(*) FROM payments), (SELECT count(DISTINCT key) FROM payments),
		                (SELECT count(*) FROM tp_claimed), (SELECT count(DISTINCT b) FROM tp_claimed))}));

is($node->safe_psql('postgres',
		'SELECT count(*) - count(DISTINCT key) FROM payments'),
	'0', 'no key was paid twice');
is($node->safe_psql('postgres', 'SELECT count(DISTINCT key) FROM payments'),
	$nkeys, 'every key was paid');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.keys
	 WHERE role = current_user::regrole AND state = 'c' AND response_code = 201
}), $nkeys, 'one completed key of the paying role per key');

is($node->safe_psql('postgres', 'SELECT count(*) FROM lookup_misses'),
	'0', 'idem_lookup() never missed a key claimed before it started');
cmp_ok($node->safe_psql('postgres', 'SELECT count(DISTINCT b) FROM tp_claimed'),
	'>=', $nkeys / 2, 'two-phase claims were made and looked up');

# the race needs completions that moved rows: check that many did
ok($node->poll_query_until('postgres', q{
	SELECT sum(n_tup_upd - n_tup_hot_upd) >= 50
	  FROM pg_stat_all_tables WHERE schemaname = 'idempotency'
}), 'completions moved rows to other pages (non-HOT updates)');
amcheck_ledger($node, 'postgres', 'after the completions');

$node->stop;
done_testing();
