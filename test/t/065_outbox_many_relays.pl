
# test/t/065_outbox_many_relays.pl -- one role's many relays do not stop
# maintenance.
#
# Any role makes a relay (a row of idempotency.outbox_relays) by calling
# idem_outbox_next() with a new name, events or not.  Past
# idempotency.outbox_max_age, maintenance took the relay lock of every
# relay of every role at once, in one transaction, before dropping a
# segment: an ordinary role with more relays than the shared lock table
# holds made every maintenance run of the database fail with "out of shared
# memory" (53200), ledgers included, and while it ran, lock acquisitions of
# every other backend of the cluster too.  Now only the relays that lose
# events in the segment are locked, and a segment whose losers would take
# more than max_locks_per_transaction locks is left for a later run (and
# the log says so): the run itself succeeds.  (And one transaction of a
# role cannot take more relay locks than max_locks_per_transaction either,
# since 0.5.0's review: sql/outbox.sql.)
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/065_outbox_many_relays.pl

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('outbox_many_relays');
$node->init;
# a small lock table: a few hundred entries
$node->append_conf('postgresql.conf', qq{
max_connections = 10
max_prepared_transactions = 0
max_locks_per_transaction = 10
idempotency.outbox_retention = 1
idempotency.outbox_max_age = 1
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE regress_many LOGIN;
	CREATE ROLE regress_other LOGIN;
});

# another role's relay, its events acknowledged
$node->safe_psql('postgres', q{
	SET ROLE regress_other;
	SELECT idem_publish('orders', '{"n": 1}');
	SELECT count(*) FROM idem_outbox_next('r', 'orders');
	SELECT idem_outbox_ack('r', 'orders', 1);
});

# one event, and thousands of relays of another topic (none has events)
# and a few that never acknowledge it
$node->safe_psql('postgres', q{
	SET ROLE regress_many;
	SELECT idem_publish('kept', '{"n": 1}');
	SELECT count(*) FROM idem_outbox_next('stuck', 'kept');
	SELECT count(*) FROM idem_outbox_next('stuck2', 'kept');
});
# (ten relays per transaction: a transaction holds at most
# max_locks_per_transaction relay locks, and the next call is refused)
$node->safe_psql('postgres', q{
	SET ROLE regress_many;
	DO $$
	BEGIN
		FOR k IN 0 .. 299 LOOP
			PERFORM count(*) FROM generate_series(k * 10, k * 10 + 9) AS i,
			        LATERAL idem_outbox_next('r' || i, 'empty');
			COMMIT;
		END LOOP;
	END $$;
});
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.outbox_relays'),
	'3003', 'the relays are made');

# the first segment stops taking events (a new one is made once it has
# taken events for a second), then goes past the max age; waits are on the
# clock, not fixed sleeps
$node->poll_query_until('postgres', q{
	SELECT (SELECT partitions_created FROM idem_maintain()) IS NOT NULL
	   AND (SELECT count(*) FROM idempotency.outbox_segments) >= 2})
  or die 'no second segment';
# the max age counts from the run that finds the first segment written by
# no transaction
$node->safe_psql('postgres', 'SELECT idem_maintain()');
my $closed = $node->safe_psql('postgres',
	'SELECT max(quiet_at) FROM idempotency.outbox_segments');
$node->poll_query_until('postgres',
	qq{SELECT clock_timestamp() > '$closed'::timestamptz + interval '1.2 s'})
  or die 'the clock did not move';

my ($rc, $out, $err) = $node->psql('postgres',
	'SELECT partitions_dropped FROM idem_maintain()');
is($rc, 0, 'maintenance past the max age succeeds with thousands of relays');
unlike($err, qr/out of shared memory/, 'no "out of shared memory"');
is($out, '1', 'the expired segment is dropped');
is($node->safe_psql('postgres', q{
	SET ROLE regress_many;
	SELECT relay || ':' || lost_events FROM idem_outbox_relays()
	 WHERE topic = 'kept' ORDER BY relay}), "stuck:1\nstuck2:1",
	'the relays that lost the event say so');
is($node->safe_psql('postgres', q{
	SET ROLE regress_other;
	SELECT lost_events FROM idem_outbox_relays()}), '0',
	'the other role\'s relay lost nothing');

# more relays losing events in one segment than max_locks_per_transaction:
# the segment is kept and said so, the run succeeds
$node->safe_psql('postgres', q{
	SET ROLE regress_many;
	SELECT idem_publish('kept2', '{"n": 1}');
	SELECT count(*) FROM generate_series(1, 10) AS i,
	       LATERAL idem_outbox_next('s' || i, 'kept2');
	SELECT count(*) FROM generate_series(11, 20) AS i,
	       LATERAL idem_outbox_next('s' || i, 'kept2');
});
my $segs = $node->safe_psql('postgres', 'SELECT max(seg) FROM idempotency.outbox_segments');
$node->poll_query_until('postgres', qq{
	SELECT (SELECT partitions_created FROM idem_maintain()) IS NOT NULL
	   AND (SELECT max(seg) FROM idempotency.outbox_segments) > $segs})
  or die 'no newer segment';
$node->safe_psql('postgres', 'SELECT idem_maintain()');
$closed = $node->safe_psql('postgres',
	qq{SELECT quiet_at FROM idempotency.outbox_segments WHERE seg = $segs});
$node->poll_query_until('postgres',
	qq{SELECT clock_timestamp() > '$closed'::timestamptz + interval '1.2 s'})
  or die 'the clock did not move';
my $log_at = -s $node->logfile;
($rc, $out, $err) = $node->psql('postgres', 'SELECT partitions_dropped FROM idem_maintain()');
is($rc, 0, 'maintenance succeeds with more losing relays than max_locks_per_transaction');
ok($node->log_contains(qr/is past "idempotency.outbox_max_age" but is kept: 20 relays lose events in it/, $log_at),
	'the segment is kept, and the log says why');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM idempotency.outbox_segments WHERE seg = $segs}), '1',
	'the segment is still there');

$node->stop;
done_testing();
