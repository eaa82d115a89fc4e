# test/t/026_cancel_storm.pl -- calls cancelled at random points leave
# nothing half-set in the backends that made them.
#
# Four long-lived psql sessions (one backend each) first commit what they
# will check later: 20 completed keys, 20 consumed message ids and a
# committed two-phase claim, all with a one-hour ttl.  Then each runs
# claims, completions, lookups, single and batch consumes and
# idem_maintain() calls under a random statement_timeout of 1 to 3 ms,
# batch after batch, while the test sends pg_cancel_backend() to them at
# random and partitions are made and dropped every second (1 s partitions,
# 2 s default ttls, the background worker every second, so every backend's
# partition cache is invalidated and read again all the time).  Many calls
# are cancelled: in the middle of a probe, a partition cache read, a wait
# for a partition maker, a key lock wait, the making of a partition.
#
# How long the storm lasts depends on what it has seen, not on the clock
# alone: at least STORM_SECONDS (default 15), and on until at least
# STORM_CANCELS (default 10) pg_cancel_backend() cancels and STORM_TIMEOUTS
# (default 100) statement timeouts have hit calls, or STORM_MAX_SECONDS
# (default the TAP timeout, 180 s) have passed.  A busy machine needs longer
# for the same number of hits; how many it gets is not what the test checks.
#
# What must hold, and is checked:
#   - the sessions printed no error but the two kinds of cancel (each with
#     only the CONTEXT lines a cancel can have: the extension's own storage
#     DDL, the test's DO block), and nothing else but the NOTICE of an
#     idem_maintain() that found another run in progress; the server log has
#     no other ERROR;
#   - at least one call was cancelled by pg_cancel_backend() and at least one
#     by statement_timeout (or the storm tested nothing);
#   - afterwards each session, in the same backend (its pid is checked),
#     still answers right: nothing was lost (its 20 keys replay their
#     responses and are found by idem_lookup(), it completes its committed
#     two-phase claim with its token) and nothing is done twice (its 20
#     message ids are duplicates, its keys are not claimed again).

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

my $nsessions = 4;
my $min_seconds = $ENV{STORM_SECONDS} || 15;
my $max_seconds = $ENV{STORM_MAX_SECONDS} || $PostgreSQL::Test::Utils::timeout_default;
my $want_cancels = $ENV{STORM_CANCELS} || 10;
my $want_timeouts = $ENV{STORM_TIMEOUTS} || 100;
$max_seconds = $min_seconds if $max_seconds < $min_seconds;

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
		IPC::Run::timeout(2 * $PostgreSQL::Test::Utils::timeout_default + $max_seconds));
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

# The messages a session printed, each as [its first line, its other
# lines]: a message starts with its severity ("ERROR:  ", after a
# "psql:FILE:LINE: " prefix when psql reads a file); the lines of its other
# fields (CONTEXT) and anything else psql prints follow it.
sub messages
{
	my ($err) = @_;
	my @m;
	for my $line (split /\n/, $err)
	{
		if ($line =~ /^(?:psql:[^:]*:\d+: )?((?:ERROR|WARNING|NOTICE|INFO|LOG|FATAL|PANIC):  .*)$/)
		{
			push @m, [$1];
		}
		elsif (@m) { push @{ $m[-1] }, $line; }
		else { push @m, [$line]; }    # not a message: reported
	}
	return @m;
}

# What a cancel may print: its error, and where it landed, innermost first:
# in the extension's own storage DDL (a partition made inline, or dropped
# by idem_maintain()), in idem_maintain()'s removal of unused stream
# positions and producer sequences (0.4.0: the rows no call holds, FOR
# UPDATE SKIP LOCKED), in the DO block's statements and expressions, in the
# DO block itself (its statement block, entry or exit), in the compilation
# of the DO block.  (PostgreSQL 18 names a PL/pgSQL expression "PL/pgSQL
# expression", older majors "SQL expression".)  Anything else is reported.
my $cancel_re = qr/^ERROR:  canceling statement due to (statement timeout|user request)$/;
my $context_re = qr/^(?:SQL\ statement\ "(?:CREATE\ TABLE|DROP\ TABLE|REVOKE\ ALL\ ON\ TABLE)\ idempotency\.[^"]*"
	               |SQL\ statement\ "DELETE\ FROM\ idempotency\.(?:positions|sequences)\ WHERE\ ctid\ OPERATOR\(pg_catalog\.=\)\ ANY\ \(ARRAY\(SELECT\ ctid\ FROM\ idempotency\.(?:positions|sequences)\ WHERE\ updated_at\ OPERATOR\(pg_catalog\.<\)\ '[^']*'::pg_catalog\.timestamptz\ OR\ NOT\ EXISTS\ \(SELECT\ FROM\ pg_catalog\.pg_roles\ AS\ r\ WHERE\ r\.oid\ OPERATOR\(pg_catalog\.=\)\ role::pg_catalog\.oid\)\ FOR\ UPDATE\ SKIP\ LOCKED\)\)"
	               |SQL\ statement\ "SELECT\ idem_complete\('s-\d+',\ 200\)"
	               |SQL\ statement\ "(?:SELECT|DELETE|UPDATE|INSERT)\ [^"]*\bidempotency\.outbox\w*\b[^"]*"
	               |(?:PL\/pgSQL|SQL)\ expression\ "\(SELECT\ status\ FROM\ idem_claim\('s-\d+',\ jsonb_build_object\('k',\ \d+\)\)\)\ =\ 'claimed'"
	               |PL\/pgSQL\ function\ inline_code_block(?:\ line\ \d+\ at\ (?:statement\ block|IF|PERFORM)|\ during\ [a-z ]+)?
	               |compilation\ of\ PL\/pgSQL\ function\ "inline_code_block"\ near\ line\ \d+)$/x;
