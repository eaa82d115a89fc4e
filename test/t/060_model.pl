# test/t/060_model.pl -- the model-based random test of the SQL API
# (test/model/idem_model.py; issue 21, section 2).
#
# A seeded Python script drives the API from 3 sessions at once (claims in
# both modes, completions, checkpoints, releases, lookups, single and batch
# consumes, exports and imports with bad records, savepoints, rollbacks,
# bad arguments, cancels and timeouts, races of 2 or 3 statements sent at
# once) with ttls of 1 to 3 s while partitions roll over every second, and
# checks every answer against a reference model of doc/reference.md: the
# answer must be one the contract allows given the order in which the
# racing statements may have taken effect and where the clock may have
# fallen (see the script's header).  A difference fails the test with the
# seed, the round, the model's expectation and the server's answer, and
# the earlier steps on the same keys; `SEED=<n>` replays that seed.
#
# Settings (environment):
#   MODEL_SEEDS   comma-separated seeds (default 1,2,3); SEED=<n> runs only n
#   MODEL_STEPS   rounds per seed (default 10000; a release run: 200000)
#   MODEL_MEMORY_SEEDS  seeds run again with idempotency.key_memory = 1h
#                 (default 1; empty: none)
#   MODEL_STRICT  1: also generate what is known to differ (see the script)
#   MODEL_LATE_CANCELS  the share of cancelled waits whose backend is held
#                 until the round is observed (default 0.5, see the script)
#   MODEL_PYTHON  the python3 to run it with (default: Debian's
#                 /usr/bin/python3, else python3 on PATH), which must have
#                 psycopg 3; without it the test is skipped and says why
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/060_model.pl

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $script = "$FindBin::RealBin/../model/idem_model.py";

# a python3 that has psycopg 3 (Debian's first: another python3 on PATH may
# be a build without it)
my ($python, $why);
for my $py (grep { defined && $_ ne '' } $ENV{MODEL_PYTHON}, '/usr/bin/python3', 'python3')
{
	my ($out, $err) = ('', '');
	my $ok = eval {
		IPC::Run::run([ $py, '-c', 'import psycopg; print(psycopg.__version__)' ],
			'>', \$out, '2>', \$err);
	};
	if ($ok)
	{
		$python = $py;
		last;
	}
	$why //= "$py: " . ((split /\n/, $err || $@ || 'cannot run')[-1] =~ s/ at \S+ line \d+\.?$//r);
	last if defined $ENV{MODEL_PYTHON};
}
plan skip_all => "psycopg 3 is not importable ($why); install python3-psycopg"
  unless defined $python;

my @seeds =
  defined $ENV{SEED} && $ENV{SEED} ne ''
  ? ($ENV{SEED})
  : split /,/, ($ENV{MODEL_SEEDS} || '1,2,3');
my $steps = $ENV{MODEL_STEPS} || 10000;

