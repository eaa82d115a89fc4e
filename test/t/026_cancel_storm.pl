# test/t/026_cancel_storm.pl -- calls cancelled at random points leave
# nothing half-set in the backends that made them.
#
# Four long-lived psql sessions (one backend each) first commit what they
# will check later: 20 completed keys, 20 consumed message ids and a
# committed two-phase claim, all with a one-hour ttl.  Then, for
# STORM_SECONDS (default 15), each runs claims, completions, lookups,
# single and batch consumes and idem_maintain() calls under a random
# statement_timeout of 1 to 3 ms, batch after batch, while the test sends pg_cancel_backend()
# to them at random and partitions are made and dropped every second (1 s
# partitions, 2 s default ttls, the background worker every second, so
# every backend's partition cache is invalidated and read again all the
# time).  Many calls are cancelled: in the middle of a probe, a partition
# cache read, a wait for a partition maker, a key lock wait.
#
# Afterwards each session, in the same backend (its pid is checked), must
# still answer right: its 20 keys replay their responses and are found by
# idem_lookup(), its 20 message ids are duplicates, and it completes its
# committed two-phase claim with its token.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use Torture;

my $seconds = $ENV{STORM_SECONDS} || 15;
my $nsessions = 4;

my $node = PostgreSQL::Test::Cluster->new('storm');
$node->init;
$node->append_conf('postgresql.conf', torture_conf());
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
ok( poll_until(
		'partitions of both ledgers',
		sub {
			$node->safe_psql('postgres', 'SELECT idem_maintain()');
			return $node->safe_psql('postgres',
				'SELECT count(DISTINCT table_name) FROM idempotency.partitions') eq '2';
		}),
	'partitions of both ledgers exist');

# ---------------------------------------------------------------- sessions
my @s;
for my $i (1 .. $nsessions)
{
	my %h = (in => '', out => '', err => '');
	$h{run} = IPC::Run::start(
		[
			'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=0',
			'-d', $node->connstr('postgres')
		],
		'<', \$h{in}, '>', \$h{out}, '2>', \$h{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default + $seconds));
	push @s, \%h;
}

# sends SQL to session $h and waits until it printed $marker
sub send_and_wait
{
	my ($h, $sql, $marker) = @_;
	$h->{in} .= $sql . "\n\\echo $marker\n";
	$h->{run}->pump until $h->{out} =~ /^\Q$marker\E$/m;
	return;
}