my $notice_re = qr/^NOTICE:  idem_maintain\(\) is already running in this database, skipping$/;

# Counts the cancels of each kind among @messages (see messages()); returns
# (user request, statement timeout, the messages that are neither a cancel
# nor the notice, or have a line a cancel cannot have).
sub classify
{
	my (@messages) = @_;
	my %hits = ('user request' => 0, 'statement timeout' => 0);
	my @bad;
	for my $m (@messages)
	{
		my ($first, @context) = @$m;
		my $ok = 0;
		if ($first =~ $cancel_re)
		{
			$hits{$1}++;
			# a CONTEXT field, "CONTEXT:  " before its first line only
			$ok = !@context
			  || ($context[0] =~ s/^CONTEXT:  //
				&& !grep { $_ !~ $context_re } @context);
		}
		elsif ($first =~ $notice_re)
		{
			$ok = !@context;
		}
		push @bad, join("\n", @$m) unless $ok;
	}
	return ($hits{'user request'}, $hits{'statement timeout'}, @bad);
}

# The classification itself: what a cancel can print is accepted...
{
	my ($u, $t, @bad) = classify(
		messages(
			join("\n",
				q{ERROR:  canceling statement due to user request},
				q{CONTEXT:  SQL statement "CREATE TABLE idempotency.keys_n24_3_20261129_000000 (LIKE idempotency.keys INCLUDING ALL); ALTER TABLE idempotency.keys ATTACH PARTITION idempotency.keys_n24_3_20261129_000000 FOR VALUES FROM (3, '2026-11-29 00:00:00.000000+00') TO (3, '2026-11-29 00:00:01.000000+00')"},
				q{SQL expression "(SELECT status FROM idem_claim('s-12', jsonb_build_object('k', 12))) = 'claimed'"},
				q{PL/pgSQL function inline_code_block line 1 at IF},
				q{ERROR:  canceling statement due to statement timeout},
				q{psql:<stdin>:3: ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  SQL statement "SELECT idem_complete('s-7', 200)"},
				q{PL/pgSQL function inline_code_block line 2 at PERFORM},
				q{NOTICE:  idem_maintain() is already running in this database, skipping},
				q{ERROR:  canceling statement due to user request},
				q{CONTEXT:  SQL statement "DROP TABLE idempotency.messages_n24_1_20261129_000000 CASCADE"},
				q{ERROR:  canceling statement due to user request},
				q{CONTEXT:  SQL statement "DELETE FROM idempotency.positions WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM idempotency.positions WHERE updated_at OPERATOR(pg_catalog.<) '2026-10-26 06:05:10.702288+00'::pg_catalog.timestamptz OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid) FOR UPDATE SKIP LOCKED))"},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  SQL statement "DELETE FROM idempotency.sequences WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM idempotency.sequences WHERE updated_at OPERATOR(pg_catalog.<) '2026-10-26 06:05:17.740602+00'::pg_catalog.timestamptz OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid) FOR UPDATE SKIP LOCKED))"},
				q{ERROR:  canceling statement due to user request},
				q{CONTEXT:  PL/pgSQL function inline_code_block line 1 at IF},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  compilation of PL/pgSQL function "inline_code_block" near line 1},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  PL/pgSQL function inline_code_block line 1 at statement block},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  PL/pgSQL function inline_code_block during function exit},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  PL/pgSQL expression "(SELECT status FROM idem_claim('s-47', jsonb_build_object('k', 47))) = 'claimed'"},
				q{PL/pgSQL function inline_code_block line 1 at IF},
				q{ERROR:  canceling statement due to statement timeout},
				q{CONTEXT:  SQL statement "DELETE FROM idempotency.outbox_dead_letters WHERE failed_at OPERATOR(pg_catalog.<) $1"}
			)));
	is("$u $t " . scalar(@bad), '4 8 0', 'self-test: every message a cancel can print is accepted')
	  or diag(join("\n----\n", @bad));
	# ... and anything else is not
	for my $case (
		q{stray line},
		q{ERROR:  duplicate key value violates unique constraint "x"},
		qq{ERROR:  canceling statement due to user request\nCONTEXT:  SQL statement "INSERT INTO idempotency.keys VALUES (1)"},
		qq{ERROR:  canceling statement due to user request\nserver closed the connection unexpectedly},
		qq{ERROR:  canceling statement due to user request\nCONTEXT:  PL/pgSQL function inline_code_block line 1 at IF\nserver closed the connection unexpectedly},
		qq{ERROR:  canceling statement due to user request\nPL/pgSQL function inline_code_block line 1 at IF},
		qq{ERROR:  canceling statement due to user request\nCONTEXT:  PL/pgSQL function other line 1 at IF},
		qq{ERROR:  canceling statement due to user request\nCONTEXT:  PL/pgSQL function inline_code_block line 1 at RAISE},
		qq{NOTICE:  idem_maintain() is already running in this database, skipping\nCONTEXT:  x},
		q{ERROR:  current transaction is aborted, commands ignored until end of transaction block},
		q{WARNING:  canceling statement due to user request})
	{
		(undef, undef, @bad) = classify(messages($case));
		is(scalar(@bad), 1, "self-test: reported: " . ($case =~ s/\n/ | /gr));
	}
}

