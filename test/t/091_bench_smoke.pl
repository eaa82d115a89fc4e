
# test/t/091_bench_smoke.pl -- every bench script still runs.
#
# Nothing else runs bench/ between releases, and the figures in
# bench/README.md are only as good as the scripts that make them.  So each
# script (run.sh, scale.sh, bigtxn.sh, drop.sh, soak.sh, wait.sh,
# features.sh, streams.sh, outbox.sh, callgrind.sh) runs
# here in its smoke mode (bench/callgrind-ratios.sh runs in full in
# test/t/090_instructions.pl, on every major), BENCH_SMOKE=1 (bench/lib.sh): the smallest sizes,
# one round, windows of a second or two, seconds each.  It runs as the user
# running the tests, against the installed extension (the scripts build
# nothing here: BENCH_BUILD=0), with PG_CONFIG and PGBIN naming this
# server, and writes its results into a directory of this test's.
#
# Checked: the script exits 0 (in a smoke run, whatever its figures) and
# writes its results file with the shape the full run's is read in: every
# variant, size, phase, series or workload has its line, every figure a
# goal is judged on was measured (PASS or FAIL, never SKIP: not measured),
# and no pgbench run failed.  No figure is checked: a run of seconds on a
# busy machine measures nothing.
#
# The scripts' clusters listen on unix sockets in their own temporary
# directories; their ports come from get_free_port all the same.
# bench/callgrind.sh needs valgrind: skipped without it (a failure with
# IDEM_NO_SKIP=1, as in CI).
#
# IDEM_BENCH_SMOKE=0 skips the whole test: test/run-all.sh runs it once per
# run, with this machine's major, not again in the roots of the other
# majors nor on the assert-enabled server (the scripts are shell and SQL the
# majors share; two and a half minutes each time).
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/091_bench_smoke.pl

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

