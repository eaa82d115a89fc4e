
# test/t/030_worker.pl -- the background worker (shared_preload_libraries).
#
# With a 1-second partition interval and naptime:
#   - the worker makes and drops partitions in a database with the extension
#     and leaves one without it alone; a CREATE EXTENSION in that database,
#     a database created later and a DROP EXTENSION are all noticed;
#   - a partition a call needs is made by a partition maker worker, so the
#     caller's transaction holds no DDL lock;
#   - idempotency.stats counts what the SQL functions and the worker did,
#     and shows the error of a failed round until a round succeeds;
#   - SIGHUP reloads idempotency.naptime; SIGTERM stops the launcher at once
#     (the postmaster starts it again); SIGKILL of the launcher makes the
#     postmaster restart everything and the launcher comes back;
#   - a streaming standby never runs it; promoted, it does.
# Every wait polls for a condition.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $conf = q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
max_prepared_transactions = 10
restart_after_crash = on
};

my $node = PostgreSQL::Test::Cluster->new('primary');
$node->init(allows_streaming => 1);
$node->append_conf('postgresql.conf', $conf);
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE with_ext');
$node->safe_psql('postgres', 'CREATE DATABASE without_ext');
$node->safe_psql('with_ext', 'CREATE EXTENSION idempotency');

sub launcher_pid
{
	my ($n) = @_;
	return $n->safe_psql('postgres',
		q{SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		   WHERE backend_type = 'idempotency launcher'});
}

sub stat_of
{
	my ($n, $db, $column) = @_;
	return $n->safe_psql($db,
		"SELECT coalesce(max($column), 0) FROM idempotency.stats WHERE datname = current_database()");
}

# partitions whose range has ended: the worker drops them within a naptime
my $expired_sql = q{SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= now() - interval '3 seconds'};

# ---------------------------------------------------------------- makes and drops
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'the launcher runs');

ok($node->poll_query_until('with_ext',
		q{SELECT partitions_created > 0 AND partitions_dropped > 0 AND maintenance_runs >= 2
		    FROM idempotency.stats WHERE datname = current_database()}),
	'the worker makes and drops partitions in the database with the extension');

# the storage always covers now .. now + ttl: live partitions exist for both ledgers
is($node->safe_psql('with_ext',
		q{SELECT count(DISTINCT table_name) FROM idempotency.partitions
		   WHERE lower_bound <= now() + interval '1 second' AND upper_bound > now()}),
	'2', 'partitions are made ahead for both ledgers');

# partitions keep being dropped: none lingers past its end for long
my $dropped = stat_of($node, 'with_ext', 'partitions_dropped');
ok($node->poll_query_until('with_ext',
		"SELECT partitions_dropped > $dropped FROM idempotency.stats WHERE datname = current_database()"),
	'more partitions are dropped as they expire');
is($node->safe_psql('with_ext', $expired_sql), '0', 'no partition lingers seconds after its end');

is($node->safe_psql('without_ext',
		q{SELECT count(*) FROM pg_namespace WHERE nspname = 'idempotency'}),
	'0', 'the database without the extension is left alone');
is($node->safe_psql('with_ext',
		q{SELECT count(*) FROM idempotency.stats WHERE datname = 'without_ext'}),
	'0', 'and has no statistics');

# ---------------------------------------------------------------- counters
$node->safe_psql('with_ext', q{
	SELECT idempotency.stats_reset();
	BEGIN;
	SELECT status FROM idem_claim('k1', '{"a":1}');
	SELECT idem_complete('k1', 201, '{"id":1}');
	COMMIT;
	SELECT status FROM idem_claim('k1', '{"a":1}');
	SELECT status FROM idem_claim('k1', '{"a":2}');
	BEGIN;
	SELECT status FROM idem_claim('k2', NULL, ttl => '10 minutes', lease => '1 minute');
	COMMIT;
	SELECT status FROM idem_claim('k2');
	SELECT idem_consume_message('c', 'm1');
	SELECT idem_consume_message('c', 'm1');
	SELECT * FROM idem_consume_messages('c', ARRAY['m1', 'm2', 'm3', 'm2']);
});
is($node->safe_psql('with_ext',
		q{SELECT format('%s %s %s %s %s %s', claims, replays, conflicts, mismatches, consumed, duplicates)
		    FROM idempotency.stats WHERE datname = current_database()}),
	'2 1 1 1 3 3',
	'claims, replays, conflicts, mismatches, consumed and duplicates are counted');

