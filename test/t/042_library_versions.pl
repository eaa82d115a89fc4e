
# test/t/042_library_versions.pl -- a session never runs its library
# against a newer version of the extension.
#
# A session keeps the library it loaded until it ends: after a release's
# files are installed and ALTER EXTENSION idempotency UPDATE is run in one
# session, the others (a pool's connections) still run the old code
# against the new SQL objects.  From 0.3.1 on, every function of the
# library first compares the extension's version (pg_extension.extversion)
# with its own and refuses if the extension is newer.  Here the update of a
# later release is stood for by setting extversion, which is what ALTER
# EXTENSION UPDATE changes: a session that has already used the library is
# refused at its next call, not one call later; a new session is refused
# too until the newer library is installed; an extension older than the
# library (a database not updated yet) works.  Without preloading, where
# every session loads the library itself.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('versions');
$node->init;
$node->append_conf('postgresql.conf', 'log_min_messages = warning');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $version = $node->safe_psql('postgres',
	q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'});

my $old = $node->background_psql('postgres', on_error_stop => 0);
is($old->query_safe(q{SELECT status FROM idem_claim('k1', lease => '1 hour')}), 'claimed',
	'a session uses the library');

# what ALTER EXTENSION UPDATE to a later release commits
$node->safe_psql('postgres',
	q{UPDATE pg_extension SET extversion = '99.0.0' WHERE extname = 'idempotency'});

foreach my $call (
	q{SELECT status FROM idem_claim('k2', lease => '1 hour')},
	q{SELECT idem_consume_message('c', 'm1')},
	q{SELECT count(*) FROM idem_lookup('k1')},
	q{SELECT idem_release('k1', token => 1)})
{
	my ($out, $failed) = $old->query($call);
	like($old->{stderr},
		qr/ERROR:  the idempotency library loaded by this session is older than the extension\n.*library version \Q$version\E; the extension in this database is version 99\.0\.0/s,
		"its next call is refused: $call");
	$old->{stderr} = '';
}
my ($ret, $out, $err) = $node->psql('postgres', q{SELECT idem_consume_message('c', 'm2')});
like($err, qr/older than the extension/, 'a new session loads the same library, and is refused too');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys}), '1',
	'nothing was written meanwhile');

# a database not updated yet: the library is newer than its extension
$node->safe_psql('postgres',
	q{UPDATE pg_extension SET extversion = '0.3.0' WHERE extname = 'idempotency'});
is($old->query_safe(q{SELECT idem_consume_message('c', 'm3')}), 't',
	'an extension older than the library works');
$node->safe_psql('postgres',
	qq{UPDATE pg_extension SET extversion = '$version' WHERE extname = 'idempotency'});
is($old->query_safe(q{SELECT status FROM idem_claim('k2', lease => '1 hour')}), 'claimed',
	'and so does the library\'s own version');
$old->quit;

$node->stop;
done_testing();
