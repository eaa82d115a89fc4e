# test/t/032_worker_waits.pl -- what the background workers wait for, and
# what waits for them.
#
# 1. A call that needs a partition a partition maker worker must make lets
#    its key lock go first.  Transaction T1 has made partitions itself (it
#    ran idem_maintain(), so it holds the ledger's creation lock until it
#    ends) and then consumes message K; T2 consumes K with a ttl beyond
#    every partition.  T2's worker waits for T1's creation lock.  If T2 kept
#    K's key lock while waiting for its worker, T1 would wait for T2, T2 for
#    the worker, the worker for T1: a cycle the deadlock detector cannot see
#    (a process waiting for a worker to exit holds no lock it waits on),
#    stuck until the worker's 5 s lock timeout.  Instead T1's consume
#    answers while T2 still waits for its worker; once T1 commits, the
#    worker makes the partition and T2 answers "already consumed".
# 2. The background worker leaves a database alone while pg_restore is
#    connected to it: maintenance then would make the tables pg_restore
#    is about to create, or drop partitions before their rows are loaded.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('waits');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 3600
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
# the worker's round after CREATE EXTENSION is over (the next is an hour away)
ok( $node->poll_query_until('postgres', q{
		SELECT (SELECT maintenance_runs > 0 FROM idempotency.stats WHERE datname = 'postgres')
		   AND NOT EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'idempotency worker')}),
	'the worker has maintained the database once');

# ---------------------------------------------------------------- 1
my $t1 = $node->background_psql('postgres');
my $t2 = $node->background_psql('postgres');
my $t2pid = $t2->query_safe('SELECT pg_backend_pid()');

$t1->query_safe(q{
	BEGIN;
	SET LOCAL idempotency.premake = 2;
	SELECT partitions_created FROM idem_maintain();});
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		 WHERE l.locktype = 'advisory' AND l.classid = 0 AND l.objid = 0 AND l.objsubid = 18757
		   AND l.granted AND a.backend_type = 'client backend'}),
	'1', 'T1 holds the ledger\'s creation lock after making partitions');

# T2: K with a ttl no partition covers yet: a partition maker works for it
$t2->query_until(qr/started/, q{
	\echo started
	SELECT idem_consume_message('cycle', 'K', ttl => '29 days') AS t2_fresh;
});
ok( $node->poll_query_until('postgres',
		"SELECT lower(wait_event) = 'bgworkershutdown' FROM pg_stat_activity WHERE pid = $t2pid"),
	'T2 waits for its partition maker');
ok( $node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'idempotency partition maker' AND wait_event_type = 'Lock'}),
	'the partition maker waits for T1\'s creation lock');

# T1 consumes K: K's key lock is free, so it answers now
is($t1->query_safe(q{SELECT idem_consume_message('cycle', 'K')}),
	't', 'T1 consumes K while T2 waits for its partition maker');
# (PostgreSQL 17 spells the wait event BgworkerShutdown)
is($node->safe_psql('postgres',
		"SELECT lower(wait_event) FROM pg_stat_activity WHERE pid = $t2pid"),
	'bgworkershutdown', 'T2 was still waiting for its partition maker then');

$t1->query_safe('COMMIT');
my $t2_out = $t2->query_safe('SELECT 1 AS after');
like($t2_out, qr/^f\n1$/m,
	'once T1 commits, the maker makes the partition and T2 answers: already consumed');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.partitions
		 WHERE table_name = 'messages' AND upper_bound > now() + interval '29 days'}),
	'1', 'the partition maker made the far partition');
$t1->quit;
$t2->quit;

# ---------------------------------------------------------------- 2
$node->safe_psql('postgres', 'CREATE DATABASE restoring');
# as pg_restore does: connect, then create the extension (which wakes the
# launcher at once)
my $restore = $node->background_psql('restoring');
$restore->query_safe(q{SET application_name = 'pg_restore'});
my $off = -s $node->logfile;
$restore->query_safe('CREATE EXTENSION idempotency');
ok( $node->wait_for_log(
		qr/pg_restore is connected to database "restoring", not maintaining it this round/, $off),
	'the worker skips a database pg_restore is connected to');
is($node->safe_psql('restoring',
		q{SELECT count(*) FROM pg_class c
		   WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
		     AND NOT EXISTS (SELECT FROM pg_depend d
		                      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
		                        AND d.deptype = 'e')}),
	'0', 'and makes no ledger table there (the stream tables are the extension\'s own)');
$restore->quit;
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.naptime = 1});
$node->reload;
ok( $node->poll_query_until('restoring',
		q{SELECT count(DISTINCT table_name) = 2 FROM idempotency.partitions}),
	'once pg_restore is gone, the worker maintains the database');

$node->stop;
done_testing();
