
# test/t/066_outbox_late_commit_max_age.pl -- an event whose transaction
# commits after its segment went past idempotency.outbox_max_age reaches a
# live relay.
#
# max_age counts from the first maintenance run that finds the segment
# written by no transaction (outbox_segments.quiet_at), not from when it
# stopped taking new publishers (the next one was opened).  Counted from
# there, a prepared transaction (or any transaction open that long) kept
# the segment while it was open, and the moment it committed the next
# maintenance run dropped the segment and recorded a loss for a relay that
# was polling and had read everything: the event was visible between the
# commit and that run only.  The SPEC gives max_age to "a relay that stops
# for good".

# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/066_outbox_late_commit_max_age.pl

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('outbox_late_commit');
$node->init;
$node->append_conf('postgresql.conf', qq{
max_prepared_transactions = 2
idempotency.outbox_retention = 1
idempotency.outbox_max_age = 2
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# a live relay, caught up
$node->safe_psql('postgres', q{SELECT idem_publish('late', '{"n": 1}')});
is($node->safe_psql('postgres', q{SELECT string_agg(payload->>'n', ',') FROM idem_outbox_next('live', 'late')}),
	'1', 'the relay reads event 1');
$node->safe_psql('postgres', q{SELECT idem_outbox_ack('live', 'late', 1)});

# a publisher prepares, and is committed only after its segment went past
# the max age
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_publish('late', '{"n": 2}');
	PREPARE TRANSACTION 'late';
});
my $seg = $node->safe_psql('postgres', 'SELECT max(seg) FROM idempotency.outbox_segments');
$node->poll_query_until('postgres', qq{
	SELECT (SELECT partitions_created FROM idem_maintain()) IS NOT NULL
	   AND (SELECT max(seg) FROM idempotency.outbox_segments) > $seg})
  or die 'no newer segment';
my $closed = $node->safe_psql('postgres',
	'SELECT max(opened_at) FROM idempotency.outbox_segments');
$node->poll_query_until('postgres',
	qq{SELECT clock_timestamp() > '$closed'::timestamptz + interval '2.2 s'})
  or die 'the clock did not move';
$node->safe_psql('postgres', 'SELECT idem_maintain()');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM idempotency.outbox_segments WHERE seg = $seg}),
	'1', 'the prepared transaction keeps its segment');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_outbox_next('live', 'late')}),
	'0', 'the relay polls: nothing committed yet');

$node->safe_psql('postgres', q{COMMIT PREPARED 'late'});
# maintenance runs before the relay's next poll
$node->safe_psql('postgres', 'SELECT idem_maintain()');
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT string_agg(payload->>'n', ',') FROM idem_outbox_next('live', 'late')});
is($rc, 0, 'the live relay\'s next poll succeeds');
is($out, '2', 'the live relay gets the event committed late');

$node->stop;
done_testing();