my $node = PostgreSQL::Test::Cluster->new('model');
$node->init;
# torture_conf(): the worker every second, 1 s partitions, 2 s default
# ttls; the model's sessions, monitor and partition makers fit easily
$node->append_conf(
	'postgresql.conf', torture_conf() . q{
max_worker_processes = 20
log_min_error_statement = panic
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency; CREATE ROLE idem_model_alt');
ok( poll_until(
		'partitions of both ledgers',
		sub {
			$node->safe_psql('postgres', 'SELECT idem_maintain()');
			return $node->safe_psql('postgres',
				'SELECT count(DISTINCT table_name) FROM idempotency.partitions') eq '2';
		}),
	'partitions of both ledgers exist');

my $log_off = log_size($node);

# Two interleavings the random rounds meet only now and then, each made to
# happen (see the script's late_cancel and concurrent_errors):
#   late-cancel: a cancel that the waiting statement's backend acts on only
#     after the test has seen it wait (seed 1's step 7211 of a CI run on a
#     busy machine): S2's claim waits for S3's transaction, is cancelled
#     while its backend is stopped, and answers 57014 once S3 rolls back;
#     the script and the server run as one user here, so the script may
#     stop the backend;
#   late-cancel-cycle: the same, where S2's wait closes a cycle of waits
#     (S3 waits for S2 already, its deadlock check done): S2 must not be
#     held, since only its own deadlock check can find the cycle;
#   concurrent-errors: two transactions release each other's key at once,
#     each reads the other's row before either error aborts, and both
#     answer 55006 (repeated until they have);
#   batch-expiry-wait: a batch finds an id expired just before it waits for
#     another transaction's id, inside the clock window of the round it
#     waited in (seed 3's step 6328 in a newcomer's run on 18): the model
#     must accept the expired id as new when the answer comes.
#   import-over-memory (with idempotency.key_memory, below): a key that ran
#     and expired is remembered through a newer version of it, imported in
#     progress and released, once that has expired too (seed 1 with
#     key_memory, step 7834 of a CI run on 17: the model took the import for
#     the key's only version and expected "claimed").
sub run_scenario
{
	my ($scenario) = @_;
	my ($out, $err) = ('', '');
	my $ok = eval {
		IPC::Run::run(
			[
				$python, $script, '--dsn', $node->connstr('postgres'),
				'--seed', 1, '--scenario', $scenario
			],
			'>', \$out, '2>', \$err,
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	};
	$out .= "\n$@" if !$ok && $@;
	ok($ok, "scenario $scenario: every answer is one the contract allows")
	  or diag("$out\n$err");
	note($out) if $ok;
	return;
}
run_scenario($_)
  for ('late-cancel', 'late-cancel-cycle', 'concurrent-errors', 'batch-expiry-wait');

# idempotency.key_memory = 1h from the first call on, for the rest of the test
sub memory_on
{
	return if $node->safe_psql('postgres', 'SHOW idempotency.key_memory') ne '0';
	$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.key_memory = '1h'});
	$node->reload;
	ok( poll_until(
			'key_memory in force',
			sub { $node->safe_psql('postgres', 'SHOW idempotency.key_memory') eq '1h' }),
		'idempotency.key_memory = 1h from now on');
	return;
}

# and a cancel acted on late now and then in the random rounds; then
# MODEL_MEMORY_SEEDS (default 1) again with idempotency.key_memory = 1h
# (every key and id that expires during the run is remembered: a claim
# answers "expired", a consume false)
local $ENV{MODEL_LATE_CANCELS} = $ENV{MODEL_LATE_CANCELS} // '0.5';
my @memory_seeds = split /,/, ($ENV{MODEL_MEMORY_SEEDS} // '1');
my @runs = ((map { [ $_, '' ] } @seeds), (map { [ $_, 'memory' ] } @memory_seeds));
for my $run (@runs)
{
	my ($seed, $memory) = @$run;
	memory_on() if $memory;
	my ($out, $err) = ('', '');
	# every statement and answer, kept when the seed finds a difference
	my $trace = "$PostgreSQL::Test::Utils::log_path/060_model_seed$seed$memory.trace";
	my $ok = eval {
		IPC::Run::run(
			[
				$python, $script, '--dsn', $node->connstr('postgres'),
				'--seed', $seed, '--steps', $steps, '--trace', $trace
			],
			'>', \$out, '2>', \$err,
			IPC::Run::timeout(10 * $PostgreSQL::Test::Utils::timeout_default));
	};
	my $rc = $ok ? 0 : ($? >> 8);
	if (!$ok && $@)
	{
		$out .= "\n$@";
	}
	if ($ok)
	{
		note($out);
		unlink $trace;
	}
	ok($ok, "seed $seed: $steps rounds" . ($memory ? ' with key_memory' : '')
		  . ', every answer is one the contract allows')
	  or diag("$out\n$err\n(exit status $rc)\nreplay: SEED=$seed MODEL_STEPS=$steps"
		  . ($memory ? ' (key_memory = 1h: MODEL_SEEDS= MODEL_MEMORY_SEEDS=$seed)' : '') . "\n"
		  . "every step of the run: $trace");
}

# with key_memory (on from here if no memory seed ran)
memory_on();
run_scenario('import-over-memory');

# the server did not crash or assert meanwhile
my $log = slurp_file($node->logfile, $log_off);
my @crashes = grep { /PANIC|TRAP:|terminated by signal/ }
  split /\n/, $log;
is(scalar(@crashes), 0, 'the server log has no crash')
  or diag(join("\n", @crashes[ 0 .. ($#crashes < 20 ? $#crashes : 19) ]));

$node->stop;
done_testing();