# Each session runs batch after batch, while cancels land at random and
# partitions roll over, until the storm has lasted long enough and hit
# enough calls (see the header), or its bound has passed.
my $log_off = log_size($node);
srand(42);
my @batch = (0) x @s;
$s[$_]{in} .= storm_batch($_, 0) for 0 .. $#s;
my $cancels = 0;
my ($cancelled, $timeouts) = (0, 0);
my $start = time;
my $next_count = $start + $min_seconds;
my $storming = 1;
my $busy = @s;
while ($busy)
{
	$busy = 0;
	if ($storming && time >= $next_count)
	{
		# once a second past the minimum: has it hit enough calls?
		($cancelled, $timeouts) = classify(messages(join('', map { $_->{err} } @s)));
		$storming = ($cancelled < $want_cancels || $timeouts < $want_timeouts)
		  && time < $start + $max_seconds;
		$next_count = time + 1;
	}
	for my $i (0 .. $#s)
	{
		my $h = $s[$i];
		$h->{run}->pump_nb;
		next if $h->{out} !~ /^BATCH-$batch[$i]$/m;
		if ($storming)
		{
			$batch[$i]++;
			$h->{in} .= storm_batch($i, $batch[$i]);
		}
	}
	$busy += grep { $s[$_]{out} !~ /^BATCH-$batch[$_]$/m } 0 .. $#s;
	if ($storming)
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
# The loop above stops on each session's stdout marker, but psql writes a
# message to stderr in several writes, and what came last may not have been
# read yet (seen on 18: a CONTEXT line cut in the middle of a partition's
# name).  A marker on stderr, written after everything else, says when all
# of it is in: with its newline, which psql's \warn writes separately (seen
# on 17: the marker was read without it, was not removed, and the next
# session's first message ran into it).
for my $h (@s)
{
	$h->{in} .= "\\warn STORM-END\n";
	pump_until($h->{run}, IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default),
		\$h->{err}, qr/^STORM-END\n/m)
	  or die 'a session did not write its stderr marker';
	$h->{err} =~ s/^STORM-END\n//m or die 'the stderr marker was not removed';
}
my $storm_err = join('', map { $_->{err} } @s);
my @other;
($cancelled, $timeouts, @other) = classify(messages($storm_err));
# where the cancels landed, by their innermost context
my %where;
for my $m (messages($storm_err))
{
	next unless $m->[0] =~ $cancel_re;
	my $at = ($m->[1] // 'no context') =~ s/^CONTEXT:  //r;
	$at =~ s/^(SQL statement "\w+ \w+|(?:PL\/pgSQL |)SQL expression|PL\/pgSQL expression|PL\/pgSQL function inline_code_block|compilation).*/$1/;
	$where{$at}++;
}
note(sprintf(
		'storm: %.0f s, %d pg_cancel_backend() calls; %d statement timeouts and %d cancels hit; in: %s',
		time - $start, $cancels, $timeouts, $cancelled,
		join(', ', map { "$_ ($where{$_})" } sort keys %where)));
ok($timeouts > 0, "statement timeouts cancelled calls ($timeouts)");
ok($cancelled > 0, "pg_cancel_backend() cancelled calls ($cancelled)");
is(scalar(@other), 0, 'the storm gave no error but cancels, each with the context a cancel can have')
  or diag(join("\n----\n", @other[ 0 .. ($#other < 20 ? $#other : 19) ]));
my @log_errors = server_log_errors($node, $log_off,
	qr/ERROR:  canceling statement due to (?:statement timeout|user request)$/,
	qr/ERROR:  canceling autovacuum task$/);
is(scalar(@log_errors), 0, 'the server log has no ERROR but cancels')
  or diag(join("\n", @log_errors[ 0 .. ($#log_errors < 20 ? $#log_errors : 19) ]));

# ---------------------------------------------------------------- the same backends answer right
for my $i (0 .. $#s)
{
	my $h = $s[$i];
	$h->{out} = '';
	$h->{err} = '';
	# a cancel that hit the last batch's RESET left its 1-3 ms timeout
	my $checks = qq{SELECT 'absorb a late cancel';
RESET statement_timeout;
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

amcheck_ledger($node, 'postgres', 'after the storm');

$node->stop;
done_testing();
