
# test/t/051_default_privileges.pl -- default privileges never open the
# storage: the ledger tables are granted to nobody but their owner, and
# every member of the extension has exactly the privileges a fresh install
# in a plain database has.
#
# A common DBA setup gives a reporting role SELECT on everything the
# extension's owner makes (ALTER DEFAULT PRIVILEGES FOR ROLE ... GRANT
# SELECT ON TABLES), and pg_monitor.  On 0.3.0 that role then read every
# role's stored responses, fingerprints and digests from the ledger
# partitions, and default privileges on functions and schemas let it call
# export_keys() / import_key() and create tables in schema idempotency.
# Here, in a database with such default privileges:
#   1. a fresh install: the reporting role reads no ledger table, calls no
#      administrative function, creates nothing in the schema, and still
#      reads the monitoring views; the members' privileges are those of a
#      plain database, object for object;
#   2. an update from 0.3.0 whose ledgers were granted that way takes the
#      grants back, and gives the members the same privileges;
#   3. a pg_restore into a database whose restoring role has such default
#      privileges: the next maintenance round takes them back.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('defprivs');
$node->init;
$node->append_conf('postgresql.conf', q{
idempotency.partition_interval = 3600
log_min_messages = warning
});
$node->start;

my $superuser = $node->safe_psql('postgres', 'SELECT current_user');

$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE ROLE reporting LOGIN;
	GRANT pg_monitor TO reporting;
	CREATE DATABASE plain;
	CREATE DATABASE fresh;
	CREATE DATABASE updated;
});

# the DBA's default privileges, in the databases under test: everything the
# extension's owner (the superuser) makes is readable, callable, usable
my $defaults = qq{
	ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" GRANT SELECT ON TABLES TO reporting;
	ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" GRANT EXECUTE ON FUNCTIONS TO reporting;
	ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" GRANT USAGE, CREATE ON SCHEMAS TO reporting;
	ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" GRANT USAGE ON TYPES TO reporting;
	ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" IN SCHEMA public GRANT SELECT ON TABLES TO reporting;
};

# some of every kind of row: a completed key with its response, a two-phase
# claim, consumed messages; and partitions made by idem_maintain()
my $workload = q{
	SET ROLE app;
	BEGIN;
	SELECT status FROM idem_claim('order-1', '{"amount": 10}');
	SELECT idem_complete('order-1', 201, '{"card": "4242", "secret": "s3cr3t"}');
	COMMIT;
	SELECT status FROM idem_claim('order-2', '{"amount": 20}', lease => '1 hour');
	SELECT idem_consume_message('billing', 'm1');
	SELECT count(*) FROM idem_consume_messages('billing', ARRAY['m2', 'm3']);
	RESET ROLE;
	SELECT idem_maintain();
};

# what the reporting role can reach in a database
sub reach
{
	my ($db) = @_;
	return $node->safe_psql($db, q{
		SET ROLE reporting;
		SELECT format('%s ledger tables readable, %s admin functions callable, create in schema: %s, views: %s',
		  (SELECT count(*) FROM pg_class c
		    WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
		      AND has_table_privilege(c.oid, 'SELECT')),
		  (SELECT count(*) FROM pg_proc p
		    WHERE p.proname IN ('idem_maintain', 'stats_reset', 'relocate_lanes', 'export_keys',
		                        'import_key', 'export_messages', 'import_message')
		      AND has_function_privilege(p.oid, 'EXECUTE')),
		  has_schema_privilege('idempotency', 'CREATE'),
		  has_table_privilege('idempotency.partitions', 'SELECT')
		    AND has_table_privilege('idempotency.stats', 'SELECT'))});
}

# the privileges of every member of the extension, and of the schema, as
# (grantee, privilege) pairs (a NULL ACL is its object kind's default)
my $member_acls = q{
WITH m (kind, name, acl, owner) AS (
  SELECT 'f', p.oid::regprocedure::text, p.proacl, p.proowner
    FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
   WHERE d.classid = 'pg_proc'::regclass AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  UNION ALL
  SELECT 'r', c.oid::regclass::text, c.relacl, c.relowner
    FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
   WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  UNION ALL
  SELECT 'T', t.oid::regtype::text, t.typacl, t.typowner
    FROM pg_depend d JOIN pg_type t ON t.oid = d.objid
   WHERE d.classid = 'pg_type'::regclass AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  UNION ALL
  SELECT 'n', nspname::text, nspacl, nspowner FROM pg_namespace WHERE nspname = 'idempotency')
SELECT string_agg(format('%s %s: %s %s%s', kind, name,
                         CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
                         a.privilege_type, CASE WHEN a.is_grantable THEN ' with grant option' ELSE '' END),
                  E'\n' ORDER BY kind, name, a.grantee::regrole::text, a.privilege_type)
  FROM m, aclexplode(coalesce(m.acl, acldefault(m.kind::"char", m.owner))) AS a};

# ---------------------------------------------------------------- 1. fresh
$node->safe_psql('plain', 'CREATE EXTENSION idempotency');
$node->safe_psql('plain', $workload);
$node->safe_psql('fresh', $defaults);
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('fresh', $workload);

cmp_ok($node->safe_psql('fresh',
		q{SELECT count(*) FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace AND relkind IN ('r', 'p')}),
	'>=', 4, 'the ledgers and their partitions are there');
is(reach('fresh'),
	'0 ledger tables readable, 0 admin functions callable, create in schema: f, views: t',
	'fresh install: the reporting role reads no ledger, calls no admin function, creates nothing; it reads the views');
my ($ret, $out, $err) = $node->psql('fresh', q{
	SET ROLE reporting;
	SELECT response_body FROM idempotency.keys});
