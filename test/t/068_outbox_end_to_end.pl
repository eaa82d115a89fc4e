
# test/t/068_outbox_end_to_end.pl -- the outbox end to end (issue 34's
# proof), with real processes and real failures: exactly one effect per
# committed event, none for a rolled-back one, one key's events in commit
# order, and the expired segments gone.
#
# Two clusters: service A's (orders, the outbox; outbox_retention 2 s, and
# idem_maintain() every second from here) and service B's (shipping).  The
# processes are test/outbox/services.py, on the Python client library
# (clients/python/src):
#   - 8 publishers, each a connection of its own, publish OUTBOX_E2E_EVENTS
#     events in all (10,000 by default) in transactions of 1 to 3 events of
#     one of 32 keys, each recorded in A's table "published" in the same
#     transaction with its key's rank (commit order; the key's row locked
#     until COMMIT); a tenth of the transactions roll back after
#     publishing, one in 150 stays open 1 to 3 s before committing;
#   - a relay, pg_idempotency.outbox.OutboxRelay with WebhookSink: batches
#     of 100, each event POSTed to B with Standard Webhooks headers,
#     retried with backoff until B takes it, the batch acknowledged after;
#   - B, pg_idempotency.flask.webhook_receiver: the signature checked, and
#     in one transaction webhook-id recorded (idem_consume_message) and one
#     row inserted into "effects" (no unique constraint, so a duplicate
#     would show).  It answers 503 before doing anything to 3 % of first
#     deliveries, and 502 after its transaction committed to 2 % of the
#     deliveries it applied (the answer lost: the relay delivers again).
# Meanwhile, at points drawn from the seed (counts of events committed at
# A or applied at B, never times): the relay is SIGKILLed 6 times and
# started again at once; B is SIGKILLed 3 times and started again 1 to 3 s
# later (the relay keeps retrying meanwhile); A's server is stopped once
# with -m immediate, once B has applied events too, and started again (the
# publishers connect again and find out from "published" whether the
# transaction the stop interrupted committed, and go on; the relay
# connects again).  The run ends when every publisher is done, every
# planned failure happened and the relay has acknowledged every committed
# event; every wait is for a condition, bounded only for a hung run (4 x
# PG_TEST_TIMEOUT_DEFAULT in all).
#
# Checked: the publishers published exactly the planned number of
# events, and each transaction the stop interrupted committed all or none
# of its events; A's "published" holds exactly the events the publishers
# saw commit; the relay delivered while the publishers ran, before the
# stop (a relay whose backend looked before the first event once saw none
# until it connected again); B holds exactly one effect per committed
# event, none twice, none of a rolled-back transaction (nor of one the
# stop ended); each key's effects in rank (commit) order; every planned
# failure happened, B refused redeliveries as duplicates, the relay
# retried failed attempts, dead-lettered nothing and has no lag; segments
# were dropped before the relay caught up, and maintenance then drops
# every segment of the run (no event is kept).
#
# The seed is printed first; OUTBOX_E2E_SEED=<seed> replays its decisions
# (which transactions roll back or are held, keys, failure points; the
# interleaving is the machine's).  Settings: OUTBOX_E2E_EVENTS (default
# 10000); each also as IDEM_OUTBOX_E2E_* (passed into the roots by
# test/run-all.sh).  To see the test fail: OUTBOX_E2E_BREAK=no-dedup (B inserts the
# effect without the dedup record: duplicates) or OUTBOX_E2E_BREAK=naive
# (a hand-written relay reading the events table with "ev_id > last_seen",
# and no maintenance: events lost).
#
# Needs Python 3 with psycopg 3, psycopg_pool and Flask (python3-psycopg,
# python3-psycopg-pool, python3-flask; test/lib/deps.sh installs them for
# every major): skipped without them, a failure with IDEM_NO_SKIP=1 (CI).
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/068_outbox_end_to_end.pl

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use JSON::PP;
use POSIX qw(WNOHANG);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/test/outbox/services.py";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (test/outbox/services.py)')
  unless defined $root;

