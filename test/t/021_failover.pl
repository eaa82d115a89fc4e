
# test/t/021_failover.pl -- no acknowledged key or message is lost across a
# failover to a synchronous standby, and maintenance resumes there.
#
# A primary streams to a standby named in synchronous_standby_names, with
# synchronous_commit = remote_apply.  Under load (three psql clients
# claiming keys and charging them, two consuming messages, all with a
# one-hour ttl; each prints "ack ID" after its COMMIT returned, see
# Torture.pm), and with one transaction left open after claiming, charging,
# consuming and processing, the primary is stopped in immediate mode and
# the standby promoted.  On the new primary (Torture::check_ledger): every
# acknowledged key is completed with its charge and replays its response,
# every acknowledged message is consumed with its effect, charges and
# completed keys agree one to one, nothing is done twice, and nothing of the
# open transaction is there.  New claims and consumes work and keep the
# invariants.
#
# Both nodes load the library (shared_preload_libraries, naptime 1 s) with
# 1-second partitions and a 3-second default ttl, and some short-lived keys
# and messages are written before the failover.  The worker never runs on
# the standby; once promoted, its worker (no idem_maintain() call) drops the
# partitions that ended and makes new ones, and idem_maintain() works
# there too.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', q{
max_connections = 30
shared_buffers = 16MB
log_statement = none
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = '1s'
idempotency.key_ttl = '3s'
idempotency.message_ttl = '3s'
});
$primary->start;

