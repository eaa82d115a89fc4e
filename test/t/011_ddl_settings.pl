
# test/t/011_ddl_settings.pl -- a caller's settings cannot redirect the
# partition DDL a call makes on its behalf.
#
# A call whose ttl needs a partition that does not exist yet makes it on the
# spot, as the storage owner.  An ordinary role's default_tablespace (a
# tablespace it may not create in) and default_table_access_method must not
# apply to it; nor may the role change the default ttls that size the
# partitions.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('ddl_settings');
$node->init;
$node->start;

my $dir = PostgreSQL::Test::Utils::tempdir;
$node->safe_psql('postgres', qq{
	CREATE TABLESPACE idem_ts LOCATION '$dir';
	CREATE EXTENSION idempotency;
	CREATE ROLE app;
});

# on-the-spot partitions: ttls far beyond what maintenance has made
$node->safe_psql('postgres', q{
	SET ROLE app;
	SET default_tablespace = idem_ts;
	SELECT idem_consume_message('c', 'x', '27 days');
	BEGIN;
	SELECT status FROM idem_claim('k', NULL, ttl => '26 days');
	SELECT idem_complete('k', 200);
	COMMIT;
});
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_class
	 WHERE reltablespace = (SELECT oid FROM pg_tablespace WHERE spcname = 'idem_ts')}),
	'0', "no ledger relation lands in a tablespace the caller named");
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.partitions p JOIN pg_class c ON c.oid = p.partition
	 WHERE p.upper_bound > now() + interval '20 days' AND c.reltablespace = 0}),
	'2', 'the partitions made for those calls are in the default tablespace');

my ($ret, $out, $err) = $node->psql('postgres', q{
	SET ROLE app;
	SET default_table_access_method = no_such_am;
	SELECT idem_consume_message('c', 'y', '28 days');
});
is($ret, 3, 'an access method that does not exist ...') or diag($err);
like($err, qr/access method "no_such_am" does not exist/, '... is refused by SET itself');

($ret, $out, $err) = $node->psql('postgres', q{
	LOAD 'idempotency';
	SET ROLE app;
	SET idempotency.message_ttl = '1 hour';
});
like($err, qr/permission denied to set parameter "idempotency.message_ttl"/,
	'an ordinary role cannot change the default ttl that sizes partitions');

# set before the library is loaded, the value is a placeholder that loading
# the library discards
($ret, $out, $err) = $node->psql('postgres', q{
	SET ROLE app;
	SET idempotency.message_ttl = '1 hour';
	SELECT idem_consume_message('c', 'z', '1 hour');
	SHOW idempotency.message_ttl;
	RESET ROLE;
	SELECT count(DISTINCT lanes) FROM idempotency.partitions WHERE table_name = 'messages';
});
is($out, "t\n7d\n1", '... not even before the library is loaded: one layout, the default ttl')
  or diag($err);
like($err, qr/permission denied to set parameter "idempotency.message_ttl"/,
	'... with a warning');

$node->stop;
done_testing();
