
# test/t/061_outbox.pl -- the outbox across a crash, and its logical
# decoding messages.
#
# Logical messages (idempotency.outbox_logical = on): with test_decoding on
# a logical slot, an event is emitted exactly when its transaction commits
# (not while it is open, in the commit's place in the WAL among other
# transactions' events), never for a transaction or subtransaction that
# rolls back, and carries the event id idem_publish returned and the role.
#
# The background worker drops an acknowledged segment past the retention,
# and idempotency.outbox_stats counts what happened.
#
# Crash and restart (pg_ctl stop -m immediate): every event of a committed
# transaction survives and is relayed, none of a transaction open at the
# crash is; a batch handed out and not acknowledged before the crash is
# handed out again, the same events in the same batch; an acknowledged one
# is not; publishing and relaying go on after the restart (event numbers,
# xids and the relay's snapshots stay in order).
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/061_outbox.pl

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('outbox');
$node->init(allows_streaming => 'logical');
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
max_prepared_transactions = 10
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', q{CREATE ROLE app LOGIN});
$node->safe_psql('postgres',
	q{SELECT pg_create_logical_replication_slot('outbox', 'test_decoding')});

# the outbox's messages of the slot, in WAL order, as "topic:n" (and their
# event ids in @$ids)
sub messages
{
	my ($ids) = @_;
	my $out = $node->safe_psql('postgres', q{
		SELECT data FROM pg_logical_slot_get_changes('outbox', NULL, NULL,
		         'include-xids', '0', 'skip-empty-xacts', '1')
		 WHERE data LIKE 'message:%'});
	my @got;
	for my $line (split /\n/, $out)
	{
		like($line, qr/^message: transactional: 1 prefix: idempotency\.outbox, sz: \d+ content:\{/,
			'a transactional message with the outbox prefix');
		my ($id) = $line =~ /"event_id": "([0-9a-f-]{36})"/;
		my ($topic) = $line =~ /"topic": "([^"]*)"/;
		my ($n) = $line =~ /"payload": \{"n": (\d+)\}/;
		my ($role) = $line =~ /"role": "([^"]*)"/;
		push @got, "$topic:$n:$role";
		push @$ids, $id if $ids;
	}
	return join(' ', @got);
}

# The first event of the database makes the events table in its
# transaction (once: doc/reference.md); the topics need nothing made.
$node->safe_psql('postgres', q{SET ROLE app; SELECT idem_publish('setup')});

# ------------------------------------------------------------ logical
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.outbox_logical = on});
$node->reload;

my $first = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$first->query_safe('BEGIN');
my $id1 = $first->query_safe(q{SELECT idem_publish('orders', '{"n": 1}')});
is(messages(), '', 'an event of an open transaction is not emitted');

# the first event of topic "orders" is open: another publisher of the new
# topic does not wait for it
my $id2 = $node->safe_psql('postgres', q{SET ROLE app; SELECT idem_publish('orders', '{"n": 2}')});
my @ids;
is(messages(\@ids), 'orders:2:app', 'an event of a committed transaction is emitted at its commit');
is($ids[0], $id2, 'with the event id idem_publish returned');

$first->query_safe('COMMIT');
@ids = ();
is(messages(\@ids), 'orders:1:app', 'the open one is emitted when it commits, after the other');
is($ids[0], $id1, 'with its event id');

$node->safe_psql('postgres', q{
	SET ROLE app;
	BEGIN;
	SELECT idem_publish('orders', '{"n": 3}');
	ROLLBACK;
	BEGIN;
	SAVEPOINT s;
	SELECT idem_publish('orders', '{"n": 4}');
	ROLLBACK TO SAVEPOINT s;
	SELECT idem_publish('orders', '{"n": 5}');
	COMMIT;
});
is(messages(), 'orders:5:app',
	'nothing of a rolled-back transaction or subtransaction is emitted');

$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.outbox_logical = off});
$node->reload;
$node->safe_psql('postgres', q{SET ROLE app; SELECT idem_publish('orders', '{"n": 6}')});
is(messages(), '', 'off: no message');
# an ordinary role cannot turn it on
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	q{SET ROLE app; SET idempotency.outbox_logical = on});
like($stderr, qr/permission denied to set parameter/, 'outbox_logical is for superusers');
$node->safe_psql('postgres', q{SELECT pg_drop_replication_slot('outbox')});

# the relay takes everything so far
is($node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT string_agg(payload->>'n', ',' ORDER BY payload->>'n')
	  FROM idem_outbox_next('r', 'orders', 100)}), '1,2,5,6', 'the relay reads the committed events');
is($node->safe_psql('postgres', q{SET ROLE app; SELECT idem_outbox_ack('r', 'orders', 1)}), 't', 'acknowledged');

# ------------------------------------------------------------ crash
$node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT idem_publish('orders', jsonb_build_object('n', i), 'k' || (i % 3))
	  FROM generate_series(10, 29) AS i});
# a batch handed out and not acknowledged
my $batch = $node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT batch || ':' || string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int)
	  FROM idem_outbox_next('r', 'orders', 5) GROUP BY batch});
