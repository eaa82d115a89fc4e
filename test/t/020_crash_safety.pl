
# test/t/020_crash_safety.pl -- keys and messages survive crashes exactly.
#
# Under concurrent load (three psql clients claiming keys and charging them,
# two consuming messages and processing them; see Torture.pm), the server
# crashes ten times, alternately:
#   - "pg_ctl stop -m immediate" and a restart, and
#   - SIGKILL of a backend running the load, after which the postmaster
#     kills every other backend and reinitializes (restart_after_crash);
# every other round a CHECKPOINT runs just before the crash, so that pages
# holding the rows of an uncommitted transaction are on disk too.  At each
# crash one transaction is deliberately left open, having claimed, charged
# and completed a key and consumed and processed a message.
#
# After each recovery (Torture::check_ledger): every commit a client was
# told about is there (key completed with its charge, message consumed with
# its effect); the open transaction left nothing (neither key nor charge,
# and its message is new again); charges and completed keys agree one to
# one, no key is charged twice and no message processed twice; a claim of
# every acknowledged key replays the stored response.  The clients never
# saw an SQL error, and the server log has none.
#
# fsync is on, unlike other TAP tests, and the background worker is loaded
# (it is killed and restarted with everything else).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $rounds = 10;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
fsync = on
restart_after_crash = on
log_statement = none
shared_preload_libraries = 'idempotency'
});
$node->start;
my $log_start = log_size($node);

$node->safe_psql('postgres', 'CREATE DATABASE app');
create_business_schema($node, 'app');

my $tmp = PostgreSQL::Test::Utils::tempdir;

for my $round (1 .. $rounds)
{
	my $kill       = $round % 2 == 0;
	my $checkpoint = int(($round - 1) / 2) % 2 == 1;
	my $label =
	  "round $round (" . ($kill ? 'SIGKILL of a backend' : 'immediate stop')
	  . ($checkpoint ? ', after a checkpoint' : '') . ')';
	my $dir = "$tmp/round$round";
	mkdir $dir;

	my ($charges0, $effects0) = split /\|/,
	  $node->safe_psql('app', 'SELECT (SELECT count(*) FROM charges), (SELECT count(*) FROM effects)');

	my @clients = start_ack_clients(
		$node, 'app', $dir,
		(
			map {
				{
					name   => "claim$_",
					kind   => 'claim',
					script => ack_claim_script(
						prefix => "r$round-c$_",
						count  => 4000,
						hot    => 30,
						seed   => $round * 10 + $_)
				}
			} 1 .. 3
		),
		(
			map {
				{
					name   => "consume$_",
					kind   => 'consume',
					script => ack_consume_script(
						prefix => "r$round-m$_",
						count  => 4000,
						hot    => 30,
						seed   => $round * 10 + 5 + $_)
				}
			} 1 .. 2
		));

	# let the load run for a while
	ok( $node->poll_query_until(
			'app',
			"SELECT (SELECT count(*) FROM charges) >= $charges0 + 150
			    AND (SELECT count(*) FROM effects) >= $effects0 + 100"),
		"$label: load is running");

	# a transaction that claims, charges and completes a key, consumes and
	# processes a message, and is still open at the crash
	my $open_key = "open-$round";
	my $open_msg = "open-msg-$round";
	my $open     = $node->background_psql('app', on_error_stop => 0);
	my $got = $open->query_safe(
		qq{BEGIN;
		   SELECT status FROM idem_claim('$open_key', request => '{"key": "$open_key"}');
		   INSERT INTO charges (key, token, expires_us) VALUES ('$open_key', 1, 1);
		   SELECT idem_complete('$open_key', 201, '{"charge": "$open_key"}');
		   SELECT idem_consume_message('c', '$open_msg');
		   INSERT INTO effects (msg_id) VALUES ('$open_msg');});
	like($got, qr/^claimed\n\nt$/, "$label: the transaction left open claimed its key and message");
	$node->safe_psql('app', 'CHECKPOINT') if $checkpoint;

	# crash
	my $off = log_size($node);
	if ($kill)
	{
		my $pid = $node->safe_psql('app',
			q{SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'claim%' ORDER BY pid LIMIT 1});
		ok($pid =~ /^\d+$/, "$label: found a load backend to kill");
		kill 'KILL', $pid;
		# PostgreSQL 18 names the process by its type ("client backend")
		$node->wait_for_log(
			qr/(?:server process|client backend) \(PID $pid\) was terminated by signal 9/, $off);
		$node->wait_for_log(qr/all server processes terminated; reinitializing/, $off);
		$node->wait_for_log(qr/database system is ready to accept connections/, $off);
	}
	else
	{
		$node->stop('immediate');
		$node->start;
	}
	eval { $open->quit; };

	my %r = finish_ack_clients(@clients);
	is(scalar(@{ $r{errors} }), 0, "$label: no client got an SQL error")
	  or diag(join("\n", @{ $r{errors} }));
	ok(@{ $r{keys} } > 0 && @{ $r{msgs} } > 0,
		"$label: clients acknowledged keys and messages before the crash");
	note(sprintf('%s: %d keys and %d messages acknowledged',
			$label, scalar(@{ $r{keys} }), scalar(@{ $r{msgs} })));
	like(
		$node->safe_psql('app',
			"SELECT status FROM idem_lookup('hot-1') UNION ALL SELECT 'none' LIMIT 1"),
		qr/^(completed|none)$/,
		"$label: the server answers after recovery");

	record_acks($node, 'app', $r{keys}, $r{msgs});
	check_ledger(
		$node, 'app', $label,
		open_key => $open_key,
		open_msg => $open_msg);
}

note('totals: '
	  . $node->safe_psql('app',
		q{SELECT format('%s charges, %s acknowledged keys, %s effects, %s acknowledged messages',
		                (SELECT count(*) FROM charges), (SELECT count(*) FROM acked_keys),
		                (SELECT count(*) FROM effects), (SELECT count(*) FROM acked_msgs))}));

amcheck_ledger($node, 'app', 'after the crashes');

my @errors = server_log_errors($node, $log_start);
is(scalar(@errors), 0, 'the server log has no ERROR') or diag(join("\n", @errors));

$node->stop;
done_testing();
