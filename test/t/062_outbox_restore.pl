
# test/t/062_outbox_restore.pl -- the outbox through pg_dump and pg_restore
# into another cluster.
#
# pg_dump carries the events table and its segments (not members of the
# extension) with their rows, and the relays' positions, the segments' times,
# the event sequence and the xid base (members whose rows are dumped).
# Restored into a cluster whose transaction ids are behind the dumped one's
# (a new cluster: its counter starts low), a relay goes on where it was: the
# batch it had not acknowledged comes again, then the events it had not read,
# each once, and events published after the restore are relayed too.
# Without the xid base (outbox_storage.c) their transactions' ids would be
# below the restored snapshots' and compare as already relayed: lost.
# Maintenance after the restore gives the events table back its dependency
# on the extension.
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/062_outbox_restore.pl

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = PostgreSQL::Test::Cluster->new('outbox_src');
$src->init;
$src->start;
my $dst = PostgreSQL::Test::Cluster->new('outbox_dst');
$dst->init;
$dst->start;

$src->safe_psql('postgres', 'CREATE EXTENSION idempotency');
# the source's transaction ids run well ahead of the new cluster's
$src->safe_psql('postgres', q{
	CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$
	BEGIN
	  FOR i IN 1 .. n LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP;
	END $$;
	CALL burn(3000);
	DROP PROCEDURE burn(int);
});
$src->safe_psql('postgres', q{
	SELECT idem_publish('orders', jsonb_build_object('n', i), 'k' || (i % 2))
	  FROM generate_series(1, 6) AS i});

sub batch
{
	my ($node, $max) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(max(batch), 0) || ':' ||
		       coalesce(string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int), '')
		  FROM idem_outbox_next('r', 'orders', $max)});
}

is(batch($src, 2), '1:1,2', 'source: batch 1');
$src->safe_psql('postgres', q{SELECT idem_outbox_ack('r', 'orders', 1)});
is(batch($src, 2), '2:3,4', 'source: batch 2, handed out and not acknowledged');

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $dump = "$tmp/outbox.dump";
$src->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('postgres') ],
	'pg_dump of the source');
$dst->safe_psql('postgres', 'CREATE DATABASE dst');
$dst->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $dst->connstr('dst'), $dump ],
	'pg_restore into the new cluster');

cmp_ok(
	$dst->safe_psql('dst', 'SELECT pg_current_xact_id()::text::bigint'), '<',
	$src->safe_psql('postgres', 'SELECT pg_current_xact_id()::text::bigint'),
	'the new cluster\'s transaction ids are behind the source\'s');

sub batch_dst
{
	my ($max) = @_;
	return $dst->safe_psql('dst', qq{
		SELECT coalesce(max(batch), 0) || ':' ||
		       coalesce(string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int), '')
		  FROM idem_outbox_next('r', 'orders', $max)});
}

is(batch_dst(2), '2:3,4', 'restored: the batch not acknowledged comes again');
$dst->safe_psql('dst', q{SELECT idem_outbox_ack('r', 'orders', 2)});
$dst->safe_psql('dst', q{
	SELECT idem_publish('orders', jsonb_build_object('n', i), 'k' || (i % 2))
	  FROM generate_series(7, 9) AS i});
my @got;
for (1 .. 10)
{
	my ($b, $list) = split /:/, batch_dst(2), 2;
	last if $b == 0;
	push @got, split /,/, $list;
	$dst->safe_psql('dst', "SELECT idem_outbox_ack('r', 'orders', $b)");
}
is(join(',', @got), '5,6,7,8,9',
	'restored: the unread events, then those published after the restore, each once, in order');
is($dst->safe_psql('dst', q{SELECT lag_events FROM idem_outbox_relays()}), '0', 'no lag left');

# a new relay on the restored database reads everything kept
is($dst->safe_psql('dst', q{
	SELECT string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int)
	  FROM idem_outbox_next('new', 'orders', 100)}), '1,2,3,4,5,6,7,8,9',
	'restored: a new relay reads every kept event');

# maintenance gives the events table its dependency back: DROP EXTENSION
# takes it
$dst->safe_psql('dst', 'SELECT idem_maintain()');
$dst->safe_psql('dst', 'DROP EXTENSION idempotency');
is($dst->safe_psql('dst', q{SELECT count(*) FROM pg_class WHERE relname LIKE 'outbox%'}), '0',
	'DROP EXTENSION takes the restored events table and its segments');

$src->stop;
$dst->stop;
done_testing();
