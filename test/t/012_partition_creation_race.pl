
# test/t/012_partition_creation_race.pl -- calls that make partitions on the
# spot, racing for the same ids, never deadlock.
#
# Where no partition maker worker can be started (here: no worker slot), a
# call that finds the partition it needs missing makes it in its own
# transaction and holds the ledger's creation lock until it ends.  It must
# not let go of its key lock in between: another call for the same id could
# take that key lock and then wait for the creation lock, while the first
# waits for the key lock again (a deadlock, found by the HTTP example's
# parallel test).  8 clients consume the same ids (one new id every 100 ms)
# with ttls spread over 60 partitions per lane nobody has made, within the
# horizon (premake 64) so that they have the usual width, for a few
# seconds: no failed call, no deadlock in the log, every id recorded once.
# An 8 s run makes dozens of partitions; on a busy machine that made fewer
# than 11, runs go on until it has (at most for the TAP timeout).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use Torture qw(amcheck_ledger);

my $node = PostgreSQL::Test::Cluster->new('creation_race');
$node->init;
$node->append_conf('postgresql.conf', q{
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
idempotency.premake = 64
max_worker_processes = 0
deadlock_timeout = 100ms
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CREATE TABLE effects (id text, at timestamptz DEFAULT clock_timestamp())');

my $offset = -s $node->logfile;
# partitions made on the spot, far enough ahead to be the calls' own
my $made = q{SELECT count(*) FROM idempotency.partition_info() WHERE upper_bound > now() + interval '20 seconds'};
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
		"run $run: 8 clients making partitions on the spot for the same ids: no call fails",
		{
			"race_messages_$run" => q{
\set w random(1, 120)
INSERT INTO effects (id)
SELECT id FROM (SELECT 'm' || floor(extract(epoch FROM clock_timestamp()) * 10)::bigint AS id) s
 WHERE idem_consume_message('c', id, ((4 + :w) || ' seconds')::interval);
},
			"race_keys_$run" => q{
\set w random(1, 120)
BEGIN;
WITH k AS (SELECT 'k' || floor(extract(epoch FROM clock_timestamp()) * 10)::bigint AS key),
     c AS (SELECT key, (idem_claim(key, ttl => ((4 + :w) || ' seconds')::interval,
                                   wait => true)).status FROM k)
SELECT CASE WHEN status = 'claimed' THEN idem_release(key) END FROM c;
COMMIT;
}
		});
} until ($node->safe_psql('postgres', $made) > 10 || time > $deadline);

my $log = slurp_file($node->logfile, $offset);
unlike($log, qr/deadlock detected/, 'no deadlock');
is($node->safe_psql('postgres', 'SELECT count(*) - count(DISTINCT id) FROM effects'),
	'0', 'every message id had its effect once');
cmp_ok($node->safe_psql('postgres', $made), '>', 10,
	"the calls made partitions on the spot ($run run(s) of 8 s)");
amcheck_ledger($node, 'postgres', 'after the races');

$node->stop;
done_testing();