# OUTBOX_E2E_X, or IDEM_OUTBOX_E2E_X: test/run-all.sh passes IDEM_* on to
# the Debian roots of 17 and 18 (test/lib/roots.sh), so a seed printed
# there can be replayed there
sub setting
{
	my ($name) = @_;
	return $ENV{"OUTBOX_E2E_$name"} // $ENV{"IDEM_OUTBOX_E2E_$name"};
}

my $python = $ENV{PYTHON} || '/usr/bin/python3';
my $events = setting('EVENTS') || 10_000;
my $break = setting('BREAK') // '';
die "OUTBOX_E2E_BREAK is no-dedup or naive, not '$break'"
  unless $break =~ /^(|no-dedup|naive)$/;
my $publishers = 8;
my $relay_kills = 6;
my $b_outages = 3;

# ---------------------------------------------------------------- needs
{
	my @missing;
	for my $mod ([ 'psycopg', 'python3-psycopg' ],
		[ 'psycopg_pool', 'python3-psycopg-pool' ],
		[ 'flask', 'python3-flask' ])
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
}

# ---------------------------------------------------------------- the plan
my $seed = setting('SEED') // (int(rand(1_000_000_000)) + 1);
diag("seed $seed (OUTBOX_E2E_SEED=$seed replays its decisions)"
	  . ($break ne '' ? "; OUTBOX_E2E_BREAK=$break" : ''));
srand($seed);
# failure points, in events committed at A (the stop) or applied at B; all
# below what the run surely reaches (a tenth of the events roll back)
my $sure = int($events * 0.8);
my @kill_at = sort { $a <=> $b } map { int($sure * (0.02 + rand(0.96))) } 1 .. $relay_kills;
my @outage_at = sort { $a <=> $b } map { int($sure * (0.05 + rand(0.9))) } 1 .. $b_outages;
my @outage_for = map { 1 + rand(2) } 1 .. $b_outages;
my $stop_at = int($sure * (0.3 + rand(0.4)));
my @pub_seed = map { int(rand(1_000_000_000)) } 1 .. $publishers;
my $b_seed = int(rand(1_000_000_000));
note("relay SIGKILLed at B effects @kill_at; B down at effects @outage_at for "
	  . join(' ', map { sprintf('%.1f s', $_) } @outage_for)
	  . "; A stopped at $stop_at committed events");

# ---------------------------------------------------------------- clusters
my $node_a = PostgreSQL::Test::Cluster->new('service_a');
$node_a->init;
$node_a->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
idempotency.outbox_retention = '2s'
max_connections = 40
});
$node_a->start;
my $super = $node_a->safe_psql('postgres', 'SELECT current_user');
$node_a->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE orders_app LOGIN;
CREATE TABLE published (event_id uuid PRIMARY KEY, key text NOT NULL, rank int NOT NULL,
                        publisher int NOT NULL);
CREATE TABLE key_rank (key text PRIMARY KEY, n int NOT NULL);
INSERT INTO key_rank SELECT format('k%s', lpad(i::text, 2, '0')), 0 FROM generate_series(0, 31) AS i;
-- the naive relay's position (OUTBOX_E2E_BREAK=naive)
CREATE TABLE naive_position (last_seen bigint NOT NULL);
INSERT INTO naive_position VALUES (0);
GRANT SELECT, INSERT ON published TO orders_app;
GRANT SELECT, UPDATE ON key_rank TO orders_app;
});

my $node_b = PostgreSQL::Test::Cluster->new('service_b');
$node_b->init;
$node_b->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
max_connections = 30
});
$node_b->start;
$node_b->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE shipping_app LOGIN;
-- one row per event applied; no unique constraint: a duplicate would show
CREATE TABLE effects (ord bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL,
                      rank int NOT NULL, publisher int NOT NULL,
                      applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
GRANT SELECT, INSERT ON effects TO shipping_app;
GRANT USAGE ON SEQUENCE effects_ord_seq TO shipping_app;
});

# ---------------------------------------------------------------- processes
my $logdir = PostgreSQL::Test::Utils::tempdir('outbox_e2e');
my $secret = 'whsec_' . 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
my %proc;    # name => pid of what runs now