$primary->safe_psql('postgres', 'CREATE DATABASE app');
create_business_schema($primary, 'app');

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# synchronous from now on (before, a commit would wait for a standby that is
# not there yet); the standby's own configuration, copied before, has none
$primary->append_conf(
	'postgresql.conf', q{
synchronous_standby_names = 'standby'
synchronous_commit = remote_apply
});
$primary->reload;
ok( $primary->poll_query_until(
		'postgres',
		q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'}),
	'the standby is a synchronous standby');

# short-lived keys and messages (default ttl, 3 s): their partitions end
# soon after the failover
$primary->safe_psql(
	'app', q{
SELECT count(*) FROM generate_series(1, 20) g WHERE idem_consume_message('short', 'short-' || g);
BEGIN;
SELECT status FROM idem_claim('short-key');
SELECT idem_complete('short-key', 200);
COMMIT;
});

# ---------------------------------------------------------------- load
my $tmp = PostgreSQL::Test::Utils::tempdir;
my @clients = start_ack_clients(
	$primary, 'app', $tmp,
	(
		map {
			{
				name   => "claim$_",
				kind   => 'claim',
				script => ack_claim_script(
					prefix => "c$_",
					count  => 4000,
					hot    => 30,
					ttl    => '1 hour',
					seed   => $_)
			}
		} 1 .. 3
	),
	(
		map {
			{
				name   => "consume$_",
				kind   => 'consume',
				script => ack_consume_script(
					prefix => "m$_",
					count  => 4000,
					hot    => 30,
					ttl    => '1 hour',
					seed   => 10 + $_)
			}
		} 1 .. 2
	));

# with remote_apply, what the primary acknowledged is visible on the standby
ok( $standby->poll_query_until(
		'app',
		q{SELECT (SELECT count(*) FROM charges) >= 400 AND (SELECT count(*) FROM effects) >= 200}),
	'load is running, and replicated');

my $open = $primary->background_psql('app', on_error_stop => 0);
like(
	$open->query_safe(
		q{BEGIN;
		  SELECT status FROM idem_claim('open-key', request => '{"key": "open-key"}', ttl => '1 hour');
		  INSERT INTO charges (key, token, expires_us) VALUES ('open-key', 1, 1);
		  SELECT idem_complete('open-key', 201, '{"charge": "open-key"}');
		  SELECT idem_consume_message('c', 'open-msg', '1 hour');
		  INSERT INTO effects (msg_id) VALUES ('open-msg');}),
	qr/^claimed\n\nt$/,
	'a transaction left open on the primary claimed its key and message');

# ---------------------------------------------------------------- failover
$primary->stop('immediate');
eval { $open->quit; };
my %r = finish_ack_clients(@clients);
is(scalar(@{ $r{errors} }), 0, 'no client got an SQL error')
  or diag(join("\n", @{ $r{errors} }));
note(sprintf('%d keys and %d messages acknowledged by the primary',
		scalar(@{ $r{keys} }), scalar(@{ $r{msgs} })));
ok(@{ $r{keys} } >= 100 && @{ $r{msgs} } >= 50, 'clients acknowledged keys and messages');

# the worker never runs on the standby: what it has now is what the
# primary left
is($standby->safe_psql('app', 'SELECT pg_is_in_recovery()'), 't', 'the standby is still a standby');
# idempotency.partition_info(), not the partitions view: the view's sizes
# lock each partition, and a DDL the primary had in flight when it stopped
# (a partition being made or dropped) leaves its ACCESS EXCLUSIVE lock
# replayed on the standby until promotion
my @at_promotion = split /\n/,
  $standby->safe_psql('app', 'SELECT partition FROM idempotency.partition_info() ORDER BY 1');
my @ending = split /\n/,
  $standby->safe_psql('app',
	q{SELECT partition FROM idempotency.partition_info()
	   WHERE upper_bound < now() + interval '1 minute' ORDER BY 1});
ok(@ending > 0, 'partitions of short-lived keys and messages are there at the failover ('
	  . scalar(@ending) . ')');

$standby->promote;
ok($standby->poll_query_until('app', 'SELECT NOT pg_is_in_recovery()'), 'the standby is promoted');

# ---------------------------------------------------------------- the ledger
record_acks($standby, 'app', $r{keys}, $r{msgs});
check_ledger(
	$standby, 'app', 'after the failover',
	live_beyond => '10 minutes',
	open_key    => 'open-key',
	open_msg    => 'open-msg');

# new claims and consumes work on the new primary
is( $standby->safe_psql(
		'app', q{
BEGIN;
SELECT status = 'claimed' AS claimed, token, (extract(epoch FROM expires_at) * 1000000)::bigint AS e_us
  FROM idem_claim('after-failover', request => '{"key": "after-failover"}', ttl => '1 hour') \gset
INSERT INTO charges (key, token, expires_us) VALUES ('after-failover', :token, :e_us);
SELECT idem_complete('after-failover', 201, '{"charge": "after-failover"}');
COMMIT;
SELECT :'claimed', status FROM idem_claim('after-failover', request => '{"key": "after-failover"}');
INSERT INTO acked_keys VALUES ('after-failover');
}),
	"\nt|completed",
	'a new key is claimed on the new primary, then replays');
is( $standby->safe_psql(
		'app', q{
INSERT INTO effects (msg_id) SELECT 'after-failover-msg'
 WHERE idem_consume_message('c', 'after-failover-msg', '1 hour');
SELECT idem_consume_message('c', 'after-failover-msg', '1 hour');
INSERT INTO acked_msgs VALUES ('after-failover-msg');
}),
	'f',
	'a new message is consumed on the new primary, then is a duplicate');
check_ledger($standby, 'app', 'after new work on the new primary', live_beyond => '10 minutes');

# ---------------------------------------------------------------- maintenance
# the promoted node's worker, without any idem_maintain() call
my $ending_list = join(', ', map { "'$_'" } @ending);
ok( $standby->poll_query_until(
		'app',
		"SELECT count(*) = 0 FROM idempotency.partitions WHERE partition::text IN ($ending_list)"),
	"the new primary's worker drops the partitions that ended");
my $known_list = join(', ', map { "'$_'" } @at_promotion);
ok( $standby->poll_query_until(
		'app',
		"SELECT count(DISTINCT table_name) = 2 FROM idempotency.partitions
		  WHERE partition::text NOT IN ($known_list)
		    AND upper_bound < now() + interval '1 minute'"),
	"the new primary's worker makes new partitions for both ledgers");
is( $standby->safe_psql(
		'app',
		q{SELECT partitions_created > 0 AND partitions_dropped > 0 AND maintenance_runs > 0
		         AND last_maintenance_error IS NULL
		    FROM idempotency.stats WHERE datname = current_database()}),
	't',
	"the new primary's statistics count the worker's runs, without error");

# and idem_maintain() works there
like($standby->safe_psql('app', 'SELECT * FROM idem_maintain()'),
	qr/^\d+\|\d+$/, 'idem_maintain() runs on the new primary');
is( $standby->safe_psql(
		'app',
		q{SELECT count(DISTINCT table_name) FROM idempotency.partitions
		   WHERE lower_bound <= now() AND upper_bound > now() + interval '1 second'}),
	'2',
	'both ledgers have a partition for rows made now');
is( $standby->safe_psql(
		'app',
		q{SELECT count(*) FROM idempotency.partitions WHERE upper_bound < now() - interval '3 seconds'}),
	'0',
	'no partition lingers seconds after it ended');
check_ledger($standby, 'app', 'after maintenance on the new primary', live_beyond => '10 minutes');
amcheck_ledger($standby, 'app', 'the new primary');

my @errors = server_log_errors($standby, 0);
is(scalar(@errors), 0, "the new primary's log has no ERROR") or diag(join("\n", @errors));

$standby->stop;
done_testing();
