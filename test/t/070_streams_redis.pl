
# test/t/070_streams_redis.pl -- exactly-once from a real partitioned log:
# Redis Streams, a consumer group with reassignments and zombies, positions
# in idempotency.positions (issue 25).
#
# A redis-server of this test's own (unix socket in a private directory, no
# TCP, no persistence) holds one stream per partition, 12 of them, with
# entry ids 0-<offset+1> (Redis refuses 0-0).  test/streams/coordinator.py
# writes the log (STREAMS_RECORDS records, 100,000 by default) in chunks,
# starts 4 consumer processes (test/streams/consumer.py) and plays the group
# coordinator Redis does not have: it hands out the partitions with a new
# generation every STREAMS_REBALANCE_SECONDS (2), moving every partition
# each time (the consumers call idem_assign() on assignment and seek where
# it says), and twice it makes a zombie: it SIGSTOPs a consumer that holds
# batches it has read, gives its partitions to the others, waits for their
# idem_assign() to commit, and resumes it; the zombie then tries to apply
# what it holds with its old generation.  Each consumer applies a batch of
# one partition in one transaction: idem_advance() with its generation and
# one row per record in table effects (no unique constraint, so a
# duplicate would show), then COMMIT.  The coordinator writes a chunk of
# the log after every reassignment, so every reassignment and zombie has
# records to come, however fast the machine; the run ends when every
# partition's position is past its last offset.  Waits are for conditions,
# bounded (PG_TEST_TIMEOUT_DEFAULT) for a hung run only.
#
# Three runs, each in a fresh database: every offset present; 10 % of the
# offsets missing (a compacted topic: gaps are not losses); 20 % of the
# batches rolled back after their work (delivered and applied again).
# After each:
#   - effects holds exactly one row per record of the log, with the
#     record's value: 0 duplicates, 0 losses, nothing that is not a record
#     (no offset left out by compaction);
#   - every zombie tried at least one batch after the new owners'
#     assignments committed, and every such try was refused with ID001;
#     and in the tables: no effect row was written under a generation after
#     an assignment of a higher one to its partition had committed (the
#     assignments log and the effect rows carry clock_timestamp() taken
#     under the partition's lock), every effect row was written by the
#     consumer its generation assigned the partition to, and the refusals
#     the clients saw are the refusals idempotency.stats counted;
#   - idempotency.positions holds 12 rows, each at its partition's last
#     offset + 1, with the last generation.
#
# Needs redis-server (Debian package redis-server) and Python 3 with
# psycopg 3 and redis-py (python3-psycopg, python3-redis): skipped without
# them, a failure with IDEM_NO_SKIP=1 (CI; test/lib/deps.sh installs them).
#
# Settings (environment): STREAMS_RECORDS (records per run; 1,000,000 is
# the release-time size), STREAMS_REBALANCE_SECONDS, STREAMS_VARIANTS
# (default "plain compaction rollback"), PYTHON (default /usr/bin/python3),
# REDIS_SERVER (default redis-server from PATH, else /usr/bin/redis-server).
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/070_streams_redis.pl

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/test/streams/coordinator.py";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (test/streams/coordinator.py)')
  unless defined $root;

