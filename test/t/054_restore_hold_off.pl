
# test/t/054_restore_hold_off.pl -- only a superuser's restore holds the
# background worker off a database, and idempotency.stats says why.
#
# The worker leaves a database alone while pg_restore restores it, and
# knows pg_restore by the name its sessions give themselves.  A name is
# easy to give:
#   1. the owner of database "app" (not a superuser) names every session
#      that sends no name of its own "pg_restore" (ALTER DATABASE app SET
#      application_name); a superuser's client that sends none (here a bare
#      protocol client, as some drivers are) is then named so, runs
#      statements and stays connected, and so does the owner's own session,
#      which sends the name itself: maintenance goes on in "app" every
#      round (on d73753a the worker skipped the database for as long as
#      the superuser's session stayed).  Taking the setting back (RESET)
#      while such a session stays changes nothing: its name was still not
#      its own;
#   2. a superuser's session that sent application_name = pg_restore when
#      it connected, as pg_restore does, holds maintenance off, and
#      idempotency.stats.maintenance_held_off names it; once it is gone,
#      the next round runs and the column is NULL again.
# Every wait polls for a condition.

use strict;
use warnings;

use IO::Socket::UNIX;
use Socket qw(SOCK_STREAM);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('restore');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
log_min_messages = warning
});
$node->start;
my $superuser = $node->safe_psql('postgres', 'SELECT current_user');
$node->safe_psql('postgres', q{
	CREATE ROLE owner LOGIN;
	CREATE DATABASE app OWNER owner;
});
$node->safe_psql('app', 'CREATE EXTENSION idempotency');

sub runs
{
	return $node->safe_psql('app',
		q{SELECT coalesce(max(maintenance_runs), 0) FROM idempotency.stats WHERE datname = 'app'});
}

# maintenance runs in "app" at least "n" more times
sub rounds_go_on
{
	my ($n) = @_;
	my $from = runs();
	return $node->poll_query_until('app', qq{
		SELECT maintenance_runs >= $from + $n
		  FROM idempotency.stats WHERE datname = 'app'});
}

ok(rounds_go_on(1), 'the worker maintains the database');

# A client that sends no application_name: the protocol's startup message
# with a user and a database only (every libpq program sends a name of its
# own, psql and pg_restore included).  Trust authentication, as the test
# cluster has on its socket.
sub read_bytes
{
	my ($sock, $n) = @_;
	my $buf = '';
	while (length($buf) < $n)
	{
		my $got = sysread($sock, $buf, $n - length($buf), length($buf));
		die "reading from the server: " . ($got // $!) unless $got;
	}
	return $buf;
}

# reads messages up to ReadyForQuery; dies on an ErrorResponse
sub read_until_ready
{
	my ($sock) = @_;
	while (1)
	{
		my ($type, $len) = unpack('a N', read_bytes($sock, 5));
		my $body = read_bytes($sock, $len - 4);
		die "the server answered with an error: $body" if $type eq 'E';
		return if $type eq 'Z';
	}
}

sub bare_connect
{
	my ($db, $user) = @_;
	my $sock = IO::Socket::UNIX->new(
		Type => SOCK_STREAM,
		Peer => $node->host . '/.s.PGSQL.' . $node->port)
	  or die "connecting to the server's socket: $!";
	my $body = pack('N', 196608) . "user\0$user\0database\0$db\0\0";
	syswrite($sock, pack('N', 4 + length($body)) . $body) or die "write: $!";
	read_until_ready($sock);
	return $sock;
}

sub bare_query
{
	my ($sock, $sql) = @_;
	my $body = "$sql\0";
	syswrite($sock, 'Q' . pack('N', 4 + length($body)) . $body) or die "write: $!";
	read_until_ready($sock);
}

# ---------------------------------------------------------------- 1
my ($rc, $out, $err) = $node->psql('app',
	q{ALTER DATABASE app SET application_name = 'pg_restore'},
	extra_params => [ '-U', 'owner' ]);
is($rc, 0, 'the owner names every session of its database "pg_restore"');

my $bare = bare_connect('app', $superuser);
# (pg_restore's first statements are SETs too)
bare_query($bare, 'SET statement_timeout = 0');
bare_query($bare, 'CREATE TEMP TABLE scratch (x int)');
is($node->safe_psql('app', q{
	SELECT count(*) FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid
	 WHERE a.datname = 'app' AND a.application_name = 'pg_restore' AND r.rolsuper
	   AND a.pid <> pg_backend_pid()}),
	'1', 'a superuser\'s session that sent no name is named "pg_restore" by the owner\'s setting');

my $owner_session;
{
	local $ENV{PGAPPNAME} = 'pg_restore';
	$owner_session = $node->background_psql('app', extra_params => [ '-U', 'owner' ]);
}
$owner_session->query_safe('SET statement_timeout = 0');
is($node->safe_psql('app', q{
	SELECT count(*) FROM pg_stat_activity
	 WHERE datname = 'app' AND application_name = 'pg_restore' AND usename = 'owner'}),
	'1', 'the owner\'s own session sent the name itself');

ok(rounds_go_on(3), 'maintenance goes on in the database, round after round');
is($node->safe_psql('app', q{
	SELECT coalesce(maintenance_held_off, 'none') FROM idempotency.stats WHERE datname = 'app'}),
	'none', 'and the statistics say nothing held it off');

$node->psql('app', q{ALTER DATABASE app RESET application_name},
	extra_params => [ '-U', 'owner' ]);
bare_query($bare, 'SET lock_timeout = 0');
ok(rounds_go_on(3), 'and after the owner takes its setting back, while the sessions it named stay');

close($bare);
$owner_session->quit;

# ---------------------------------------------------------------- 2
my $restore;
{
	local $ENV{PGAPPNAME} = 'pg_restore';
	$restore = $node->background_psql('app');
}
$restore->query_safe('SET statement_timeout = 0');
my $pid = $restore->query_safe('SELECT pg_backend_pid()');
$pid =~ s/\s+//g;
ok($node->poll_query_until('app', qq{
	SELECT maintenance_held_off = 'pg_restore is connected (process $pid, role $superuser)'
	  FROM idempotency.stats WHERE datname = 'app'}),
	'a superuser\'s pg_restore holds maintenance off, and the statistics name it');
$restore->quit;
ok(rounds_go_on(1), 'once it is gone, maintenance runs again');
is($node->safe_psql('app', q{
	SELECT coalesce(maintenance_held_off, 'none') FROM idempotency.stats WHERE datname = 'app'}),
	'none', 'and the statistics say nothing holds it off');

$node->stop;
done_testing();
