# test/t/041_pg_upgrade.pl -- pg_upgrade from the previous PostgreSQL major.
#
# A cluster of the older major (IDEM_UPGRADE_FROM_BINDIR: its bin
# directory, with this extension built and installed for it, as
# test/run-all.sh does in the PostgreSQL 18 root for 17) holds live keys
# (completed with a response, two-phase in progress with a checkpoint,
# released), consumed messages and partitions about to end
# (test/upgrade/setup.sql).  pg_upgrade moves it to this major, which
# preloads the extension; test/upgrade/verify.sql then finds every answer
# the same: replay byte for byte, fingerprint check, the holder's token,
# duplicates, and maintenance dropping what ended meanwhile.  The
# background worker of the new cluster runs too.
#
# Without an older major installed beside this one there is nothing to
# upgrade from, and the test is skipped (on 15 and 17 here).

use strict;
use warnings;

use File::Basename qw(dirname);
use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_bindir = $ENV{IDEM_UPGRADE_FROM_BINDIR};
plan skip_all => 'no older PostgreSQL major installed beside this one (IDEM_UPGRADE_FROM_BINDIR)'
  unless $old_bindir && -x "$old_bindir/pg_ctl";

my $dir = "$FindBin::RealBin/../upgrade";

my $old = PostgreSQL::Test::Cluster->new('old', install_path => dirname($old_bindir));
my $new = PostgreSQL::Test::Cluster->new('new');
cmp_ok($old->pg_version->major, '<', $new->pg_version->major,
	'the old cluster runs an older major (' . $old->pg_version . ' -> ' . $new->pg_version . ')');

$old->init;
$old->start;
$old->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$old->safe_psql('postgres', slurp_file("$dir/setup.sql"));
my $old_version = $old->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'});

# Debian's PostgreSQL 15.20 and 17.12 store an attribute option "pg_attver"
# on every column of every table, which PostgreSQL 18.6 does not know:
# pg_upgrade between them fails for any database, with or without this
# extension.  test/upgrade/strip_attver.sql takes it out of the old
# cluster's catalogs first, as a user has to (README, "Supported versions").
for my $db (split /\n/, $old->safe_psql('postgres',
		q{SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1}))
{
	my $n = $old->safe_psql($db, slurp_file("$dir/strip_attver.sql"));
	note("pg_attver stripped from $n columns of database $db") if $n;
}
$old->stop;

# PostgreSQL 18's initdb turns data checksums on by default; pg_upgrade
# needs the two clusters to agree, and the old one has none
$new->init(extra => ($new->pg_version >= 18 ? ['--no-data-checksums'] : []));
$new->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
});

my $newbindir = $new->config_data('--bindir');
command_ok(
	[
		"$newbindir/pg_upgrade", '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $old_bindir, '-B', $newbindir,
		'-s', $new->host, '-p', $old->port, '-P', $new->port,
		'--copy'
	],
	'pg_upgrade accepts the ledgers and moves the cluster');

$new->start;
is($new->safe_psql('postgres',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$old_version, 'the extension keeps its version');

my $verify = slurp_file("$dir/verify.sql");
my $checks = () = $verify =~ /SELECT pg_temp\.check\(/g;
my @ok = grep { /^ok: / } split /\n/, $new->safe_psql('postgres', $verify);
note($_) for @ok;
is(scalar(@ok), $checks, "all $checks checks of verify.sql pass on the new major");

ok($new->poll_query_until('postgres',
		q{SELECT maintenance_runs > 0 AND last_maintenance_error IS NULL
		    FROM idempotency.stats WHERE datname = 'postgres'}),
	'the background worker maintains the upgraded database');

$new->stop;
done_testing();
