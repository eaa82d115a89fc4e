
# test/lib/Torture.pm -- shared code of the crash, failover, torture and
# PgBouncer TAP tests (test/t/020_crash_safety.pl .. 023_pgbouncer.pl).
#
# Loaded by those tests with
#
#   use FindBin;
#   use lib "$FindBin::RealBin/../lib";
#   use Torture;
#
# It holds:
#   - the business schema the tests write to (create_business_schema): a
#     "charges" table (one row per idempotency key actually carried out) and
#     an "effects" table (one row per message actually processed), neither
#     with a unique constraint, so that work done twice is visible as two
#     rows;
#   - "acknowledging" clients for the crash and failover tests: psql
#     processes that run generated scripts of claim-and-charge or
#     consume-and-process transactions and print "ack <id>" only after their
#     COMMIT returned, so that the test knows which commits a client was told
#     about (start_ack_clients, finish_ack_clients, record_acks);
#   - the invariant checks after a crash or failover (check_ledger);
#   - the pgbench workload of the torture tests (torture_conf,
#     torture_scripts, start_pgbench, finish_pgbench), its invariant checks
#     (check_torture) and the whole run (run_torture);
#   - amcheck over every ledger index at the end of a load test
#     (amcheck_ledger);
#   - the digest filters of a preloaded server: every live partition has
#     a READY one (filters_ready);
#   - small helpers: poll_until, server_log_errors.
#
# Every wait polls for a condition; nothing sleeps for a fixed time.

package Torture;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(
  create_business_schema
  ack_claim_script ack_consume_script
  start_ack_clients finish_ack_clients record_acks
  check_ledger
  torture_scripts start_pgbench finish_pgbench pgbench_summary
  check_torture
  torture_conf run_torture
  poll_until server_log_errors log_size
  amcheck_ledger
  filters_ready
);

# ---------------------------------------------------------------- schema

=pod

=item create_business_schema($node, $db)

Creates the extension and the business tables in $db:

  charges  (key, token, expires_us, mode, backend)
      one row per key actually charged: the fencing token and the expiry
      (microseconds since the epoch) of the claim under which it was done,
      the mode ('tx' same-transaction, '2p' two-phase) and the backend pid
  effects  (msg_id, before_us, after_us, backend)
      one row per message actually processed; before_us is the clock read
      before the consume call, after_us the clock at the insert, after it
  outcomes (mode, outcome)   what two-phase clients were told at the end
  maint_log (at, created, dropped)   idem_maintain() results of the loop
  acked_keys, acked_msgs     what clients were told was committed

Neither business table has a unique constraint: a duplicate is a second row.
torture_checkpoint() and torture_finish() are the two-phase client's
phase-two steps; an expected refusal (stale token: the lease lapsed and
another client took the key over) rolls the step back and is tallied in
outcomes instead of failing the client's transaction.

=cut