plan skip_all => 'the bench scripts get their smoke run with another server of this run (IDEM_BENCH_SMOKE=0)'
  if ($ENV{IDEM_BENCH_SMOKE} // '1') eq '0';

# The top of the tree: two levels above this file, or TESTDIR (set by PGXS
# to the directory make ran in).
my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/bench/lib.sh";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (bench/lib.sh)')
  unless defined $root;

# The server under test: PG_CONFIG when make was given one, else the
# pg_config PGXS put first in PATH.
my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
my $bindir = `$pg_config --bindir`;
chomp $bindir;
BAIL_OUT("$pg_config --bindir failed") if $? != 0 || !-x "$bindir/pgbench";

sub slurp
{
	my ($path) = @_;
	open(my $fh, '<', $path) or die "could not open $path: $!";
	local $/;
	my $text = <$fh>;
	close($fh);
	return $text;
}

# run_bench SCRIPT, RESULTS_DIR, VAR => VALUE ...: runs bench/SCRIPT in
# smoke mode; returns its exit status and output (stdout and stderr)
sub run_bench
{
	my ($script, $results, %env) = @_;
	local %ENV = (
		%ENV,
		BENCH_SMOKE => 1,
		BENCH_BUILD => 0,
		SCALE_BUILD => 0,
		BENCH_RESULTS => $results,
		PG_CONFIG => "$bindir/pg_config",
		PGBIN => $bindir,
		%env);
	my $out = '';
	my $start = time;
	my $rc = eval {
		IPC::Run::run([ 'bash', "$root/bench/$script" ],
			'<', \undef, '>&', \$out,
			IPC::Run::timeout(2 * $PostgreSQL::Test::Utils::timeout_default));
		$? >> 8;
	};
	if (!defined $rc)
	{
		$out .= "\n$@";    # timed out: IPC::Run has killed it
		$rc = -1;
	}
	note("bench/$script: exit status $rc in " . (time - $start) . ' s');
	return ($rc, $out);
}

# one smoke run: exit status 0 and a results file, else its output
sub smoke
{
	my ($script, $file_re, %env) = @_;
	my $results = PostgreSQL::Test::Utils::tempdir("bench_$script");
	my ($rc, $out) = run_bench($script, $results, %env);
	if (!is($rc, 0, "bench/$script exits 0 in a smoke run"))
	{
		diag("bench/$script output (last 60 lines):");
		my @lines = split /\n/, $out;
		diag($_) for @lines[ ($#lines > 59 ? $#lines - 59 : 0) .. $#lines ];
	}
	opendir(my $dh, $results) or die "could not open $results: $!";
	my @files = sort grep { /$file_re/ } readdir($dh);
	closedir($dh);
	ok(@files, "bench/$script wrote its results file ($file_re)")
	  or return;
	my %text = map { $_ => slurp("$results/$_") } @files;
	for my $f (@files)
	{
		unlike($text{$f}, qr/^run failed:/m,
			"bench/$script: $f does not record a failed run");
	}
	return \%text;
}

# the verdicts of the goal lines of bench/lib.sh's check (LABEL ... OP
# TARGET VERDICT) in TEXT
sub verdicts
{
	my ($text) = @_;
	return map { /\s(?:>=|<=|=)\s+\S+\s+(PASS|FAIL|SKIP)\b/ ? $1 : () }
	  split /\n/, $text;
}

my $number = qr/-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?/;

# ---------------------------------------------------------------- run.sh
{
	my $r = smoke('run.sh', qr/^latest\.txt$/,
		BENCH_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my $t = $r->{'latest.txt'};
		like($t, qr/^== idempotency bench /m, 'run.sh: the summary header');
		for my $v (
			qw(floor_stmt plain_insert plain_func idem_p2 idem_p24 idem_p48
			idem_batch floor_txn keys_raw keys_plpgsql keys_idem replay_plpgsql
			replay_idem))
		{
			like($t, qr/^raw round=1 variant=$v db=\S+ tps=$number ids_per_s=$number cpu_us=$number$/m,
				"run.sh: variant $v measured (its pgbench run did not fail), with its server CPU");
			like($t,
				qr/^raw wal variant=$v db=\S+ transactions=\d+ calls=\d+ bytes=$number bytes_per_call=$number$/m,
				"run.sh: WAL per call of variant $v measured");
		}
		like($t, qr{^WAL per call: consume / \(a\) plain INSERT\s+$number\s+info$}m,
			'run.sh: WAL per call, consume / plain insert');
		like($t, qr{^WAL per call: claim\+complete / \(a\) raw SQL\s+$number\s+info$}m,
			'run.sh: WAL per call, claim+complete / raw SQL');
		like($t,
			qr{^WAL per call: replay / \(b\) PL/pgSQL replay\s+(?:$number|NA)\s+info\s+bytes per call: $number vs $number$}m,
			'run.sh: WAL per call of the replays (a ratio of nothing written is NA)');
		like($t, qr/^raw storage kind=plain rows=2000 /m,
			'run.sh: storage of the plain table measured');
		like($t, qr/^raw storage kind=idem rows=2000 /m,
			'run.sh: storage of the message ledger measured');
		my @v = verdicts($t);
		is(scalar(@v), 14,
			'run.sh: the 8 bars, 3 aims (above the round-trip floor) and 3 server-CPU goals of a default run');
		# an aim is SKIP, its figure undefined, when the raw SQL was no
		# slower than the floor in its round: figures, not checked here
		my @lines = grep { /\s(?:>=|<=|=)\s+\S+\s+SKIP\b/ } split /\n/, $t;
		is_deeply([ grep { !/\sSKIP\s+aim; rounds: NA\(raw<=floor\)$/ } @lines ],
			[], 'run.sh: no bar or aim SKIP (not measured)');
		like($t, qr/^elapsed: /m, 'run.sh: ran to its end');
	}
}

# ---------------------------------------------------------------- scale.sh
{
	my $r = smoke('scale.sh', qr/^scale-latest\.(txt|dat)$/,
		SCALE_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my $dat = $r->{'scale-latest.dat'} // '';
		like($dat, qr/^# server: /m, 'scale.sh: the table names the server');
		my @rows = grep { !/^#/ && /\S/ } split /\n/, $dat;
		is(scalar(@rows), 1, 'scale.sh: one row per size');
		my @fields = split ' ', $rows[0] // '';
		is(scalar(grep { /^$number$/ } @fields),
			23, 'scale.sh: the row has its 23 figures, every one a number');
		my @v = verdicts($r->{'scale-latest.txt'} // '');
		is(scalar(@v), 4, 'scale.sh: the 4 goals of one size');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'scale.sh: no goal SKIP');
	}
}

# ---------------------------------------------------------------- bigtxn.sh
{
	my $r = smoke('bigtxn.sh', qr/^bigtxn-latest\.txt$/,
		BIGTXN_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my $t = $r->{'bigtxn-latest.txt'};
		for my $phase ('claim', 'complete', 'consume', 'plain insert')
		{
			like($t, qr/^  \Q$phase\E\s+(?:$number\s+){9}$number$/m,
				"bigtxn.sh: phase '$phase' timed in ten slices");
		}
		my @v = verdicts($t);
		is(scalar(@v), 4, 'bigtxn.sh: the 4 goals');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'bigtxn.sh: no goal SKIP');
		like($t, qr/^  claim \d+ \S+ \d+ bytes per claim held$/m,
			'bigtxn.sh: backend memory per claim held');
	}
}

# ---------------------------------------------------------------- drop.sh
{
	my $r = smoke('drop.sh', qr/^drop-.*\.txt$/,
		DROP_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my ($t) = values %$r;
		like($t, qr/^timeline of the load/m, 'drop.sh: the timeline');
		like($t, qr/^drop 1: idem_maintain\(\) \S+ ms, \+ 1 s\s+\d+/m,
			'drop.sh: the window of drop 1 under load');
		my @v = verdicts($t);
		is(scalar(@v), 4, 'drop.sh: the 4 bars');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'drop.sh: no bar SKIP');
	}
}

# ---------------------------------------------------------------- soak.sh
{
	my $r = smoke('soak.sh', qr/^soak-.*\.(txt|csv)$/,
		SOAK_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my ($csv) = map { $r->{$_} } grep { /\.csv$/ } keys %$r;
		my ($txt) = map { $r->{$_} } grep { /\.txt$/ } keys %$r;
		my @rows = split /\n/, $csv // '';
		my $header = shift @rows // '';
		is(scalar(split /,/, $header, -1), 19, 'soak.sh: 19 columns');
		ok(@rows >= 3, 'soak.sh: at least 3 samples (' . scalar(@rows) . ')');
		is(scalar(grep { scalar(split /,/, $_, -1) != 19 } @rows),
			0, 'soak.sh: every sample has its 19 fields');
		my @series = grep { !/^errors / && /\s(?:PASS|FAIL|SKIP)(?: \(info\))?$/ }
		  split /\n/, $txt // '';
		is(scalar(@series), 12, 'soak.sh: a verdict for each of the 12 series');
		is_deeply([ grep { /SKIP/ } @series ], [], 'soak.sh: no series SKIP');
		like($txt // '', qr/^errors \(.*\s=\s+0\s+PASS/m,
			'soak.sh: no error under load');
	}
}

# ---------------------------------------------------------------- wait.sh
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $r = smoke('wait.sh', qr/^wait-latest\.txt$/, WAIT_PORT => $port);
	if ($r)
	{
		my $t = $r->{'wait-latest.txt'};
		for my $mode (qw(preload nopreload))
		{
			like($t, qr/^raw round=1 mode=\Q$mode\E status=\w+ commit_to_answer_ms=$number/m,
				"wait.sh: a measured wait on the $mode server");
		}
		my @v = verdicts($t);
		is(scalar(@v), 2, 'wait.sh: a verdict for each of its 2 goals');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'wait.sh: no goal SKIP');
	}
}

# ---------------------------------------------------------------- features.sh
{
	my $r = smoke('features.sh', qr/^features-latest\.txt$/,
		FEATURES_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my $t = $r->{'features-latest.txt'};
		for my $v (qw(plain_base plain_new twophase_base twophase_new keep_new headers_new))
		{
			like($t, qr/^raw round=1 variant=\Q$v\E side=\w+ tps=$number/m,
				"features.sh: variant $v measured");
		}
		like($t, qr/^raw storage side=new /m, 'features.sh: bytes per key measured');
		my @v = verdicts($t);
		is(scalar(@v), 3, 'features.sh: a verdict for each of its 3 goals');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'features.sh: no goal SKIP');
	}
}