# what each session commits before the storm, and the pid of its backend
my @pid;
for my $i (0 .. $#s)
{
	my $sql = "SELECT 'pid=' || pg_backend_pid();\n";
	for my $j (1 .. 20)
	{
		$sql .= qq{BEGIN;
SELECT status FROM idem_claim('k-$i-$j', jsonb_build_object('j', $j), ttl => '1 hour');
SELECT idem_complete('k-$i-$j', 201, jsonb_build_object('charge', '$i-$j'));
COMMIT;
SELECT idem_consume_message('storm', 'm-$i-$j', ttl => '1 hour');
};
	}
	$sql .= qq{SELECT 'held=' || token FROM idem_claim('h-$i', ttl => '1 hour', lease => '1 hour');\n};
	send_and_wait($s[$i], $sql, 'READY');
	($pid[$i]) = $s[$i]{out} =~ /^pid=(\d+)$/m;
	($s[$i]{token}) = $s[$i]{out} =~ /^held=(\d+)$/m;
	ok($pid[$i] && $s[$i]{token}, "session $i committed its keys, messages and two-phase claim");
	$s[$i]{out} = '';
}

# ---------------------------------------------------------------- storm
# a batch of random calls for session $i, each under a timeout of 1-3 ms
sub storm_batch
{
	my ($i, $batch) = @_;
	my $sql = '';
	for my $n (1 .. 300)
	{
		my $ms = 1 + int(rand(3));
		my $k = int(rand(300));
		my $r = rand();
		$sql .= "SET statement_timeout = '${ms}ms';\n";
		if ($r < 0.3)
		{
			# one statement: a cancel anywhere rolls the claim back with it
			$sql .= qq{DO \$\$ BEGIN IF (SELECT status FROM idem_claim('s-$k', jsonb_build_object('k', $k))) = 'claimed'
  THEN PERFORM idem_complete('s-$k', 200); END IF; END \$\$;
};
		}
		elsif ($r < 0.55) { $sql .= "SELECT idem_consume_message('storm', 'x-$k');\n"; }
		elsif ($r < 0.7)
		{
			$sql .= "SELECT count(*) FROM idem_consume_messages('storm', ARRAY['y-$k', 'y-"
			  . ($k + 1) . "', 'y-" . ($k + 2) . "']);\n";
		}
		elsif ($r < 0.85)
		{
			my $j = 1 + int(rand(20));
			$sql .= "SELECT status FROM idem_lookup('k-$i-$j');\n";
		}
		elsif ($r < 0.95)
		{
			$sql .= "SELECT status FROM idem_claim('t-$k', ttl => '20 days', lease => '1 second');\n";
		}
		else { $sql .= "SELECT count(*) FROM idem_maintain();\n"; }
	}
	return $sql . "RESET statement_timeout;\n\\echo BATCH-$batch\n";
}

# each session runs batch after batch until the time is up; cancels land at
# random meanwhile, while partitions roll over
srand(42);
my @batch = (0) x @s;
$s[$_]{in} .= storm_batch($_, 0) for 0 .. $#s;
my $cancels = 0;
my $deadline = time + $seconds;
my $busy = @s;
while ($busy)
{
	$busy = 0;
	for my $i (0 .. $#s)
	{
		my $h = $s[$i];
		$h->{run}->pump_nb;
		next if $h->{out} !~ /^BATCH-$batch[$i]$/m;
		if (time < $deadline)
		{
			$batch[$i]++;
			$h->{in} .= storm_batch($i, $batch[$i]);
			$busy++;
		}
	}
	$busy += grep { $s[$_]{out} !~ /^BATCH-$batch[$_]$/m } 0 .. $#s;
	if (time < $deadline)
	{
		my $victim = $pid[ int(rand(@pid)) ];
		$node->safe_psql('postgres', "SELECT pg_cancel_backend($victim)");
		$cancels++;
		usleep(int(rand(20_000)));
	}
	else
	{
		usleep(10_000);
	}
}
my $storm_err = join('', map { $_->{err} } @s);
my $timeouts = () = $storm_err =~ /canceling statement due to statement timeout/g;
my $cancelled = () = $storm_err =~ /canceling statement due to user request/g;
note("storm: $cancels pg_cancel_backend() calls; $timeouts statement timeouts and $cancelled cancels hit");
ok($timeouts > 100, "statement timeouts cancelled calls ($timeouts)");
ok($cancelled > 10, "pg_cancel_backend() cancelled calls ($cancelled)");
# besides cancels: the NOTICE of an idem_maintain() that found another run
# in progress, and the CONTEXT lines of cancels inside DO blocks
my @other = grep {
	!/^(?:ERROR:\s+canceling\sstatement\sdue\sto\s(?:statement\stimeout|user\srequest)
	   |ERROR:\s+current\stransaction\sis\saborted.*
	   |NOTICE:\s+idem_maintain\(\)\sis\salready\srunning\sin\sthis\sdatabase,\sskipping
	   |CONTEXT:\s.*
	   |PL\/pgSQL\sfunction\s.*
	   |\s*)$/x
} map { s/^psql:<stdin>:\d+: //r } split /\n/, $storm_err;
is(scalar(@other), 0, 'the storm gave no error but cancels')
  or diag(join("\n", @other[ 0 .. ($#other < 20 ? $#other : 19) ]));

# ---------------------------------------------------------------- the same backends answer right
for my $i (0 .. $#s)
{
	my $h = $s[$i];
	$h->{out} = '';
	$h->{err} = '';
	my $checks = qq{SELECT 'absorb a late cancel';
SELECT 'pid=' || pg_backend_pid();
SELECT 'replays=' || count(*) FROM generate_series(1, 20) j,
       LATERAL idem_claim('k-$i-' || j, jsonb_build_object('j', j)) c
 WHERE c.status = 'completed' AND c.response_body = jsonb_build_object('charge', '$i-' || j);
SELECT 'found=' || count(*) FROM generate_series(1, 20) j, LATERAL idem_lookup('k-$i-' || j) l
 WHERE l.status = 'completed';
SELECT 'duplicates=' || count(*) FROM generate_series(1, 20) j
 WHERE NOT idem_consume_message('storm', 'm-$i-' || j);
SELECT idem_complete('h-$i', 200, '{}', token => $h->{token});
SELECT 'held=' || status FROM idem_lookup('h-$i');
};
	send_and_wait($h, $checks, 'CHECKED');
	my %got = $h->{out} =~ /^(\w+)=(\S+)$/mg;
	is($got{pid}, $pid[$i], "session $i: the same backend as before the storm");
	is($got{replays}, 20, "session $i: its 20 keys replay their responses");
	is($got{found}, 20, "session $i: idem_lookup() finds its 20 keys");
	is($got{duplicates}, 20, "session $i: its 20 message ids are duplicates");
	is($got{held}, 'completed', "session $i: it completes its committed two-phase claim with its token");
	$h->{in} .= "\\q\n";
	$h->{run}->finish;
}

$node->stop;
done_testing();