sub create_business_schema
{
	my ($node, $db) = @_;

	$node->safe_psql(
		$db, q{
CREATE EXTENSION idempotency;

CREATE TABLE charges (
    key        text   NOT NULL,
    token      bigint NOT NULL,
    expires_us bigint NOT NULL,
    mode       text   NOT NULL DEFAULT 'tx',
    backend    int    NOT NULL DEFAULT pg_backend_pid());
CREATE INDEX ON charges (key);

CREATE TABLE effects (
    msg_id    text   NOT NULL,
    before_us bigint,
    after_us  bigint NOT NULL
              DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
    backend   int    NOT NULL DEFAULT pg_backend_pid());
CREATE INDEX ON effects (msg_id);

CREATE TABLE outcomes (mode text NOT NULL, outcome text NOT NULL);
CREATE TABLE maint_log (at timestamptz NOT NULL, created int, dropped int);
CREATE TABLE acked_keys (key text PRIMARY KEY);
CREATE TABLE acked_msgs (msg_id text PRIMARY KEY);

-- two-phase mode, after the claim: record progress with the fencing token
CREATE FUNCTION torture_checkpoint(k text, tok bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_checkpoint(k, 'provider-called', token => tok);
    RETURN true;
EXCEPTION WHEN object_in_use THEN
    INSERT INTO outcomes VALUES ('2p', 'checkpoint refused: ' || SQLSTATE);
    RETURN false;
END $$;

-- two-phase mode, phase two: charge and complete (or release) with the
-- fencing token; a refusal takes the charge back with it
CREATE FUNCTION torture_finish(k text, tok bigint, e_us bigint, act int, resumed int)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    outcome text;
BEGIN
    BEGIN
        IF act = 1 THEN
            PERFORM idem_release(k, token => tok);
            outcome := 'released';
        ELSE
            INSERT INTO charges (key, token, expires_us, mode) VALUES (k, tok, e_us, '2p');
            PERFORM idem_complete(k, 201, jsonb_build_object('token', tok), token => tok);
            outcome := CASE WHEN resumed = 1 THEN 'completed after takeover' ELSE 'completed' END;
        END IF;
    EXCEPTION WHEN object_in_use OR object_not_in_prerequisite_state THEN
        outcome := 'refused: ' || SQLSTATE;
    END;
    INSERT INTO outcomes VALUES ('2p', outcome);
    RETURN outcome;
END $$;
});
	return;
}

# ---------------------------------------------------------------- helpers

=pod

=item poll_until($what, $code, [$timeout])

Calls $code every 100 ms until it returns true, for at most $timeout seconds
(default: the TAP timeout).  Returns true if it did.

=cut

sub poll_until
{
	my ($what, $code, $timeout) = @_;
	my $deadline = time + ($timeout // $PostgreSQL::Test::Utils::timeout_default);

	while (time < $deadline)
	{
		return 1 if $code->();
		usleep(100_000);
	}
	diag("timed out waiting for: $what");
	return 0;
}

=pod

=item log_size($node)

Current length of the server log, for server_log_errors and wait_for_log.

=cut

sub log_size
{
	my ($node) = @_;
	return -s $node->logfile // 0;
}

=pod

=item server_log_errors($node, $offset, @expected)

The lines of the server log after $offset that report an ERROR, PANIC or
assertion failure and match none of the regexps @expected.

=cut

sub server_log_errors
{
	my ($node, $offset, @expected) = @_;
	my $log = slurp_file($node->logfile, $offset // 0);
	my @bad;

	for my $line (split /\n/, $log)
	{
		next unless $line =~ /\b(ERROR|PANIC):|TRAP:/;
		next if grep { $line =~ $_ } @expected;
		push @bad, $line;
	}
	return @bad;
}

=pod

=item amcheck_ledger($node, $db, $label)

amcheck over every ledger index of $db: each btree index of each partition
of both ledgers checked against its heap with bt_index_check(index,
heapallindexed => true), by test/lib/amcheck_ledger.sql (which locks each
partition first, so the background worker may go on dropping expired
ones meanwhile).  One test: the script ran without error and checked at
least one index.  Needs the amcheck module (PostgreSQL's contrib).  The
load tests call it at their end.

=cut

my $amcheck_sql = __FILE__ =~ s{[^/]*$}{amcheck_ledger.sql}r;

sub amcheck_ledger
{
	my ($node, $db, $label) = @_;
	my ($rc, $out, $err) = $node->psql($db, slurp_file($amcheck_sql));
	my ($checked, $gone) = $err =~ /amcheck: (\d+) ledger indexes checked, (\d+) dropped/;
	ok($rc == 0 && ($checked // 0) > 0,
		"$label: amcheck bt_index_check(heapallindexed) is clean on every ledger index ("
		  . ($checked // '?') . ' checked, ' . ($gone // '?') . ' dropped meanwhile)')
	  or diag("rc $rc, psql said:\n$err");
	return;
}

=pod

=item filters_ready($node, $db, $label)

One test: every live partition of the ledgers in $db has a READY digest
filter (idempotency.filter_info(); the library preloaded, after a
maintenance run has built what was missing).

=cut

sub filters_ready
{
	my ($node, $db, $label) = @_;
	is($node->safe_psql($db, q{
		SELECT count(*) FILTER (WHERE f.state IS DISTINCT FROM 'ready')
		  FROM idempotency.partitions p LEFT JOIN idempotency.filter_info() f USING (partition)
		 WHERE NOT p.expired}),
		'0', "$label: every live partition has a READY filter");
	return;
}

# run SQL text through psql on $db, dying on an error
sub _run_sql
{
	my ($node, $db, $sql) = @_;
	return $node->safe_psql($db, $sql);
}

# ---------------------------------------------------------------- acknowledging clients

=pod

=item ack_claim_script(%opts)

A psql script of $opts{count} transactions, each the HTTP handler of the
README: claim a key (request {"key": K}), and if claimed, insert the charge
and complete the key with response 201 {"charge": K}, then COMMIT; after the
COMMIT returned, print "ack K" if the key is now done (claimed and
completed by this transaction, or found completed).  A key found
in_progress (another client holds it uncommitted) is not acknowledged.

One transaction in five uses a hot key "hot-N" (N in 1 .. $opts{hot}),
shared by every client and round; the others use "$opts{prefix}-I".
$opts{ttl}, if given, is passed as the claim's ttl.  $opts{seed} makes the
choice reproducible.

=cut

sub ack_claim_script
{
	my (%o) = @_;
	my $ttl = defined $o{ttl} ? ", ttl => '$o{ttl}'" : '';
	my $s = "\\set ON_ERROR_STOP 1\n\\o /dev/null\n";

	srand($o{seed} // 1);
	for my $i (1 .. $o{count})
	{
		my $k = rand() < 0.2 ? 'hot-' . (1 + int(rand($o{hot}))) : "$o{prefix}-$i";
		$s .= <<"EOS";
BEGIN;
SELECT status = 'claimed' AS claimed, status IN ('claimed', 'completed') AS done,
       token, (extract(epoch FROM expires_at) * 1000000)::bigint AS e_us
  FROM idem_claim('$k', request => '{"key": "$k"}'$ttl) \\gset
\\if :claimed
INSERT INTO charges (key, token, expires_us) VALUES ('$k', :token, :e_us);
SELECT idem_complete('$k', 201, '{"charge": "$k"}');
\\endif
COMMIT;
\\if :done
\\echo ack $k
\\endif
EOS
	}
	return $s;
}

=pod

=item ack_consume_script(%opts)

A psql script of $opts{count} consumer transactions: consume a message of
consumer "c" and, if it is new, insert its effect, then COMMIT; after the
COMMIT returned, print "ack M" (a duplicate is acknowledged too: it was
processed before).  Every fifth transaction is a batch of three ids through
idem_consume_messages().  One id in five is a hot id "hotm-N" (N in 1 ..
$opts{hot}); the others are "$opts{prefix}-I".

=cut

sub ack_consume_script
{
	my (%o) = @_;
	my $ttl = defined $o{ttl} ? ", ttl => '$o{ttl}'" : '';
	my $s = "\\set ON_ERROR_STOP 1\n\\o /dev/null\n";
	my $n = 0;
	my $next = sub {
		$n++;
		return rand() < 0.2 ? 'hotm-' . (1 + int(rand($o{hot}))) : "$o{prefix}-$n";
	};

	srand($o{seed} // 1);
	for my $i (1 .. $o{count})
	{
		if ($i % 5 == 0)
		{
			my @ids = map { $next->() } 1 .. 3;
			my $arr = join(', ', map { "'$_'" } @ids);
			$s .= "BEGIN;\n"
			  . "INSERT INTO effects (msg_id) SELECT * FROM idem_consume_messages('c', ARRAY[$arr]$ttl);\n"
			  . "COMMIT;\n"
			  . join('', map { "\\echo ack $_\n" } @ids);
		}
		else
		{
			my $m = $next->();
			$s .= <<"EOS";
BEGIN;
SELECT idem_consume_message('c', '$m'$ttl) AS fresh \\gset
\\if :fresh
INSERT INTO effects (msg_id) VALUES ('$m');
\\endif
COMMIT;
\\echo ack $m
EOS
		}
	}
	return $s;
}

=pod

=item start_ack_clients($node, $db, $dir, @clients)

Starts one psql per client ({ name => ..., kind => 'claim' | 'consume',
script => ... }) in the background, with application_name set to its name,
its script in $dir/NAME.sql and its output in $dir/NAME.out / .err.  Returns
the clients with their IPC::Run handles added.

=cut

sub start_ack_clients
{
	my ($node, $db, $dir, @clients) = @_;

	for my $c (@clients)
	{
		my $base = "$dir/$c->{name}";
		append_to_file("$base.sql", $c->{script});
		$c->{out} = "$base.out";
		$c->{err} = "$base.err";
		$c->{handle} = IPC::Run::start(
			[
				'psql', '-X', '-q', '-f', "$base.sql", '-d',
				$node->connstr($db) . " application_name=$c->{name}"
			],
			'<', \undef, '>', $c->{out}, '2>', $c->{err},
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	}
	return @clients;
}

=pod

=item finish_ack_clients(@clients)

Waits for every client to exit (after a crash they exit on the lost
connection).  Returns a hash: keys => [acknowledged keys], msgs =>
[acknowledged message ids], errors => [lines of the clients' stderr that
report an SQL ERROR], exits => [exit codes].  Losing the connection is
expected and not an ERROR.

=cut

sub finish_ack_clients
{
	my (@clients) = @_;
	my %r = (keys => [], msgs => [], errors => [], exits => []);

	for my $c (@clients)
	{
		eval { $c->{handle}->finish; };
		if ($@)
		{
			$c->{handle}->kill_kill;
			push @{ $r{errors} }, "$c->{name}: $@";
		}
		push @{ $r{exits} }, $c->{handle}->result(0) // -1;
		my @acks = map { /^ack (\S+)$/ ? $1 : () } split /\n/, slurp_file($c->{out});
		push @{ $r{ $c->{kind} eq 'claim' ? 'keys' : 'msgs' } }, @acks;
		push @{ $r{errors} }, map { "$c->{name}: $_" }
		  grep { /\bERROR:/ } split /\n/, slurp_file($c->{err});
	}
	return %r;
}

=pod

=item record_acks($node, $db, \@keys, \@msgs)

Adds acknowledged keys and message ids to acked_keys / acked_msgs.

=cut

sub record_acks
{
	my ($node, $db, $keys, $msgs) = @_;
	my $sql = '';

	for my $t ([ 'acked_keys', $keys ], [ 'acked_msgs', $msgs ])
	{
		my @ids = @{ $t->[1] };
		while (my @chunk = splice(@ids, 0, 1000))
		{
			$sql .= "INSERT INTO $t->[0] VALUES "
			  . join(', ', map { "('$_')" } @chunk)
			  . " ON CONFLICT DO NOTHING;\n";
		}
	}
	_run_sql($node, $db, $sql) if $sql ne '';
	return;
}

=pod

=item check_ledger($node, $db, $label, %opts)

The invariants after a crash or a failover, for the data of the
acknowledging clients (keys and messages with expires_at beyond
$opts{live_beyond}, an interval, default '0'; shorter-lived test traffic is
left out):

  - every acknowledged key has its charge and is completed;
  - every charge has a completed key, with the same token and expiry;
  - no key is charged twice, and there are exactly as many completed keys as
    charges, and no key in any other state;
  - a claim of every acknowledged key replays its stored response;
  - every acknowledged message has its effect; every effect's message is
    consumed; no message has two effects; the ledger has exactly one entry
    per processed message;
  - if $opts{open_key} / $opts{open_msg} are given (written by a transaction
    still open at the crash): neither the key, its charge, the message nor
    its effect exists, and the message is new again.

=cut

sub check_ledger
{
	my ($node, $db, $label, %o) = @_;
	my $live = $o{live_beyond} // '0';
	my $q = sub { return _run_sql($node, $db, shift); };

	is( $q->(
			q{SELECT count(*) FROM acked_keys a
			   WHERE NOT EXISTS (SELECT 1 FROM charges c WHERE c.key = a.key)}),
		'0',
		"$label: every acknowledged key has its charge");
	is( $q->(
			q{SELECT count(*) FROM acked_keys a LEFT JOIN LATERAL idem_lookup(a.key) l ON true
			   WHERE l.status IS DISTINCT FROM 'completed'}),
		'0',
		"$label: every acknowledged key is completed");
	is( $q->(
			q{SELECT count(*) FROM charges c LEFT JOIN LATERAL idem_lookup(c.key) l ON true
			   WHERE l.status IS DISTINCT FROM 'completed' OR l.token <> c.token
			      OR (extract(epoch FROM l.expires_at) * 1000000)::bigint <> c.expires_us}),
		'0',
		"$label: every charge has its completed key, same token and expiry");
	is($q->(q{SELECT count(*) FROM (SELECT key FROM charges GROUP BY key HAVING count(*) > 1) d}),
		'0', "$label: no key charged twice");
	is( $q->(
			qq{SELECT format('%s completed, %s other, %s digests / %s charges',
			                 count(*) FILTER (WHERE state = 'c'), count(*) FILTER (WHERE state <> 'c'),
			                 count(DISTINCT digest), (SELECT count(*) FROM charges))
			     FROM idempotency.keys WHERE expires_at > now() + interval '$live'}),
		$q->(
			q{SELECT format('%s completed, 0 other, %s digests / %s charges', n, n, n)
			    FROM (SELECT count(*) AS n FROM charges) c}),
		"$label: completed keys and charges agree one to one");
	is( $q->(
			q{BEGIN;
			  SELECT count(*) FROM acked_keys a,
			         LATERAL idem_claim(a.key, request => jsonb_build_object('key', a.key)) c
			   WHERE c.status IS DISTINCT FROM 'completed' OR c.response_code IS DISTINCT FROM 201
			      OR c.response_body IS DISTINCT FROM jsonb_build_object('charge', a.key);
			  ROLLBACK;}),
		'0',
		"$label: a claim of every acknowledged key replays its response");

	is( $q->(
			q{SELECT count(*) FROM acked_msgs a
			   WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.msg_id = a.msg_id)}),
		'0',
		"$label: every acknowledged message has its effect");
	is( $q->(
			q{BEGIN;
			  SELECT count(*) FROM (SELECT DISTINCT msg_id FROM effects) e
			   WHERE idem_consume_message('c', e.msg_id);
			  ROLLBACK;}),
		'0',
		"$label: every processed message is consumed");
	is($q->(q{SELECT count(*) FROM (SELECT msg_id FROM effects GROUP BY 1 HAVING count(*) > 1) d}),
		'0', "$label: no message processed twice");
	is( $q->(
			qq{SELECT count(*) FROM idempotency.messages WHERE expires_at > now() + interval '$live'}),
		$q->(q{SELECT count(DISTINCT msg_id) FROM effects}),
		"$label: one consumed message id per processed message");

	if (defined $o{open_key})
	{
		is( $q->(
				qq{SELECT (SELECT count(*) FROM idem_lookup('$o{open_key}'))
				        + (SELECT count(*) FROM charges WHERE key = '$o{open_key}')}),
			'0',
			"$label: the claim and charge of the transaction open at the crash are gone");
		is( $q->(
				qq{BEGIN;
				   SELECT (SELECT count(*) FROM effects WHERE msg_id = '$o{open_msg}') = 0
				      AND idem_consume_message('c', '$o{open_msg}');
				   ROLLBACK;}),
			't',
			"$label: the message consumed by the open transaction is new again, without effect");
	}
	return;
}

# ---------------------------------------------------------------- torture workload

=pod

=item torture_scripts()

The pgbench scripts of the torture workload, as { file name => text }; a
name's "@N" suffix is its pgbench weight.  Variables: hot_keys, hot_msgs
(-D).  Keys are "key-N", message ids "msg-N", N drawn from the hot sets, so
every key and message id is hit over and over, before and after it
expires.

  claim_tx   same-transaction mode: BEGIN; claim (wait => true half of the
             time; one request in twenty has another body, so "mismatch"
             happens); if claimed, charge with the claim's token and expiry
             and complete; COMMIT
  claim_2p   two-phase mode, lease 250 ms: claim (autocommit); if claimed,
             checkpoint, "call the provider" (sleep 0 .. 600 ms, so the
             lease often lapses and another client may take the key over),
             then BEGIN; torture_finish (charge and complete, or release one
             time in ten, with the token); COMMIT
  consume    BEGIN; read the clock; consume; if new, insert the effect with
             the clock read before; COMMIT
  batch      the same with idem_consume_messages() and three ids

=cut

sub torture_scripts
{
	my %s;

	$s{'claim_tx.sql@4'} = <<'EOS';
\set k random(1, :hot_keys)
\set amount :k + 1000 * (random(1, 20) / 20)
\set w random(0, 1)
BEGIN;
SELECT (status = 'claimed')::int AS claimed, coalesce(token, 0) AS token,
       coalesce((extract(epoch FROM expires_at) * 1000000)::bigint, 0) AS e_us
  FROM idem_claim('key-' || :k::int, request => jsonb_build_object('amount', :amount::int),
                  wait => :w::int = 1) \gset
\if :claimed
INSERT INTO charges (key, token, expires_us, mode) VALUES ('key-' || :k::int, :token::bigint, :e_us::bigint, 'tx');
SELECT idem_complete('key-' || :k::int, 201, jsonb_build_object('token', :token::bigint));
\endif
COMMIT;
EOS

	$s{'claim_2p.sql@2'} = <<'EOS';
\set k random(1, :hot_keys)
\set nap random(0, 600)
\set act random(1, 10)
SELECT (status = 'claimed')::int AS claimed, coalesce(token, 0) AS token,
       coalesce((extract(epoch FROM expires_at) * 1000000)::bigint, 0) AS e_us,
       (recovery_point IS NOT NULL)::int AS resumed
  FROM idem_claim('key-' || :k::int, request => jsonb_build_object('amount', :k::int),
                  lease => '250 milliseconds') \gset
\if :claimed
SELECT torture_checkpoint('key-' || :k::int, :token::bigint);
\sleep :nap ms
BEGIN;
SELECT torture_finish('key-' || :k::int, :token::bigint, :e_us::bigint, :act::int, :resumed::int);
COMMIT;
\endif
EOS

	$s{'consume.sql@3'} = <<'EOS';
\set m random(1, :hot_msgs)
BEGIN;
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS before_us \gset
SELECT idem_consume_message('c', 'msg-' || :m::int)::int AS fresh \gset
\if :fresh
INSERT INTO effects (msg_id, before_us) VALUES ('msg-' || :m::int, :before_us::bigint);
\endif
COMMIT;
EOS

	$s{'batch.sql@1'} = <<'EOS';
\set m1 random(1, :hot_msgs)
\set m2 random(1, :hot_msgs)
\set m3 random(1, :hot_msgs)
BEGIN;
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS before_us \gset
INSERT INTO effects (msg_id, before_us)
SELECT id, :before_us::bigint
  FROM idem_consume_messages('c', ARRAY['msg-' || :m1::int, 'msg-' || :m2::int, 'msg-' || :m3::int]) AS id;
COMMIT;
EOS

	return \%s;
}

=pod

=item start_pgbench($dir, $scripts, @args)

Writes the scripts ({ name => text }, see torture_scripts) to $dir and
starts pgbench in the background with them and @args (connection options,
-c, -T, ...).  Returns a handle for finish_pgbench.

=cut

sub start_pgbench
{
	my ($dir, $scripts, @args) = @_;
	my @files;
	my %run = (out => '', err => '');

	for my $name (sort keys %$scripts)
	{
		(my $file = $name) =~ s/\@\d+$//;
		append_to_file("$dir/$file", $scripts->{$name}) unless -e "$dir/$file";
		push @files, '-f', "$dir/$name";
	}
	$run{cmd} = [ 'pgbench', '-n', @files, @args ];
	note('running: ' . join(' ', @{ $run{cmd} }));
	$run{handle} = IPC::Run::start($run{cmd}, '<', \undef, '>', \$run{out}, '2>', \$run{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default + 600));
	return \%run;
}

=pod

=item finish_pgbench($run)

Waits for the pgbench of start_pgbench to exit; returns its exit code,
stdout and stderr.

=cut

sub finish_pgbench
{
	my ($run) = @_;
	eval { $run->{handle}->finish; };
	if ($@)
	{
		$run->{handle}->kill_kill;
		return (-1, $run->{out}, $run->{err} . "\n$@");
	}
	return ($run->{handle}->result(0), $run->{out}, $run->{err});
}

=pod

=item pgbench_summary($label, $rc, $out, $err)

Checks that a pgbench run ended well: exit code 0, transactions processed,
zero failed transactions, no error on stderr.  Returns the number of
transactions processed.

=cut

sub pgbench_summary
{
	my ($label, $rc, $out, $err) = @_;
	my ($done) = $out =~ /number of transactions actually processed: (\d+)/;
	my ($failed) = $out =~ /number of failed transactions: (\d+)/;

	is($rc, 0, "$label: pgbench exits 0") or diag("stdout:\n$out\nstderr:\n$err");
	ok(($done // 0) > 0, "$label: pgbench processed transactions (" . ($done // 0) . ')');
	is($failed // 'none reported', 0, "$label: pgbench reports 0 failed transactions");
	my @errors = grep { /error|abort/i } split /\n/, $err;
	is(scalar(@errors), 0, "$label: pgbench reports no error")
	  or diag(join("\n", @errors[ 0 .. ($#errors < 20 ? $#errors : 19) ]));
	note("$label: pgbench output:\n$out");
	return $done // 0;
}

=pod

=item check_torture($node, $db, $label, key_ttl_us => N, message_ttl_us => N, [expiring => 0])

The invariants of the torture workload (see the header of
test/t/022_torture.pl for why they are the right ones):

  - keys: any two charges of one key were done under claims whose expiries
    are at least key_ttl apart, with increasing tokens;
  - messages: any two effects of one message id were processed at least
    message_ttl apart (measured conservatively with before_us / after_us);
  - right after the load: the completed, unexpired rows of the key ledger
    and the charges of unexpired claims are the same (token, expiry) pairs;
    every charge that still has a second to live replays its response;
    every message processed in the last (ttl - 1 s) is still consumed.

Must run right after the load has stopped, and before the keys it wrote
have all expired.  With expiring => 0 (ttls longer than the run), no key and
no message id may have been carried out twice at all, instead of "again
after expiry".

=cut

sub check_torture
{
	my ($node, $db, $label, %o) = @_;
	my $kttl = $o{key_ttl_us};
	my $mttl = $o{message_ttl_us};
	my $q = sub { return _run_sql($node, $db, shift); };

	# first the checks that need live keys, while they are live
	my $live = $q->(
		q{WITH k AS (SELECT token, (extract(epoch FROM expires_at) * 1000000)::bigint AS e
		               FROM idempotency.keys WHERE state = 'c' AND expires_at > now()),
		       c AS (SELECT token, expires_us AS e FROM charges
		              WHERE expires_us > (extract(epoch FROM now()) * 1000000)::bigint)
		  SELECT format('%s %s %s',
		                (SELECT count(*) FROM c),
		                (SELECT count(*) FROM (SELECT * FROM k EXCEPT ALL SELECT * FROM c) x),
		                (SELECT count(*) FROM (SELECT * FROM c EXCEPT ALL SELECT * FROM k) y))});
	my ($nlive, $ledger_only, $charges_only) = split / /, $live;
	is("$ledger_only $charges_only", '0 0',
		"$label: completed live keys and charges of live claims are the same (token, expiry) pairs ($nlive live)"
	);
	is( $q->(
			q{BEGIN;
			  SELECT count(*) FROM charges c,
			         LATERAL idem_claim(c.key, request => jsonb_build_object('amount', substr(c.key, 5)::int)) r
			   WHERE c.expires_us > (extract(epoch FROM clock_timestamp() + interval '1 second') * 1000000)::bigint
			     AND (r.status NOT IN ('completed', 'mismatch')
			          OR r.status = 'completed' AND r.response_body IS DISTINCT FROM jsonb_build_object('token', c.token));
			  ROLLBACK;}),
		'0',
		"$label: a claim of every charged key with a second to live replays its response");
	is( $q->(
			qq{BEGIN;
			   SELECT count(*) FROM (SELECT DISTINCT msg_id FROM effects
			                          WHERE before_us > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
			                                            - $mttl + 1000000) e
			    WHERE idem_consume_message('c', e.msg_id);
			   ROLLBACK;}),
		'0',
		"$label: every message processed less than (ttl - 1 s) ago is still consumed");

	# then the whole history
	my $dup_keys = $q->(
		qq{SELECT count(*) FROM charges x JOIN charges y
		       ON x.key = y.key AND (x.expires_us, x.token, x.ctid) < (y.expires_us, y.token, y.ctid)
		    WHERE y.expires_us - x.expires_us < $kttl OR y.token <= x.token});
	is($dup_keys, '0', "$label: no key charged twice within its ttl");
	if ($dup_keys ne '0')
	{
		diag(
			$q->(
				qq{SELECT x.key, x.token, x.expires_us, x.mode, y.token, y.expires_us, y.mode
				     FROM charges x JOIN charges y
				       ON x.key = y.key AND (x.expires_us, x.token, x.ctid) < (y.expires_us, y.token, y.ctid)
				    WHERE y.expires_us - x.expires_us < $kttl OR y.token <= x.token LIMIT 10}));
	}
	my $dup_msgs = $q->(
		qq{SELECT count(*) FROM effects x JOIN effects y ON x.msg_id = y.msg_id AND x.ctid < y.ctid
		    WHERE NOT (y.after_us >= x.before_us + $mttl OR x.after_us >= y.before_us + $mttl)});
	is($dup_msgs, '0', "$label: no message processed twice within its ttl");
	if ($dup_msgs ne '0')
	{
		diag(
			$q->(
				qq{SELECT x.msg_id, x.before_us, x.after_us, y.before_us, y.after_us
				     FROM effects x JOIN effects y ON x.msg_id = y.msg_id AND x.ctid < y.ctid
				    WHERE NOT (y.after_us >= x.before_us + $mttl OR x.after_us >= y.before_us + $mttl)
				    LIMIT 10}));
	}

	# the dedup was exercised: keys and ids were charged / processed more
	# than once over the run, i.e. across expiry
	my ($charges, $keys, $effects, $msgs) = split /\|/,
	  $q->(
		q{SELECT (SELECT count(*) FROM charges), (SELECT count(DISTINCT key) FROM charges),
		         (SELECT count(*) FROM effects), (SELECT count(DISTINCT msg_id) FROM effects)});
	if ($o{expiring} // 1)
	{
		ok($charges > $keys,
			"$label: keys were charged again after they expired ($charges charges of $keys keys)");
		ok($effects > $msgs,
			"$label: message ids were processed again after they expired ($effects effects of $msgs ids)");
	}
	else
	{
		is($charges, $keys, "$label: no key was charged twice ($charges charges)");
		is($effects, $msgs, "$label: no message id was processed twice ($effects effects)");
	}
	note("$label: outcomes:\n"
		  . $q->(q{SELECT mode, outcome, count(*) FROM outcomes GROUP BY 1, 2 ORDER BY 1, 2}));
	return;
}

=pod

=item torture_conf()

postgresql.conf lines of the torture tests: partitions roll over every
second (key and message ttl 2 s, so a new partition per ledger each second
and one dropped each second), the background worker runs maintenance every
second, no statement logging.

=cut

sub torture_conf
{
	return q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = '1s'
idempotency.key_ttl = '2s'
idempotency.message_ttl = '2s'
log_statement = none
log_lock_waits = on
};
}

=pod

=item run_torture($node, %opts)

Runs the torture workload against database $opts{db} on $node and checks
it.  $opts{connect} are the pgbench connection options of the load (default:
the node itself), $opts{seconds} its duration, $opts{clients} its client
count (default 8), $opts{mode} the pgbench protocol (default extended),
$opts{maintain_loop} whether a ninth client also calls idem_maintain()
every 200 ms (directly on the node) besides the background worker,
$opts{memory_us} the server's idempotency.key_memory in microseconds (a key
or id must not run again before its ttl and the memory have both passed),
$opts{label} the prefix of test names.  Checks: both pgbench runs end well
(pgbench_summary), the invariants hold (check_torture), partitions were
dropped during the run (those present at the start are all gone, the
worker dropped some), maintenance keeps up (every partition that ended
before the load did is dropped, waited for: how many a run drops depends
on the machine), the storage stays small once it has, the workload did
exercise replays, conflicts, mismatches and duplicate messages, every
ledger index passes amcheck (amcheck_ledger), and the server log has no
ERROR.  Returns the statistics row as a hash.

=cut

sub run_torture
{
	my ($node, %o) = @_;
	my $db = $o{db};
	my $label = $o{label};
	my $secs = $o{seconds};
	my $clients = $o{clients} // 8;
	my $dir = PostgreSQL::Test::Utils::tempdir;
	my $q = sub { return _run_sql($node, $db, shift); };
	my @direct = ('-h', $node->host, '-p', $node->port);

	# the ledgers and their first partitions exist before the load starts
	# (made by this call, or by the worker, whose run may make this one skip)
	ok( poll_until(
			'partitions of both ledgers',
			sub {
				$q->('SELECT idem_maintain()');
				return $q->('SELECT count(DISTINCT table_name) FROM idempotency.partitions') eq '2';
			}),
		"$label: partitions of both ledgers exist before the load");
	my $before = $q->(q{SELECT string_agg(partition::text, ',' ORDER BY partition::text)
	                      FROM idempotency.partitions});
	my @initial = split /,/, $before;
	my $stats0 = $q->(
		q{SELECT partitions_dropped FROM idempotency.stats WHERE datname = current_database()});
	my $log_off = log_size($node);

	my $maint;
	if ($o{maintain_loop})
	{
		$maint = start_pgbench(
			$dir,
			{
				'maint.sql' => "INSERT INTO maint_log SELECT clock_timestamp(), * FROM idem_maintain();\n"
				  . "\\sleep 200 ms\n"
			},
			@direct, '-c', '1', '-T', $secs, $db);
	}
	my $load = start_pgbench(
		$dir, torture_scripts(),
		@{ $o{connect} // \@direct },
		'-c', $clients, '-j', '2', '-T', $secs, '-M', $o{mode} // 'extended',
		'-D', 'hot_keys=200', '-D', 'hot_msgs=200', $db);

	# while it runs, the storage keeps rolling over: every partition present
	# at the start is dropped (they all end within ~4 s)
	ok( poll_until(
			'partitions present at the start dropped',
			sub {
				$q->(
					"SELECT count(*) FROM idempotency.partitions WHERE partition::text IN ("
					  . join(', ', map { "'$_'" } @initial) . ')') eq '0';
			}),
		"$label: every partition present at the start was dropped during the load");
	my $mid = $q->('SELECT count(*) FROM idempotency.partitions');

	my ($rc, $out, $err) = finish_pgbench($load);
	my $load_end = $q->('SELECT now()');
	my $txns = pgbench_summary("$label load", $rc, $out, $err);
	if ($maint)
	{
		($rc, $out, $err) = finish_pgbench($maint);
		pgbench_summary("$label maintenance loop", $rc, $out, $err);
	}

	my %st;
	@st{qw(claims replays conflicts mismatches consumed duplicates created dropped runs error)} =
	  split(/\|/,
		$q->(
			q{SELECT claims, replays, conflicts, mismatches, consumed, duplicates,
			         partitions_created, partitions_dropped, maintenance_runs,
			         coalesce(last_maintenance_error, '')
			    FROM idempotency.stats WHERE datname = current_database()}),
		-1);
	# with idempotency.key_memory, a key or id is not new again before
	# the memory has passed too
	check_torture(
		$node, $db, $label,
		key_ttl_us     => 2_000_000 + ($o{memory_us} // 0),
		message_ttl_us => 2_000_000 + ($o{memory_us} // 0));

	my ($loop_calls, $loop_dropped) = split /\|/,
	  $q->(q{SELECT count(*), coalesce(sum(dropped), 0) FROM maint_log});
	my $end = $q->('SELECT count(*) FROM idempotency.partitions');
	# maintenance keeps up: whatever had ended when the load did is dropped
	# (on a busy machine it may lag behind the load for a while)
	ok( poll_until(
			'the partitions that ended during the load dropped',
			sub {
				$q->(
					"SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= '$load_end'"
				) eq '0';
			}),
		"$label: every partition that ended during the load is dropped");
	my $now = $q->('SELECT count(*) FROM idempotency.partitions');
	note(sprintf(
			"%s: %d seconds, %d transactions; claims %s, replays %s, conflicts %s, mismatches %s, "
			  . "consumed %s, duplicates %s; partitions made %s, dropped %s in %s maintenance runs; "
			  . "of them by the idem_maintain() loop: %s dropped in %s calls; "
			  . "partitions at start / mid-run / end of the load / after: %d / %s / %s / %s",
			$label, $secs, $txns, @st{qw(claims replays conflicts mismatches consumed duplicates created dropped runs)},
			$loop_dropped, $loop_calls, scalar(@initial), $mid, $end, $now));

	# the statistics count the worker's and idem_maintain()'s work
	my $dropped = $st{dropped} - $stats0;
	ok($dropped > 0, "$label: partitions were dropped during the run ($dropped)");
	ok($dropped - $loop_dropped > 0,
		"$label: the background worker dropped partitions (" . ($dropped - $loop_dropped) . ')')
	  unless $o{maintain_loop};
	ok($now <= 40,
		"$label: the storage stays small ($now partitions once maintenance has caught up, $end at the end of the load)"
	);
	is($st{error}, '', "$label: maintenance reported no error");
	ok($st{replays} > 0 && $st{conflicts} > 0 && $st{mismatches} > 0 && $st{duplicates} > 0,
		"$label: the workload saw replays, conflicts, mismatches and duplicate messages");
	is( $q->(
			q{SELECT count(*) FILTER (WHERE outcome = 'completed after takeover') > 0
			     AND count(*) FILTER (WHERE outcome LIKE 'refused%') > 0
			    FROM outcomes}),
		't',
		"$label: two-phase leases lapsed: keys were taken over and stale holders refused");

	amcheck_ledger($node, $db, $label);
	my @errors = server_log_errors($node, $log_off, qr/canceling autovacuum task/);
	is(scalar(@errors), 0, "$label: the server log has no ERROR")
	  or diag(join("\n", @errors[ 0 .. ($#errors < 20 ? $#errors : 19) ]));
	return %st;
}

1;
