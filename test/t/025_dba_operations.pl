# test/t/025_dba_operations.pl -- what DBAs do to the ledgers, under load.
#
# Eight pgbench clients run the torture workload (Torture::torture_scripts:
# same-transaction and two-phase claims that charge a business table,
# single and batch consumes that write effects) over 20,000 keys and ids
# with the default ttls, so that most calls write and every index of a
# partition gets new entries, while a DBA session works on the ledgers'
# partitions and indexes:
#
#   1. REINDEX TABLE CONCURRENTLY of every ledger partition, REINDEX INDEX
#      CONCURRENTLY of every ledger index, reindexdb --concurrently of the
#      database, over and over (not REINDEX of the partitioned parents: that
#      first takes SHARE locks on every partition at once, and deadlocks with
#      any transaction that writes two of them, ledger or not: see
#      doc/operations.md);
#   2. plain REINDEX TABLE, VACUUM FULL, CLUSTER ... USING the digest index,
#      ALTER TABLE ... SET TABLESPACE and back, partition by partition: they
#      take strong locks, calls wait and go on;
#   3. indexes of the DBA's own on every partition (on another column, a
#      partial one on the digest, one on an expression), made before the
#      load, after which the digest index is rebuilt so that it has the
#      highest OID.
#
# After each: pgbench exits 0 with zero failed transactions (no call got an
# error), no key was charged twice and no message processed twice, every
# charged key replays and every processed message is still a duplicate
# (Torture::check_torture), and amcheck's bt_index_check(heapallindexed)
# is clean on every btree index of every ledger partition, the DBA's
# included.  Finally pg_repack refuses the ledger partitions (they have no
# primary key) and leaves them as they were.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);
use Torture;

my $seconds = $ENV{DBA_LOAD_SECONDS} || 12;
my $db = 'dba';

my $node = PostgreSQL::Test::Cluster->new('dba');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
log_statement = none
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', "CREATE DATABASE $db");
create_business_schema($node, $db);
$node->safe_psql($db, 'CREATE EXTENSION amcheck');
ok( poll_until(
		'partitions of both ledgers',
		sub {
			$node->safe_psql($db, 'SELECT idem_maintain()');
			return $node->safe_psql($db,
				'SELECT count(DISTINCT table_name) FROM idempotency.partitions') eq '2';
		}),
	'partitions of both ledgers exist');

my $tsdir = $node->basedir . '/ts';
mkdir $tsdir or die "mkdir $tsdir: $!";
$node->safe_psql($db, "CREATE TABLESPACE dba_ts LOCATION '$tsdir'");

my $partitions_sql = q{SELECT partition FROM idempotency.partitions ORDER BY 1};
my $indexes_sql = q{
SELECT i.indexrelid::regclass
  FROM pg_index i JOIN idempotency.partitions p ON p.partition = i.indrelid
 ORDER BY 1};

# every btree index of every ledger partition, checked against its heap
sub amcheck
{
	my ($label) = @_;
	my ($rc, $total, $err) = $node->psql($db, q{
		SELECT count(*) FROM (
		  SELECT bt_index_check(i.indexrelid, true)
		    FROM pg_index i
		    JOIN idempotency.partitions p ON p.partition = i.indrelid
		    JOIN pg_class c ON c.oid = i.indexrelid
		    JOIN pg_am am ON am.oid = c.relam
		   WHERE am.amname = 'btree' AND i.indisvalid) s});
	ok($rc == 0 && $total > 0,
		"$label: amcheck bt_index_check(heapallindexed) is clean on all $total ledger indexes")
	  or diag($err);
	return $total;
}