my $records = $ENV{STREAMS_RECORDS} || 100_000;
my $rebalance = $ENV{STREAMS_REBALANCE_SECONDS} || 2;
my @variants = split ' ', ($ENV{STREAMS_VARIANTS} || 'plain compaction rollback');
my $parts = 12;
my $consumers = 4;
my $zombies = 2;
my $python = $ENV{PYTHON} || '/usr/bin/python3';
my $redis_server = $ENV{REDIS_SERVER};
if (!$redis_server)
{
	$redis_server = '/usr/bin/redis-server';
	for my $dir (split /:/, $ENV{PATH} // '')
	{
		if ($dir ne '' && -x "$dir/redis-server")
		{
			$redis_server = "$dir/redis-server";
			last;
		}
	}
}

# ---------------------------------------------------------------- needs
# The consumers' exactly-once over Redis does not depend on the server's
# major or build: test/run-all.sh runs this test with one server
# (IDEM_SERVER_SPECIFIC_ONLY=1 for the others, see test/run-suites.sh).
plan skip_all => 'the same with every server; another run of this command makes it (IDEM_SERVER_SPECIFIC_ONLY=1)'
  if ($ENV{IDEM_SERVER_SPECIFIC_ONLY} // '') eq '1';
my @missing;
push @missing, "redis-server (Debian package redis-server; not at $redis_server)"
  unless -x $redis_server;
for my $mod ([ 'redis', 'python3-redis' ], [ 'psycopg', 'python3-psycopg' ])
{
	push @missing, "the Python module $mod->[0] for $python (Debian package $mod->[1])"
	  unless system($python, '-c', "import $mod->[0]") == 0;
}
if (@missing)
{
	my $why = 'needs ' . join(', ', @missing);
	if (($ENV{IDEM_NO_SKIP} // '') eq '1')
	{
		plan tests => 1;
		fail("$why (IDEM_NO_SKIP=1, so not skipped)");
		exit 0;
	}
	plan skip_all => $why;
}

# ---------------------------------------------------------------- redis
# One server for the test; each run uses its own keys, and the data of the
# run before is flushed.  The directory is short: a unix socket's path has
# a limit of about 100 bytes.
my $rdir = PostgreSQL::Test::Utils::tempdir_short;
my $rsock = "$rdir/redis.sock";
my ($rout, $rerr) = ('', '');
my $redis = IPC::Run::start(
	[
		$redis_server, '--port', '0', '--unixsocket', $rsock,
		'--unixsocketperm', '700', '--save', '', '--appendonly', 'no',
		'--dir', $rdir, '--daemonize', 'no', '--logfile', "$rdir/redis.log"
	],
	'<', \undef, '>', \$rout, '2>', \$rerr);

# stop it however the test ends
END
{
	if ($redis && $redis->pumpable)
	{
		$redis->signal('TERM');
		eval { $redis->finish; 1 } or $redis->kill_kill;
	}
}

# redis_py CODE: runs Python with r, a client of the test's redis; its output
sub redis_py
{
	my ($code) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			$python, '-c',
			"import redis, sys\nr = redis.Redis(unix_socket_path=sys.argv[1], decode_responses=True)\n$code",
			$rsock
		],
		'<', \undef, '>', \$out, '2>', \$err);
	return ($? == 0, $out . $err);
}

{
	my $end = time + $PostgreSQL::Test::Utils::timeout_default;
	my ($ok, $out) = (0, '');
	while (time < $end)
	{
		($ok, $out) = redis_py('print(r.ping())') if -S $rsock;
		last if $ok && $out =~ /True/;
		last unless $redis->pumpable;
		IPC::Run::pump_nb($redis);
		select(undef, undef, undef, 0.05);
	}
	ok($ok && $out =~ /True/, 'redis-server answers on its unix socket')
	  or BAIL_OUT("redis-server did not start: $rerr $out "
		  . (-f "$rdir/redis.log" ? slurp_file("$rdir/redis.log") : ''));
}

# ---------------------------------------------------------------- postgres
my $node = PostgreSQL::Test::Cluster->new('streams');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 3600
max_connections = 40
synchronous_commit = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE ROLE streams_app LOGIN');

my %variant = (
	plain => { missing => 0, rollback => 0 },
	compaction => { missing => 10, rollback => 0 },
	rollback => { missing => 0, rollback => 20 },);

my $seed = 1;
for my $v (@variants)
{
	BAIL_OUT("unknown variant $v (plain, compaction, rollback)")
	  unless $variant{$v};
	my $db = "streams_$v";
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql(
		$db, q{
		CREATE EXTENSION idempotency;
		-- the log as written to Redis
		CREATE TABLE produced (part int NOT NULL, off bigint NOT NULL, v text NOT NULL,
		                       PRIMARY KEY (part, off));
		-- one row per record applied; no unique constraint, so that a
		-- duplicate would show
		CREATE TABLE effects (part int NOT NULL, off bigint NOT NULL, v text NOT NULL,
		                      consumer text NOT NULL, generation bigint NOT NULL,
		                      written_at timestamptz NOT NULL);
		-- every assignment, written in idem_assign()'s transaction
		CREATE TABLE assignments (part int NOT NULL, generation bigint NOT NULL,
		                          consumer text NOT NULL, assigned_at timestamptz NOT NULL);
		GRANT SELECT, INSERT ON produced, effects, assignments TO streams_app;
	});
	my ($ok, $out) = redis_py('r.flushall()');
	ok($ok, "$v: redis flushed") or diag($out);

	my $logdir = PostgreSQL::Test::Utils::tempdir("streams_$v");
	my $summary_file = "$logdir/summary.json";
	my @cmd = (
		$python, "$root/test/streams/coordinator.py",
		'--records', $records, '--parts', $parts,
		'--consumers', $consumers, '--zombies', $zombies,
		'--rebalance-seconds', $rebalance,
		'--missing-pct', $variant{$v}{missing},
		'--rollback-pct', $variant{$v}{rollback},
		'--redis-socket', $rsock, '--prefix', $v,
		'--group', 'billing', '--stream', 'orders',
		'--summary', $summary_file, '--log-dir', $logdir,
		'--seed', $seed++,
		'--timeout', $PostgreSQL::Test::Utils::timeout_default);
	my $coord_out = '';
	my $start = time;
	my $rc;
	{
		local %ENV = (
			%ENV,
			PGHOST => $node->host,
			PGPORT => $node->port,
			PGDATABASE => $db,
			PGUSER => 'streams_app');
		delete $ENV{PGAPPNAME};
		# a bound for a hung run: the coordinator bounds each of its waits
		my $bound = $PostgreSQL::Test::Utils::timeout_default *
		  (4 + int($records / 100_000) * 2);
		$rc = eval {
			IPC::Run::run(\@cmd, '<', \undef, '>&', \$coord_out,
				IPC::Run::timeout($bound));
			$? >> 8;
		} // do { $coord_out .= "\n$@"; -1 };
	}
	my $secs = time - $start;
	note("$v: coordinator output:\n$coord_out");
	if (!is($rc, 0, "$v: the run got to its end ($records records, ${secs} s)"))
	{
		for my $c (0 .. $consumers - 1)
		{
			my $f = "$logdir/c$c.log";
			diag("---- c$c.log:\n" . slurp_file($f)) if -s $f;
		}
		next;
	}
	my $s = decode_json(slurp_file($summary_file));

	# ------------------------------------------------------------ the log
	is($node->safe_psql($db, 'SELECT count(*) FROM produced'),
		$records, "$v: the log holds $records records");
	if ($variant{$v}{missing})
	{
		my $gaps = $s->{offset_space} - $records;
		cmp_ok($gaps, '>', 0,
			"$v: offsets are missing from the log ($gaps of $s->{offset_space})");
	}

	# ------------------------------------------------------------ exactly once
	is( $node->safe_psql(
			$db, q{
		SELECT count(*) || ' rows, '
		       || count(*) - count(DISTINCT (part, off)) || ' duplicates'
		  FROM effects}),
		"$records rows, 0 duplicates",
		"$v: one effect row per record, 0 duplicates");
	is( $node->safe_psql(
			$db, q{
		SELECT count(*) FROM produced p
		 WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.part = p.part AND e.off = p.off)}),
		0, "$v: 0 losses");
	is( $node->safe_psql(
			$db, q{
		SELECT count(*) FROM effects e
		 WHERE NOT EXISTS (SELECT 1 FROM produced p
		                    WHERE p.part = e.part AND p.off = e.off AND p.v = e.v)}),
		0, "$v: every effect row is a record of the log, with its value");

	# ------------------------------------------------------------ zombies
	my @episodes = @{ $s->{episodes} };
	is(scalar(@episodes), $zombies, "$v: $zombies zombies were made");
	for my $e (@episodes)
	{
		my @tries = @{ $e->{attempts} };
		my $what = "$v: zombie $e->{zombie} (generation $e->{old_gen}, partitions"
		  . " reassigned with $e->{new_gen})";
		cmp_ok(scalar(@tries), '>=', 1,
			"$what tried a batch after the new owners' assignment");
		is_deeply([ map { "$_->{part}:$_->{outcome}" } @tries ],
			[ map { "$_->{part}:ID001" } @tries ],
			"$what: every try was refused with ID001");
	}
	is( $node->safe_psql(
			$db, q{
		WITH w AS (SELECT part, generation, max(written_at) AS last_write
		             FROM effects GROUP BY 1, 2)
		SELECT count(*) FROM w JOIN assignments a
		    ON a.part = w.part AND a.generation > w.generation
		   AND a.assigned_at < w.last_write}),
		0,
		"$v: no effect written under a generation after a higher one was assigned");
	is( $node->safe_psql(
			$db, q{
		SELECT count(*) FROM (SELECT DISTINCT part, generation, consumer FROM effects) e
		 WHERE NOT EXISTS (SELECT 1 FROM assignments a
		                    WHERE (a.part, a.generation, a.consumer)
		                        = (e.part, e.generation, e.consumer))}),
		0,
		"$v: every effect was written by the consumer its generation assigned the partition to");
	my $client_refusals = $s->{refusals};
	$client_refusals += scalar(@{ $_->{attempts} }) for @episodes;
	is( $node->safe_psql(
			$db,
			'SELECT stale_generations FROM idempotency.stats WHERE datname = current_database()'
		),
		$client_refusals,
		"$v: idempotency.stats counted the $client_refusals refusals the consumers saw");

	# ------------------------------------------------------------ positions
	is( $node->safe_psql(
			$db, qq{
		SELECT count(*) || ' rows, '
		       || count(*) FILTER (WHERE pos.next_offset = p.last + 1
		                             AND pos.generation = $s->{generations}
		                             AND pos.role = 'streams_app'::regrole
		                             AND pos.consumer = 'billing'
		                             AND pos.stream = 'orders')
		       || ' at the end of their partition, with generation $s->{generations}'
		  FROM idempotency.positions pos
		  LEFT JOIN (SELECT part, max(off) AS last FROM produced GROUP BY part) p USING (part)}),
		"$parts rows, $parts at the end of their partition, with generation $s->{generations}",
		"$v: the position table holds $parts rows, one per partition, each past its last offset");

	# ------------------------------------------------------------ the run
	cmp_ok($s->{rebalances}, '>=', 8,
		"$v: a reassignment for each chunk of the log ($s->{rebalances}, generation $s->{generations})");
	my %sum;
	for my $c (values %{ $s->{consumers} })
	{
		$sum{$_} += $c->{$_} for qw(batches records rollbacks refused);
	}
	if ($variant{$v}{rollback})
	{
		cmp_ok($sum{rollbacks}, '>', 0,
			"$v: batches were rolled back ($sum{rollbacks}) and applied again");
	}
	note(sprintf(
			"%s: %d s, %d generations, %d batches committed, %d rolled back, "
			  . "%d refused in ordinary reassignments",
			$v, $secs, $s->{generations}, $sum{batches}, $sum{rollbacks},
			$s->{refusals}));
}

my ($ok, $out) = redis_py('r.shutdown(nosave=True)');
$redis->finish;
$node->stop;

done_testing();