like($err, qr/permission denied for table keys/, 'reading the stored responses is refused');
($ret, $out, $err) = $node->psql('fresh', q{
	SET ROLE reporting;
	SELECT count(*) FROM idempotency.export_keys()});
like($err, qr/permission denied for function export_keys/, 'exporting every role\'s keys is refused');
is($node->safe_psql('fresh', $member_acls), $node->safe_psql('plain', $member_acls),
	'every member has the privileges of a fresh install in a plain database');

# ---------------------------------------------------------------- 2. update
$node->safe_psql('updated', $defaults);
$node->safe_psql('updated', q{CREATE EXTENSION idempotency VERSION '0.3.0'});
$node->safe_psql('updated', $workload);
# what 0.3.0 itself did to the ledgers it made under those defaults
$node->safe_psql('updated', q{GRANT SELECT ON ALL TABLES IN SCHEMA idempotency TO reporting});
like(reach('updated'), qr/^[1-9]\d* ledger tables readable, [1-9]\d* admin functions callable, create in schema: t/,
	'on 0.3.0 under those defaults, the reporting role reads the ledgers and calls admin functions');
$node->safe_psql('updated', 'ALTER EXTENSION idempotency UPDATE');
is(reach('updated'),
	'0 ledger tables readable, 0 admin functions callable, create in schema: f, views: t',
	'the update takes it all back');
is($node->safe_psql('updated', $member_acls), $node->safe_psql('plain', $member_acls),
	'the updated members have the privileges of a fresh install');

# what a DBA granted or revoked on purpose stays as it was
$node->safe_psql('postgres', q{CREATE DATABASE deliberate; CREATE ROLE maint; CREATE ROLE mover;});
$node->safe_psql('deliberate', $defaults);
$node->safe_psql('deliberate', q{CREATE EXTENSION idempotency VERSION '0.3.0'});
$node->safe_psql('deliberate', q{
	GRANT EXECUTE ON FUNCTION idem_maintain() TO maint;
	GRANT EXECUTE ON FUNCTION idempotency.export_keys(text[]) TO mover;
	REVOKE EXECUTE ON FUNCTION idem_claim(text, jsonb, text, interval, interval, boolean) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION idem_claim(text, jsonb, text, interval, interval, boolean) TO app;
});
$node->safe_psql('deliberate', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('deliberate', q{
	SELECT format('maint: %s, mover: %s, app: %s, public: %s, reporting: %s',
	  has_function_privilege('maint', 'idem_maintain()', 'EXECUTE'),
	  has_function_privilege('mover', 'idempotency.export_keys(text[])', 'EXECUTE'),
	  has_function_privilege('app', 'idem_claim(text, jsonb, text, interval, interval, boolean, boolean)', 'EXECUTE'),
	  has_function_privilege('public', 'idem_claim(text, jsonb, text, interval, interval, boolean, boolean)', 'EXECUTE'),
	  has_function_privilege('reporting', 'idempotency.export_keys(text[])', 'EXECUTE'))}),
	'maint: t, mover: t, app: t, public: f, reporting: f',
	'the update keeps what was granted or revoked on purpose, and takes back what default privileges gave (0.4.0 makes idem_claim() anew: it gets the privileges of the one it replaces)');

# default privileges that take EXECUTE from PUBLIC: the functions 0.4.0
# adds get, on an update, what a fresh install under them gets
$node->safe_psql('postgres', q{CREATE DATABASE closed_fresh; CREATE DATABASE closed_updated;});
for my $db ('closed_fresh', 'closed_updated')
{
	$node->safe_psql($db,
		qq{ALTER DEFAULT PRIVILEGES FOR ROLE "$superuser" REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC});
}
$node->safe_psql('closed_fresh', 'CREATE EXTENSION idempotency');
$node->safe_psql('closed_updated', q{CREATE EXTENSION idempotency VERSION '0.3.1'});
$node->safe_psql('closed_updated', 'ALTER EXTENSION idempotency UPDATE');
my $new_acls = q{
	SELECT string_agg(p.oid::regprocedure::text || ' ' || coalesce(p.proacl::text, 'default'), E'\n' ORDER BY p.oid::regprocedure::text)
	  FROM pg_proc p
	 WHERE p.proname IN ('idem_recover', 'idem_assign', 'idem_advance', 'idem_positions', 'idem_sequence')};
is($node->safe_psql('closed_updated', $new_acls), $node->safe_psql('closed_fresh', $new_acls),
	'under default privileges that take EXECUTE from PUBLIC, the update gives the new functions what a fresh install does');

# maintenance takes back any grant that came later
$node->safe_psql('updated', q{GRANT SELECT ON ALL TABLES IN SCHEMA idempotency TO reporting});
$node->safe_psql('updated', 'SELECT idem_maintain()');
like(reach('updated'), qr/^0 ledger tables readable/, 'and maintenance takes back a later grant');

# ---------------------------------------------------------------- 3. restore
my $dump = $node->basedir . '/fresh.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, $node->connstr('fresh') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->safe_psql('restored', $defaults);
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a database with those default privileges');
$node->safe_psql('restored', 'SELECT idem_maintain()');
is(reach('restored'),
	'0 ledger tables readable, 0 admin functions callable, create in schema: f, views: t',
	'after the first maintenance round, the restored ledgers are granted to nobody');
is($node->safe_psql('restored', q{SET ROLE app; SELECT status || ' ' || response_code FROM idem_claim('order-1', '{"amount": 10}')}),
	'completed 201', 'and the restored key still replays');

$node->stop;
done_testing();