is($node->safe_psql('with_ext', q{
	SET ROLE pg_monitor;
	SELECT count(*) > 0 FROM idempotency.stats;
}), 't', 'pg_monitor can read the statistics');
my ($ret, $out, $err) = $node->psql('with_ext', q{
	CREATE ROLE nobody_special;
	SET ROLE nobody_special;
	SELECT * FROM idempotency.stats;
});
like($err, qr/permission denied/, 'ordinary roles cannot');

# ---------------------------------------------------------------- partitions made on the spot
# A call whose ttl needs a partition nobody has made yet has a partition
# maker worker make it in its own transaction: the caller's transaction holds
# no DDL lock, so other calls needing new partitions, and maintenance, are
# not held up by it however long it stays open.
my $holder = $node->background_psql('with_ext');
my $holder_pid = $holder->query_safe('SELECT pg_backend_pid()');
is($holder->query_safe(q{BEGIN; SELECT idem_consume_message('c', 'far-1', '20 days')}),
	't', 'a call needing a new partition is answered');
is($node->safe_psql('with_ext',
		qq{SELECT count(*) FROM pg_locks WHERE pid = $holder_pid AND locktype = 'relation'
		     AND relation IN ('idempotency.messages'::regclass, 'idempotency.keys'::regclass)}),
	'0', 'its open transaction holds no lock on the ledger table');
is($node->safe_psql('with_ext',
		q{SET lock_timeout = '3s'; SELECT idem_consume_message('c', 'far-2', '25 days')}),
	't', 'another call needing another new partition is not held up');
like($node->safe_psql('with_ext',
		q{SET lock_timeout = '3s'; SELECT format('%s/%s', partitions_created, partitions_dropped) FROM idem_maintain()}),
	qr{^\d+/\d+$}, 'nor is maintenance');
$holder->query_safe('COMMIT');
$holder->quit;
is($node->safe_psql('with_ext',
		q{SELECT count(*) FROM idempotency.partitions
		   WHERE table_name = 'messages' AND upper_bound > now() + interval '19 days'}),
	'2', 'both partitions exist');
is($node->safe_psql('with_ext',
		q{SELECT bool_or(x) FROM (SELECT idem_consume_message('c', 'far-1', '20 days')
		                          UNION ALL SELECT idem_consume_message('c', 'far-2', '25 days')) s(x)}),
	'f', 'and hold the two messages');

# ---------------------------------------------------------------- a failing round
# A session holding a lock that ATTACH PARTITION needs makes the rounds fail
# (after the worker's lock timeout); the error shows in the statistics, and
# the next round after the lock goes succeeds and clears it.
my $blocker = $node->background_psql('with_ext');
$blocker->query_safe('BEGIN; LOCK TABLE idempotency.keys IN SHARE UPDATE EXCLUSIVE MODE');
ok($node->poll_query_until('with_ext',
		q{SELECT last_maintenance_error ~ 'lock timeout' AND last_error_at IS NOT NULL
		    FROM idempotency.stats WHERE datname = current_database()}),
	'a round that cannot get its locks fails, and the error is in idempotency.stats');
is($node->safe_psql('with_ext', q{SELECT idem_consume_message('c', 'during-lock')}),
	't', 'consumers are not blocked meanwhile');
$blocker->query_safe('COMMIT');
$blocker->quit;
ok($node->poll_query_until('with_ext',
		q{SELECT last_maintenance_error IS NULL AND last_error_at IS NOT NULL
		    FROM idempotency.stats WHERE datname = current_database()}),
	'the next round succeeds and clears the error');

# ---------------------------------------------------------------- noticed within a naptime
$node->safe_psql('without_ext', 'CREATE EXTENSION idempotency');
ok($node->poll_query_until('without_ext',
		q{SELECT count(*) > 0 FROM idempotency.partitions}),
	'CREATE EXTENSION in another database is noticed');