like($batch, qr/^2:10,11,12,13,14$/, 'batch 2: the first five events');
# a transaction open at the crash, and a prepared one
my $open = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$open->query_safe('BEGIN');
$open->query_safe(q{SELECT idem_publish('orders', '{"n": 99}', 'k0')});
$node->safe_psql('postgres', q{
	SET ROLE app;
	BEGIN;
	SELECT idem_publish('orders', '{"n": 30}');
	PREPARE TRANSACTION 'p30';
});
$node->stop('immediate');
$open->{run}->kill_kill;
$node->start;

is($node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT batch || ':' || string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int)
	  FROM idem_outbox_next('r', 'orders', 5) GROUP BY batch}), $batch,
	'after the crash, the batch not acknowledged is handed out again');
is($node->safe_psql('postgres', q{SET ROLE app; SELECT idem_outbox_ack('r', 'orders', 2)}), 't',
	'and acknowledged');
$node->safe_psql('postgres', q{COMMIT PREPARED 'p30'});
$node->safe_psql('postgres', q{SET ROLE app; SELECT idem_publish('orders', '{"n": 31}', 'k1')});

my @rest;
for my $round (1 .. 10)
{
	my $got = $node->safe_psql('postgres', q{
		SET ROLE app;
		SELECT coalesce(max(batch), 0) || ':' || coalesce(string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int), '')
		  FROM idem_outbox_next('r', 'orders', 7)});
	my ($b, $list) = split /:/, $got, 2;
	last if $b == 0;
	push @rest, split /,/, $list;
	$node->safe_psql('postgres', "SET ROLE app; SELECT idem_outbox_ack('r', 'orders', $b)");
}
is(join(',', sort { $a <=> $b } @rest), join(',', 15 .. 31),
	'every committed event is relayed once after the restart (the prepared one too), the open one never');

# the worker's segments survive too: maintenance runs after the crash
my $made = $node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_segments});
cmp_ok($made, '>=', 1, 'segments are there after the restart');
$node->safe_psql('postgres', q{SELECT idem_maintain()});
is($node->safe_psql('postgres', q{SET ROLE app; SELECT lag_events FROM idem_outbox_relays() WHERE relay = 'r'}),
	'0', 'no lag left');

# ------------------------------------------------------------ the worker
# The background worker drops segments as idem_maintain() does: with a
# retention of one second and a round every second, the segment that held
# everything above (all acknowledged) goes, and newer ones come.
my $first_seg = $node->safe_psql('postgres', q{SELECT min(seg) FROM idempotency.outbox_segments});
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.outbox_retention = '1s'});
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.naptime = '1s'});
$node->reload;
ok($node->poll_query_until('postgres',
		qq{SELECT NOT EXISTS (SELECT FROM idempotency.outbox_segments WHERE seg = $first_seg)}),
	'the background worker drops the acknowledged segment');
ok($node->poll_query_until('postgres',
		q{SELECT segments_dropped > 0 AND segments_created > 1 FROM idempotency.outbox_stats}),
	'idempotency.outbox_stats counts the segments made and dropped');
is($node->safe_psql('postgres', q{SET ROLE app;
	SELECT count(*) FROM idem_outbox_next('r', 'orders')}), '0',
	'nothing comes again after the drop');
# the counters live in shared memory, which the crash reset: since the
# restart one event was published (31) and 22 relayed (batch 2 again, then
# 15 to 31)
is($node->safe_psql('postgres', q{
	SELECT events_published || ' ' || events_relayed FROM idempotency.outbox_stats}),
	'1 22', 'idempotency.outbox_stats counts events published and relayed');

# A DBA's unique btree on a segment: its entries are written directly, and
# their uniqueness checked as an INSERT checks it (23505, nothing written);
# the index stays complete.  (A node of its own, without the background
# worker: its one segment stays the newest.)
my $unode = PostgreSQL::Test::Cluster->new('outbox_unique');
$unode->init;
$unode->start;
$unode->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$unode->safe_psql('postgres', q{SELECT idem_publish('u-setup')});
my $useg = $unode->safe_psql('postgres', q{
	SELECT format('idempotency.outbox_%s', lpad(max(seg)::text, 6, '0')) FROM idempotency.outbox_segments});
$unode->safe_psql('postgres', "CREATE UNIQUE INDEX dba_unique_topic ON $useg (topic)");
$unode->safe_psql('postgres', q{SELECT idem_publish('u-a')});
my ($uret, $uout, $uerr) = $unode->psql('postgres', q{
\set VERBOSITY verbose
SELECT idem_publish('u-a')});
like($uerr, qr/ERROR:  23505: duplicate key value violates unique constraint "dba_unique_topic"/,
	'a second event of a topic is refused by a DBA\'s unique index on its topic (23505)');
$unode->safe_psql('postgres', q{SELECT idem_publish('u-b')});
is($unode->safe_psql('postgres', qq{
	SET enable_seqscan = off; SET enable_bitmapscan = off;
	SELECT string_agg(topic, ' ' ORDER BY topic) FROM $useg WHERE topic >= 'u-'}),
	'u-a u-b u-setup', 'the index has an entry for each event written, none for the one refused');
$unode->stop;

$node->stop;
done_testing();