# ---------------------------------------------------------------- streams.sh
{
	my $r = smoke('streams.sh', qr/^streams-latest\.txt$/,
		STREAMS_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my $t = $r->{'streams-latest.txt'};
		for my $b (1, 100, 1000)
		{
			for my $d (qw(advance ledger offsets))
			{
				like($t,
					qr/^raw round=1 variant=${d}_$b batch=$b tps=$number records_per_s=$number cpu_us=$number$/m,
					"streams.sh: variant ${d}_$b measured");
			}
		}
		for my $d (qw(advance ledger offsets))
		{
			for my $n (2000, 20000)
			{
				like($t, qr/^raw storage design=$d records=$n /m,
					"streams.sh: bytes of $d after $n records measured");
			}
		}
		my @v = verdicts($t);
		is(scalar(@v), 4, 'streams.sh: a verdict for each of its 4 goals (3 of throughput, 1 of server CPU)');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'streams.sh: no goal SKIP');
		like($t, qr/^elapsed: /m, 'streams.sh: ran to its end');
	}
}

# ---------------------------------------------------------------- outbox.sh
{
	my $r = smoke('outbox.sh', qr/^outbox-\d{8}-\d{6}\.txt$/,
		OUTBOX_PORT => PostgreSQL::Test::Cluster::get_free_port());
	if ($r)
	{
		my ($t) = values %$r;
		my @rounds = $t =~ /^raw round=\d+ ours_bytes=\d+ handmade_bytes=\d+ segments=\d+ ours_lag=0 handmade_left=0 .* publish_ratio=[0-9.e+-]+ relay_ratio=[0-9.e+-]+$/mg;
		is(scalar(@rounds), 6, 'outbox.sh: a line per round, both outboxes relayed dry, both sides timed');
		my @v = verdicts($t);
		is(scalar(@v), 3, 'outbox.sh: a verdict for each goal (ours flat, publish, relay)');
		is_deeply([ grep { $_ eq 'SKIP' } @v ], [], 'outbox.sh: every goal measured');
		like($t, qr/^elapsed: /m, 'outbox.sh: ran to its end');
	}
}

# ---------------------------------------------------------------- callgrind.sh
SKIP:
{
	if (system('command -v valgrind >/dev/null 2>&1') != 0)
	{
		fail('bench/callgrind.sh needs valgrind (IDEM_NO_SKIP=1)')
		  if ($ENV{IDEM_NO_SKIP} // '') eq '1';
		skip 'valgrind is not installed (Debian package valgrind)', 1;
	}
	my $r = smoke('callgrind.sh', qr/^callgrind-latest\.txt$/);
	if ($r)
	{
		my $t = $r->{'callgrind-latest.txt'};
		for my $w (
			qw(consume consume_raw claim_complete claim_raw replay replay_raw))
		{
			like($t, qr/^\Q$w\E\s+\d+$/m,
				"callgrind.sh: instructions per call of $w");
		}
	}
}

done_testing();