# runs the load for $seconds while $op->() is called over and over;
# returns how many DBA operations ran
sub under_load
{
	my ($label, $op) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir;
	my $log_off = log_size($node);
	my $load = start_pgbench(
		$dir, torture_scripts(),
		'-h', $node->host, '-p', $node->port,
		'-c', '8', '-j', '2', '-T', $seconds,
		'-D', 'hot_keys=20000', '-D', 'hot_msgs=20000', $db);
	my $ops = 0;
	my $deadline = time + $seconds;
	while (time < $deadline)
	{
		$ops += $op->();
	}
	my ($rc, $out, $err) = finish_pgbench($load);
	pgbench_summary("$label load", $rc, $out, $err);
	ok($ops > 0, "$label: $ops operations ran during the load");
	check_torture(
		$node, $db, $label,
		key_ttl_us     => 86_400_000_000,
		message_ttl_us => 7 * 86_400_000_000,
		expiring       => 0);
	amcheck($label);
	my @errors = server_log_errors($node, $log_off,
		qr/canceling autovacuum task/);
	is(scalar(@errors), 0, "$label: the server log has no ERROR")
	  or diag(join("\n", @errors[ 0 .. ($#errors < 20 ? $#errors : 19) ]));
	return $ops;
}

# ---------------------------------------------------------------- 1
under_load(
	'REINDEX CONCURRENTLY',
	sub {
		my $n = 0;
		for my $p (split /\n/, $node->safe_psql($db, $partitions_sql))
		{
			$node->safe_psql($db, "REINDEX TABLE CONCURRENTLY $p");
			$n++;
		}
		for my $i (split /\n/, $node->safe_psql($db, $indexes_sql))
		{
			$node->safe_psql($db, "REINDEX INDEX CONCURRENTLY $i");
			$n++;
		}
		my ($out, $err);
		IPC::Run::run(
			[ 'reindexdb', '--concurrently', '-h', $node->host, '-p', $node->port, '-d', $db ],
			'>', \$out, '2>', \$err)
		  or die "reindexdb --concurrently failed: $err";
		return $n + 1;
	});

# ---------------------------------------------------------------- 2
under_load(
	'strong locks',
	sub {
		my $n = 0;
		for my $p (split /\n/, $node->safe_psql($db, $partitions_sql))
		{
			my ($idx) = split /\n/, $node->safe_psql($db,
				"SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
				  WHERE i.indrelid = '$p'::regclass ORDER BY 1 LIMIT 1");
			$node->safe_psql($db, "REINDEX TABLE $p");
			$node->safe_psql($db, "VACUUM FULL $p");
			$node->safe_psql($db, "CLUSTER $p USING $idx");
			$node->safe_psql($db, "ALTER TABLE $p SET TABLESPACE dba_ts");
			$node->safe_psql($db, "ALTER TABLE $p SET TABLESPACE pg_default");
			$n += 5;
		}
		return $n;
	});

# ---------------------------------------------------------------- 3
my $extra = 0;
for my $p (split /\n/, $node->safe_psql($db, $partitions_sql))
{
	(my $name = $p) =~ s/^idempotency\.//;
	$node->safe_psql($db, qq{
		CREATE INDEX ${name}_role_dba ON $p (role);
		CREATE INDEX ${name}_partial_dba ON $p (digest) WHERE digest < '80000000-0000-0000-0000-000000000000';
		CREATE INDEX ${name}_expr_dba ON $p ((digest::text));
	});
	$extra += 3;
}
# the extension's own index is now the newest of each partition
for my $i (split /\n/, $node->safe_psql($db, q{
	SELECT i.indexrelid::regclass FROM pg_index i
	  JOIN idempotency.partitions p ON p.partition = i.indrelid
	 WHERE i.indexrelid::regclass::text LIKE '%digest_idx'}))
{
	$node->safe_psql($db, "REINDEX INDEX CONCURRENTLY $i");
}
is( $node->safe_psql($db, q{
		SELECT count(*) FROM idempotency.partitions p
		 WHERE (SELECT min(indexrelid) FROM pg_index WHERE indrelid = p.partition)
		     = (SELECT min(indexrelid) FROM pg_index i
		         WHERE indrelid = p.partition AND i.indexrelid::regclass::text LIKE '%digest_idx')}),
	'0', 'an index of the DBA\'s has a lower OID than the digest index on every partition');
under_load('extra indexes', sub { $node->safe_psql($db, 'ANALYZE idempotency.keys'); return 1; });
is( $node->safe_psql($db, q{
		SELECT count(*) FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
		 WHERE c.relname LIKE '%\_dba' AND i.indisvalid}),
	$extra, "the DBA's $extra indexes are still there and valid");

# ---------------------------------------------------------------- pg_repack
SKIP:
{
	skip 'pg_repack is not installed', 3
	  unless -x $node->config_data('--bindir') . '/pg_repack';
	$node->safe_psql($db, 'CREATE EXTENSION pg_repack');
	my ($p) = split /\n/, $node->safe_psql($db, $partitions_sql);
	my $before = $node->safe_psql($db, "SELECT pg_relation_filenode('$p')");
	my ($stdout, $stderr);
	IPC::Run::run(
		[ $node->config_data('--bindir') . '/pg_repack', '-h', $node->host, '-p', $node->port,
		  '-d', $db, '-t', $p ],
		'>', \$stdout, '2>', \$stderr);
	like($stderr, qr/must have a primary key or not-null unique keys/,
		'pg_repack refuses a ledger partition: it has no primary key');
	is($node->safe_psql($db, "SELECT pg_relation_filenode('$p')"), $before,
		'and leaves it as it was');
	is($node->safe_psql($db, q{SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'repack%' AND nspname <> 'repack'}),
		'0', 'and leaves nothing behind');
}

$node->stop;
done_testing();
