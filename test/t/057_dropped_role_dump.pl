
# test/t/057_dropped_role_dump.pl -- a dump carries no row of a dropped role.
#
# The stream positions, producer sequences, outbox relays and dead letters
# are keyed by the role's OID (regrole) and carried by pg_dump
# (pg_extension_config_dump).  Maintenance deletes those of a role that no
# longer exists at its next run (doc/security.md, "Dropped roles"); until
# then, pg_dump would write them under the role's bare OID (regrole's
# output for an OID no role has), and a restore would load them under that
# OID, which in the restoring cluster may be another role's: that role would
# start its streams and relays from them and read the dead letters' copies
# of the events.  Each table's dump condition leaves them out.  Here a role
# is dropped with one row in each table, maintenance not run, and the dump
# (plain, and custom through pg_restore) carries the rows of the role that
# exists and none of the dropped one's.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dropped_role_dump');
$node->init;
$node->start;

my $tmp = PostgreSQL::Test::Utils::tempdir;

$node->safe_psql('postgres',
	'CREATE ROLE idem_tap_live; CREATE ROLE idem_tap_gone; CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION idempotency');

# one position, sequence, relay and dead letter of each role
foreach my $role ('idem_tap_live', 'idem_tap_gone')
{
	$node->safe_psql(
		'src', qq{
SET ROLE $role;
SELECT first_offset FROM idem_advance('c', 'orders', 0, 0, 9);
SELECT idem_sequence('c', 'producer', 1, 1);
SELECT idem_publish('t', jsonb_build_object('secret', '$role'));});
	$node->safe_psql(
		'src', qq{
SET ROLE $role;
SELECT idem_outbox_dead_letter('r', 't', n.event_id, 'HTTP 500')
  FROM idem_outbox_next('r', 't') AS n;});
}

my $gone_oid = $node->safe_psql('src',
	q{SELECT oid FROM pg_roles WHERE rolname = 'idem_tap_gone'});
$node->safe_psql('postgres', 'DROP ROLE idem_tap_gone');

# rows per table and role ('gone' for a role that no longer exists)
my $rows_sql = q{
SELECT string_agg(format('%s %s %s', t, coalesce(r.rolname, 'gone'), n), E'\n' ORDER BY t, coalesce(r.rolname, 'gone'))
  FROM (SELECT 'positions' AS t, role::oid AS o, count(*) AS n FROM idempotency.positions GROUP BY 2
        UNION ALL SELECT 'sequences', role::oid, count(*) FROM idempotency.sequences GROUP BY 2
        UNION ALL SELECT 'relays', role::oid, count(*) FROM idempotency.outbox_relays GROUP BY 2
        UNION ALL SELECT 'dead_letters', role::oid, count(*) FROM idempotency.outbox_dead_letters GROUP BY 2) AS x
  LEFT JOIN pg_roles AS r ON r.oid = x.o};

is( $node->safe_psql('src', $rows_sql),
	join("\n",
		'dead_letters gone 1', 'dead_letters idem_tap_live 1',
		'positions gone 1',    'positions idem_tap_live 1',
		'relays gone 1',       'relays idem_tap_live 1',
		'sequences gone 1',    'sequences idem_tap_live 1'),
	'src: the dropped role\'s rows are still there (maintenance not run)');

my $want = join("\n",
	'dead_letters idem_tap_live 1',
	'positions idem_tap_live 1',
	'relays idem_tap_live 1',
	'sequences idem_tap_live 1');

# plain format: no COPY row names the dropped role's OID
my $plain = "$tmp/src.sql";
$node->command_ok([ 'pg_dump', '-f', $plain, '-d', $node->connstr('src') ],
	'pg_dump of src');
my $text = slurp_file($plain);
my @gone_rows = grep { /^$gone_oid\t/ } split /\n/, $text;
is(scalar(@gone_rows), 0, 'the plain dump has no row of the dropped role')
  or diag(join("\n", @gone_rows));
like($text, qr/^idem_tap_live\tc\torders\t0\t10\t/m,
	'... and has the position of the role that exists');

$node->safe_psql('postgres', 'CREATE DATABASE dst_plain');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $plain, '-d', $node->connstr('dst_plain') ],
	'the plain dump restores');
is($node->safe_psql('dst_plain', $rows_sql), $want,
	'dst_plain: the rows of the role that exists, none of the dropped one');

# custom format through pg_restore
my $custom = "$tmp/src.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $custom, '-d', $node->connstr('src') ],
	'pg_dump -Fc of src');
$node->safe_psql('postgres', 'CREATE DATABASE dst_custom');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst_custom'), $custom ],
	'pg_restore into dst_custom');
is($node->safe_psql('dst_custom', $rows_sql), $want,
	'dst_custom: the rows of the role that exists, none of the dropped one');

# the restored role goes on from its own position
is( $node->safe_psql(
		'dst_custom',
		q{SET ROLE idem_tap_live; SELECT next_offset FROM idem_positions('c', 'orders')}),
	'10',
	'dst_custom: the role that exists goes on from its position');

$node->stop;
done_testing();
