
# test/t/023_pgbouncer.pl -- the torture workload through PgBouncer in
# transaction pooling mode.
#
# The workload and invariants of test/t/022_torture.pl (see its header and
# Torture::run_torture), for TORTURE_SECONDS (default 30), with the eight
# pgbench clients connected to PgBouncer (/usr/sbin/pgbouncer, pool_mode =
# transaction, default_pool_size = 4): consecutive transactions of one
# client run on different server connections, and one server connection
# serves many clients, so nothing may depend on session state (a two-phase
# client's phase two in particular runs wherever the pooler puts it).
# Maintenance is the background worker's alone (naptime 1 s).  Also checked:
# the business rows were written by at most four server backends.
#
# PgBouncer listens on a unix socket in a private directory, with
# auth_type = trust; it runs in the foreground under IPC::Run and is stopped
# at the end, pass or fail.  Skipped if PgBouncer is not installed.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

# What a transaction-pooling pooler does to the calls does not depend on
# the server's major or build: test/run-all.sh runs this test with one
# server (IDEM_SERVER_SPECIFIC_ONLY=1 for the others, see test/run-suites.sh).
plan skip_all => 'the same with every server; another run of this command makes it (IDEM_SERVER_SPECIFIC_ONLY=1)'
  if ($ENV{IDEM_SERVER_SPECIFIC_ONLY} // '') eq '1';

my $pgbouncer = $ENV{PGBOUNCER} || '/usr/sbin/pgbouncer';
plan skip_all => "PgBouncer not found at $pgbouncer" unless -x $pgbouncer;

my $seconds   = $ENV{TORTURE_SECONDS} || 30;
my $pool_size = 4;

my $node = PostgreSQL::Test::Cluster->new('pgbouncer');
$node->init;
$node->append_conf('postgresql.conf', torture_conf());
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE torture');
create_business_schema($node, 'torture');

# ---------------------------------------------------------------- PgBouncer
my $user    = getpwuid($<);
my $sockdir = PostgreSQL::Test::Utils::tempdir_short;
my $bdir    = PostgreSQL::Test::Utils::tempdir;
my $bport   = PostgreSQL::Test::Cluster::get_free_port();
my $host    = $node->host;
my $port    = $node->port;

append_to_file("$bdir/userlist.txt", qq{"$user" ""\n});
append_to_file(
	"$bdir/pgbouncer.ini", qq{
[databases]
torture = host=$host port=$port dbname=torture

[pgbouncer]
listen_addr =
listen_port = $bport
unix_socket_dir = $sockdir
auth_type = trust
auth_file = $bdir/userlist.txt
admin_users = $user
pool_mode = transaction
default_pool_size = $pool_size
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
logfile = $bdir/pgbouncer.log
pidfile = $bdir/pgbouncer.pid
});

my ($bout, $berr) = ('', '');
my $bouncer = IPC::Run::start([ $pgbouncer, "$bdir/pgbouncer.ini" ],
	'<', \undef, '>', \$bout, '2>', \$berr);

# stop PgBouncer however the test ends
END
{
	if ($bouncer)
	{
		$bouncer->signal('TERM');
		eval { $bouncer->finish; 1 } or $bouncer->kill_kill;
	}
}

my @via_bouncer = ('-h', $sockdir, '-p', $bport);
ok( poll_until(
		'PgBouncer accepts connections',
		sub {
			my $out = '';
			IPC::Run::run([ 'psql', '-XAtq', @via_bouncer, '-d', 'torture', '-c', 'SELECT 1' ],
				'<', \undef, '>', \$out, '2>', \my $err);
			return $out eq "1\n";
		}),
	'PgBouncer accepts connections')
  or diag("pgbouncer stdout:\n$bout\nstderr:\n$berr\nlog:\n"
	  . (-e "$bdir/pgbouncer.log" ? slurp_file("$bdir/pgbouncer.log") : ''));

# ---------------------------------------------------------------- torture
run_torture(
	$node,
	db      => 'torture',
	label   => 'through PgBouncer',
	seconds => $seconds,
	connect => \@via_bouncer);

my ($charge_backends, $effect_backends) = split /\|/,
  $node->safe_psql('torture',
	q{SELECT (SELECT count(DISTINCT backend) FROM charges), (SELECT count(DISTINCT backend) FROM effects)});
ok( $charge_backends <= $pool_size && $effect_backends <= $pool_size,
	"eight clients shared at most $pool_size server connections "
	  . "(charges written by $charge_backends backends, effects by $effect_backends)");

# ---------------------------------------------------------------- stop
$bouncer->signal('INT');
ok(eval { $bouncer->finish; 1 }, 'PgBouncer stops on SIGINT')
  or $bouncer->kill_kill;
$bouncer = undef;

$node->stop;
done_testing();