ok($node->poll_query_until('without_ext',
		q{SELECT partitions_dropped > 0 FROM idempotency.stats WHERE datname = current_database()}),
	'and that database is maintained');

$node->safe_psql('postgres', 'CREATE DATABASE later TEMPLATE with_ext');
ok($node->poll_query_until('later',
		q{SELECT maintenance_runs > 0 FROM idempotency.stats WHERE datname = current_database()}),
	'a database created later, with the extension from its template, is maintained');

my $offset = -s $node->logfile;
$node->safe_psql('later', 'DROP EXTENSION idempotency');
ok($node->wait_for_log(qr/database "later" no longer has the extension/, $offset),
	'DROP EXTENSION is noticed');
$node->safe_psql('postgres', 'DROP DATABASE later');
pass('DROP DATABASE of a database the worker maintained succeeds');

# ---------------------------------------------------------------- SIGHUP
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.naptime = '1h'});
$node->reload;
# the launcher applies it at its next wakeup (the reload wakes it)
ok($node->poll_query_until('postgres',
		q{SELECT setting = '3600' FROM pg_settings WHERE name = 'idempotency.naptime'}),
	'naptime raised');
# Proving that rounds stopped needs a window of time: no condition marks
# "nothing happened".  Two reads 3 s apart must agree (with the old 1-second
# naptime they never would); polled, because the round in progress and the
# one the reload wakes the launcher for may still be counted first.
ok($node->poll_query_until('with_ext', q{
	SELECT s1 = s2 FROM
	  (SELECT maintenance_runs AS s1 FROM idempotency.stats WHERE datname = current_database()) a,
	  LATERAL (SELECT pg_sleep(3)) z,
	  LATERAL (SELECT maintenance_runs AS s2 FROM idempotency.stats WHERE datname = current_database()) b}),
	'with naptime 1h the worker no longer runs every second');
my $runs_before;
$runs_before = stat_of($node, 'with_ext', 'maintenance_runs');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.naptime = 1});
$node->reload;
# With the hour-long nap the launcher runs at most the round in progress and
# the one the reload wakes it for; rounds every second again mean the new
# value was read without a restart.
ok($node->poll_query_until('with_ext',
		"SELECT maintenance_runs >= $runs_before + 6 FROM idempotency.stats WHERE datname = current_database()"),
	'SIGHUP: naptime back to 1 s is applied without a restart');

# ---------------------------------------------------------------- SIGTERM
my $pid = launcher_pid($node);
my $t0 = time;
kill 'TERM', $pid;
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'SIGTERM stops the launcher');
cmp_ok(time - $t0, '<', 10, 'promptly');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher' AND pid <> $pid"),
	'the postmaster starts it again');

# ---------------------------------------------------------------- SIGKILL
$pid = launcher_pid($node);
kill 'KILL', $pid;
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher' AND pid <> $pid"),
	'after SIGKILL of the launcher, the server restarts it');
# shared memory was reinitialized by the crash restart: counting starts over
ok($node->poll_query_until('with_ext',
		q{SELECT partitions_dropped > 0 FROM idempotency.stats WHERE datname = current_database()}),
	'and maintenance goes on after the crash');

# ---------------------------------------------------------------- standby
$node->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);

# the primary keeps maintaining; replay brings its DDL to the standby
my $primary_runs = stat_of($node, 'with_ext', 'maintenance_runs');
ok($node->poll_query_until('with_ext',
		"SELECT maintenance_runs >= $primary_runs + 3 FROM idempotency.stats WHERE datname = current_database()"),
	'the primary runs several rounds meanwhile');
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'a standby runs no launcher and no worker');
is($standby->safe_psql('with_ext', q{SELECT count(*) FROM idempotency.stats}),
	'0', 'and no maintenance');

$node->stop('immediate');
$standby->promote;
ok($standby->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'}),
	'the promoted standby starts the launcher');
ok($standby->poll_query_until('with_ext',
		q{SELECT partitions_created > 0 AND partitions_dropped > 0
		    FROM idempotency.stats WHERE datname = current_database()}),
	'and maintains partitions');
is($standby->safe_psql('with_ext', $expired_sql), '0',
	'no partition lingers on the promoted standby');

$standby->stop;
done_testing();