# start NAME, LOG, ENV (hash ref), CMD...: a process of its own, its output
# appended to LOG
sub start_proc
{
	my ($name, $log, $env, @cmd) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		%ENV = (%ENV, %$env,
			PYTHONPATH => "$root/clients/python/src",
			PYTHONDONTWRITEBYTECODE => 1,
			HOOK_SECRET => $secret);
		delete $ENV{PGAPPNAME};
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', $log) or POSIX::_exit(126);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(126);
		exec(@cmd) or POSIX::_exit(127);
	}
	$proc{$name} = $pid;
	return $pid;
}

# exited NAME: its exit status if it ended (and is forgotten), else undef
sub exited
{
	my ($name) = @_;
	my $pid = $proc{$name} // return;
	my $r = waitpid($pid, WNOHANG);
	return if $r == 0;
	delete $proc{$name};
	return $?;
}

sub kill_proc
{
	my ($name, $sig) = @_;
	my $pid = delete $proc{$name} // return;
	kill $sig, $pid;
	waitpid($pid, 0);
	return $?;
}

END
{
	kill 'KILL', $_ for values %proc;
	waitpid($_, 0) for values %proc;
}

my %env_a = (PGHOST => $node_a->host, PGPORT => $node_a->port,
	PGDATABASE => 'postgres', PGUSER => 'orders_app');
my %env_b = (PGHOST => $node_b->host, PGPORT => $node_b->port,
	PGDATABASE => 'postgres', PGUSER => 'shipping_app');
my $services = "$root/test/outbox/services.py";
my $b_port = 0;
my $b_starts = 0;

sub slurp_or_empty { my ($f) = @_; return -f $f ? slurp_file($f) : ''; }

sub start_b
{
	my $log = "$logdir/b.log";
	my $before = () = slurp_or_empty($log) =~ /^PORT /mg;
	start_proc('b', $log, \%env_b, $python, $services, 'receive',
		'--port', $b_port, '--seed', $b_seed + $b_starts++,
		($break eq 'no-dedup' ? ('--no-dedup') : ()));
	my $end = time + $PostgreSQL::Test::Utils::timeout_default;
	while (1)
	{
		my @ports = slurp_or_empty($log) =~ /^PORT (\d+)/mg;
		if (@ports > $before)
		{
			$b_port = $ports[-1];
			return;
		}
		my $st = exited('b');
		if (defined $st)
		{
			# its port taken meanwhile (by one of the relay's connection
			# attempts, whose ephemeral port can be the one it tried to
			# reach): again, until the port is free
			BAIL_OUT("B exited (status $st) before it listened:\n" . slurp_or_empty($log))
			  unless $b_port && slurp_or_empty($log) =~ /Address already in use/;
			sleep 0.1;
			start_proc('b', $log, \%env_b, $python, $services, 'receive',
				'--port', $b_port, '--seed', $b_seed + $b_starts++,
				($break eq 'no-dedup' ? ('--no-dedup') : ()));
		}
		BAIL_OUT("B did not listen within the timeout:\n" . slurp_or_empty($log))
		  if time > $end;
		sleep 0.05;
	}
}

my $relay_starts = 0;
sub start_relay
{
	$relay_starts++;
	start_proc('relay', "$logdir/relay.log",
		{ %env_a, ($break eq 'naive' ? (PGUSER => $super) : ()) },
		$python, $services, 'relay',
		'--url', "http://127.0.0.1:$b_port/hooks/orders",
		($break eq 'naive' ? ('--naive') : ()));
}

# query NODE, SQL: its output, or undef when it fails (A is down)
sub query
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', $sql, stdout => \$out, stderr => \$err,
		on_error_die => 0);
	return $rc == 0 ? $out : undef;
}

# ---------------------------------------------------------------- the run
my $t0 = time;
start_b();
note("B listens on port $b_port");
start_relay();
if ($break ne 'naive')
{
	# the relay is known before the first event: nothing is kept for it
	# before, nothing dropped before it is known
	ok($node_a->poll_query_until('postgres',
			q{SELECT count(*) = 1 FROM idempotency.outbox_relay_info() WHERE relay = 'shipping'}),
		'the relay is known before the first event is published');
}
my @per = map { int($events / $publishers) + ($_ < $events % $publishers ? 1 : 0) } 0 .. $publishers - 1;
for my $i (0 .. $publishers - 1)
{
	start_proc("pub$i", "$logdir/pub$i.log", \%env_a, $python, $services, 'publish',
		'--index', $i, '--events', $per[$i], '--seed', $pub_seed[$i],
		'--summary', "$logdir/pub$i.json");
}

