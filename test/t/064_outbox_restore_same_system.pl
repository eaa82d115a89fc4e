
# test/t/064_outbox_restore_same_system.pl -- the outbox through pg_dump and
# pg_restore into a cluster that shares the source's system identifier but
# whose transaction ids are behind the dumped ones.
#
# Such a cluster is a copy of the source made earlier: a base backup
# restored (a disaster-recovery copy, a staging clone, a point-in-time
# recovery to before the dump; not a promoted standby, whose counter is the
# primary's).  The xid base (outbox_storage.c) used to be raised only when
# its row named another system, so there it stayed: the restored relay's
# snapshots then called every new transaction, whose id is below theirs,
# already relayed, and its events were never returned.  The row is now
# made afresh by the restore's CREATE EXTENSION and checked against the
# restored xids on first use, whatever the system.  The SPEC: "No event of
# a committed transaction is ever skipped".
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/064_outbox_restore_same_system.pl

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = PostgreSQL::Test::Cluster->new('outbox_same_src');
$src->init(allows_streaming => 1);
$src->start;
$src->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$src->safe_psql('postgres', q{SELECT idem_publish('orders', '{"n": 1}')});
is($src->safe_psql('postgres', q{SELECT string_agg(payload->>'n', ',') FROM idem_outbox_next('r', 'orders')}),
	'1', 'source: event 1');
$src->safe_psql('postgres', q{SELECT idem_outbox_ack('r', 'orders', 1)});

# the copy: a base backup of the source as it is now
$src->backup('early');
my $dst = PostgreSQL::Test::Cluster->new('outbox_same_dst');
$dst->init_from_backup($src, 'early');
$dst->start;
is($dst->safe_psql('postgres', 'SELECT system_identifier FROM pg_control_system()'),
	$src->safe_psql('postgres', 'SELECT system_identifier FROM pg_control_system()'),
	'the copy has the source\'s system identifier');

# the source goes on: its transaction ids run ahead of the copy's
$src->safe_psql('postgres', q{
	CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$
	BEGIN
	  FOR i IN 1 .. n LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP;
	END $$;
	CALL burn(3000);
	DROP PROCEDURE burn(int);
});
$src->safe_psql('postgres', q{SELECT idem_publish('orders', '{"n": 2}')});
is($src->safe_psql('postgres', q{SELECT string_agg(payload->>'n', ',') FROM idem_outbox_next('r', 'orders')}),
	'2', 'source: event 2');
$src->safe_psql('postgres', q{SELECT idem_outbox_ack('r', 'orders', 2)});

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $dump = "$tmp/outbox.dump";
$src->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('postgres') ],
	'pg_dump of the source');
$dst->safe_psql('postgres', 'CREATE DATABASE restored');
$dst->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $dst->connstr('restored'), $dump ],
	'pg_restore into the copy');
cmp_ok(
	$dst->safe_psql('restored', 'SELECT pg_current_xact_id()::text::bigint'), '<',
	$src->safe_psql('postgres', 'SELECT pg_current_xact_id()::text::bigint'),
	'the copy\'s transaction ids are behind the source\'s');

# published after the restore, committed: the relay must return it
$dst->safe_psql('restored', q{SELECT idem_publish('orders', '{"n": 3}')});
my @got;
for (1 .. 3)
{
	my ($b, $list) = split /:/, $dst->safe_psql('restored', q{
		SELECT coalesce(max(batch), 0) || ':' || coalesce(string_agg(payload->>'n', ','), '')
		  FROM idem_outbox_next('r', 'orders')}), 2;
	last if $b == 0;
	push @got, split /,/, $list;
	$dst->safe_psql('restored', "SELECT idem_outbox_ack('r', 'orders', $b)");
}
is(join(',', @got), '3', 'restored into a copy: the event published after the restore is relayed');

$src->stop;
$dst->stop;
done_testing();