my $deadline = time + 4 * $PostgreSQL::Test::Utils::timeout_default;
my (%pub_status, $stopped_at, $stop_forced, @kills, @outages);
my ($b_down_until, $last_maintain, $dropped_before_end) = (undef, 0, 0);
my ($committed, $applied, $caught_up, $hung) = (0, 0, 0, 0);
my $unexpected = '';
while (1)
{
	if (time > $deadline)
	{
		$hung = 1;
		last;
	}
	for my $i (0 .. $publishers - 1)
	{
		my $st = exited("pub$i");
		$pub_status{$i} = $st if defined $st;
	}
	my $publishing = keys(%pub_status) < $publishers;

	# what A and B say (A may be down)
	my $a_row = query($node_a, q{
		SELECT (SELECT count(*) FROM published),
		       (SELECT coalesce(min(seg), 0) FROM idempotency.outbox_segments),
		       (SELECT coalesce(sum(lag_events + in_flight), -1)
		          FROM idempotency.outbox_relay_info() WHERE relay = 'shipping'),
		       (SELECT last_seen >= (SELECT coalesce(max(ev_id), 0) FROM idempotency.outbox)
		          FROM naive_position)});
	my ($min_seg, $lag, $naive_done);
	($committed, $min_seg, $lag, $naive_done) = split /\|/, $a_row if defined $a_row;
	my $b_out = query($node_b, 'SELECT count(*) FROM effects');
	$applied = $b_out if defined $b_out;
	# the oldest segment left while the relay still had events to deliver
	$dropped_before_end = $min_seg
	  if defined $a_row && ($publishing || $lag != 0) && $min_seg > $dropped_before_end;

	# maintenance every second (the worker sleeps a day here)
	if ($break ne 'naive' && defined $a_row && time - $last_maintain >= 1)
	{
		query($node_a, 'SELECT idem_maintain()');
		$last_maintain = time;
	}

	# the failures, at their points
	# A's stop once the relay is delivering (it must be, while publishers
	# run: a relay that delivers nothing until it connects again is a
	# failure, found by the check of $stop_forced below)
	if (!defined $stopped_at && $committed >= $stop_at && ($applied > 0 || !$publishing))
	{
		$stop_forced = ($applied == 0);
		$stopped_at = $committed;
		$node_a->stop('immediate');
		$node_a->start;
		note(sprintf('A stopped with -m immediate at %d committed events, %d applied, %.0f s in; started again',
				$stopped_at, $applied, time - $t0));
	}
	if (@kills < @kill_at && $applied >= $kill_at[ scalar @kills ] && !defined $b_down_until)
	{
		kill_proc('relay', 'KILL');
		push @kills, $applied;
		start_relay();
	}
	if (!defined $b_down_until && @outages < @outage_at && $applied >= $outage_at[ scalar @outages ])
	{
		kill_proc('b', 'KILL');
		push @outages, $applied;
		$b_down_until = time + $outage_for[ $#outages ];
	}
	if (defined $b_down_until && time >= $b_down_until)
	{
		start_b();
		undef $b_down_until;
	}
	# a service that ended by itself is a failure; it is started again
	for my $name ('relay', 'b')
	{
		next if $name eq 'b' && defined $b_down_until;
		my $st = exited($name);
		next unless defined $st;
		$unexpected .= "$name exited by itself (status $st)\n";
		$name eq 'b' ? start_b() : start_relay();
	}

	# the end: publishers done, every failure made, the relay caught up
	if (!$publishing && defined $stopped_at && @kills == @kill_at
		&& @outages == @outage_at && !defined $b_down_until && defined $a_row)
	{
		$caught_up = $break eq 'naive' ? $naive_done eq 't' : $lag == 0;
		last if $caught_up;
	}
	sleep 0.25;
}
my $secs = time - $t0;
kill_proc('relay', 'TERM');
kill_proc('b', 'TERM');
ok(!$hung, sprintf('the run got to its end (%.0f s)', $secs))
  or diag("publishers done: " . join(',', sort keys %pub_status)
	  . "; stopped at: " . ($stopped_at // 'not yet')
	  . "; relay kills: @kills; B outages: @outages; committed $committed, applied $applied");
is($unexpected, '', 'the relay and B ended only when killed');

# ---------------------------------------------------------------- publishers
my (%committed_ids, %not_committed, $held, $reconnects, @broken);
for my $i (0 .. $publishers - 1)
{
	is($pub_status{$i}, 0, "publisher $i exited 0")
	  or diag(slurp_or_empty("$logdir/pub$i.log"));
	next unless -f "$logdir/pub$i.json";
	my $s = decode_json(slurp_file("$logdir/pub$i.json"));
	$committed_ids{$_} = 1 for @{ $s->{committed} };
	$not_committed{$_} = 'rolled back' for @{ $s->{rolled_back} };
	$not_committed{$_} = 'ended by the stop' for @{ $s->{lost_in_stop} };
	$held += $s->{held};
	$reconnects += $s->{reconnects};
	push @broken, @{ $s->{broken} };
}
my $n_committed = keys %committed_ids;
my $n_rolled = grep { $_ eq 'rolled back' } values %not_committed;
my $n_lost = grep { $_ eq 'ended by the stop' } values %not_committed;
is($n_committed + $n_rolled + $n_lost, $events,
	"$events events published: $n_committed committed, $n_rolled rolled back, $n_lost ended by the stop");
cmp_ok($n_rolled, '>=', $events / 20, 'about a tenth of the events were rolled back');
cmp_ok($held, '>=', 1, "transactions were held open for seconds ($held)");
cmp_ok($reconnects, '>=', 1, "the publishers lost their connections in the stop and connected again ($reconnects)");
is(scalar(@broken), 0, 'each transaction the stop interrupted committed all or none of its events')
  or diag(encode_json(\@broken));

# A's record is what the publishers saw commit
my %in_a = map { $_ => 1 } split /\n/,
  $node_a->safe_psql('postgres', 'SELECT event_id FROM published');
is(join(',', grep { !$committed_ids{$_} } sort keys %in_a)
	  . '/' . join(',', grep { !$in_a{$_} } sort keys %committed_ids),
	'/', "A's table published holds exactly the $n_committed events the publishers saw commit");

# ---------------------------------------------------------------- B
my %effects;
$effects{$_}++ for split /\n/, $node_b->safe_psql('postgres', 'SELECT event_id FROM effects');
my @dups = grep { $effects{$_} > 1 } sort keys %effects;
my @missing = grep { !$effects{$_} } sort keys %in_a;
my @foreign = grep { !$in_a{$_} } sort keys %effects;
my @of_rolled = grep { $not_committed{$_} } sort keys %effects;
is(scalar(@dups), 0, 'no event has two effects at B')
  or diag(scalar(@dups) . ' events with more than one effect, e.g. '
	  . join(' ', map { "$_ x$effects{$_}" } @dups[ 0 .. ($#dups < 4 ? $#dups : 4) ]));
is(scalar(@missing), 0, 'every committed event has its effect at B')
  or diag(scalar(@missing) . ' committed events without an effect, e.g. '
	  . join(' ', @missing[ 0 .. ($#missing < 4 ? $#missing : 4) ]));
is(scalar(@foreign), 0, 'no effect at B is of an event that did not commit');
is(scalar(@of_rolled), 0, "no effect of the $n_rolled rolled-back events or the $n_lost the stop ended");
is($node_b->safe_psql('postgres', 'SELECT count(*) FROM effects'), $n_committed,
	"B holds $n_committed effects, one per committed event");

# one key's events in commit order: each key's ranks, in the order B
# applied them, rise
my $order = $node_b->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE rank <= prev) || ' ' || count(*)
	  FROM (SELECT rank, lag(rank) OVER (PARTITION BY key ORDER BY ord) AS prev
	          FROM effects) AS s});
my ($out_of_order, $n_effects) = split / /, $order;
is($out_of_order, 0, "each key's effects were applied in the order their transactions committed")
  or diag($node_b->safe_psql('postgres', q{
	SELECT string_agg(format('%s: rank %s after %s', key, rank, prev), E'\n')
	  FROM (SELECT * FROM (SELECT key, rank, ord,
	                              lag(rank) OVER (PARTITION BY key ORDER BY ord) AS prev
	                         FROM effects) AS s
	         WHERE rank <= prev ORDER BY ord LIMIT 10) AS f}));

# ---------------------------------------------------------------- the failures
is(scalar(@kills), $relay_kills, "the relay was SIGKILLed $relay_kills times (at $applied effects: @kills)");
is(scalar(@outages), $b_outages, "B was killed and down for seconds $b_outages times (at @outages)");
ok(defined $stopped_at, "A's server was stopped with -m immediate and started again");
ok(!$stop_forced, 'the relay delivered events while the publishers ran, before the stop');
my $b_log = slurp_or_empty("$logdir/b.log");
my $relay_log = slurp_or_empty("$logdir/relay.log");
my $dup_answers = () = $b_log =~ /^duplicate /mg;
cmp_ok($dup_answers, '>=', 1, "B refused $dup_answers redeliveries as duplicates")
  unless $break eq 'no-dedup';
my $failed = () = $relay_log =~ /^attempt-failed /mg;
cmp_ok($failed, '>=', 1, "the relay retried $failed failed attempts (503, 502, B down)");
my $dead = () = $relay_log =~ /^dead-letter /mg;
is($dead, 0, 'the relay dead-lettered nothing');

# ---------------------------------------------------------------- segments
if ($break ne 'naive')
{
	is($node_a->safe_psql('postgres', q{
		SELECT lag_events || ' ' || in_flight || ' ' || dead_letters || ' ' || lost_events
		  FROM idempotency.outbox_relay_info() WHERE relay = 'shipping'}),
		'0 0 0 0', 'the relay has no lag, nothing in flight, no dead letter, no loss');
	cmp_ok($dropped_before_end, '>', 1,
		'segments were dropped during the run, before the relay caught up'
		  . ' (the oldest left then: ' . $dropped_before_end . ')');
	# every segment of the run expires (acknowledged, past the retention):
	# maintenance drops them all, the newest of the run included once
	# maintenance has started the next
	my $last_seg = $node_a->safe_psql('postgres', 'SELECT max(seg) FROM idempotency.outbox_segments');
	my ($gone, $left) = (0, '');
	my $end = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $end)
	{
		$node_a->safe_psql('postgres', 'SELECT idem_maintain()');
		$left = $node_a->safe_psql('postgres', qq{
			SELECT count(*) FILTER (WHERE seg <= $last_seg) || ' segments, '
			       || (SELECT count(*) FROM idempotency.outbox) || ' events'
			  FROM idempotency.outbox_segments});
		if ($left eq '0 segments, 0 events')
		{
			$gone = 1;
			last;
		}
		sleep 0.2;
	}
	ok($gone, "maintenance drops every segment of the run (1 to $last_seg): no event is kept")
	  or diag("left: $left\n" . $node_a->safe_psql('postgres',
			q{SELECT string_agg(format('%s %s %s', seg, opened_at, quiet_at), E'\n') FROM idempotency.outbox_segments}));
}

if (!Test::More->builder->is_passing)
{
	diag("seed $seed (OUTBOX_E2E_SEED=$seed replays its decisions); logs in $logdir");
	for my $f ('relay.log', 'b.log')
	{
		my @l = split /\n/, slurp_or_empty("$logdir/$f");
		diag("---- $f (last 30 lines)\n" . join("\n", @l[ ($#l > 29 ? $#l - 29 : 0) .. $#l ]));
	}
}
note(sprintf('%d events, %d committed; relay started %d times, B %d times; %.0f s',
		$events, $n_committed, $relay_starts, $b_starts, $secs));

$node_a->stop;
$node_b->stop;
done_testing();
