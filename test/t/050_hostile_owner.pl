
# test/t/050_hostile_owner.pl -- a database owner who is not a superuser
# cannot make the extension's privileged work do anything else.
#
# The background worker and the partition makers connect to the database
# as the bootstrap superuser, and PostgreSQL applies the database's own
# settings (ALTER DATABASE ... SET, chosen by its owner) to them.  Here the
# owner of database "db" (role "owner", not a superuser):
#   - puts a schema "evil" first on the database's search_path, with
#     look-alike operators for every type the extension's SQL could compare
#     (text, name, oid, regclass, int2, int4, int8, bool, "char", uuid,
#     timestamptz, interval), look-alike functions and look-alike types,
#     each of which, if ever run with privilege, makes "owner" a superuser
#     and counts its call in a sequence;
#   - sets, one at a time, every other database-level setting that could
#     change what privileged SQL does (dates, time zone, timeouts, read-only
#     and serializable transactions, tablespaces, access method, the role,
#     quoting), and then all of them at once.
# Under each, maintenance keeps running (rounds succeed, partitions are made
# and dropped, where and how the extension decides), a partition maker
# makes a far partition for an ordinary role's call, idem_maintain() and
# ALTER EXTENSION UPDATE run by a superuser in that database run, and
# "owner" never becomes a superuser: no look-alike is ever called.  With
# idempotency.key_memory on (0.5.0), the worker drops an ordinary role's
# expired key and id into the memory under all the settings at once.
#
# On 0.3.0 "owner" became a superuser within one naptime.  Every wait polls
# for a condition.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('hostile');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
idempotency.key_memory = 3
log_min_messages = warning
});
$node->start;

my $tsdir = $node->basedir . '/owner_space';
mkdir $tsdir or die "mkdir $tsdir: $!";

# what the test itself runs in "db" is never read through the owner's
# settings: a client's connection options outrank the database's
my $superuser = $node->safe_psql('postgres', 'SELECT current_user');
$ENV{PGOPTIONS} = join ' ', map { "-c $_" } (
	'search_path=pg_catalog,pg_temp', 'default_transaction_read_only=off',
	'statement_timeout=0', 'lock_timeout=0', 'idle_in_transaction_session_timeout=0',
	'DateStyle=ISO,MDY', 'TimeZone=UTC', 'default_tablespace=', 'role=none',
	"session_authorization=$superuser", 'local_preload_libraries=');

sub q_db
{
	my ($sql) = @_;
	return $node->safe_psql('db', $sql);
}

# the owner's own commands, through its own connection
sub as_owner
{
	my ($sql) = @_;
	return $node->psql('db', "SET ROLE owner; $sql");
}

$node->safe_psql('postgres', qq{
	CREATE ROLE owner LOGIN;
	CREATE ROLE app LOGIN;
	CREATE DATABASE db OWNER owner;
	CREATE TABLESPACE owner_space OWNER owner LOCATION '$tsdir';
});
# a second table access method only a superuser could make; the owner may
# still choose it as the database's default
$node->safe_psql('db',
	q{CREATE ACCESS METHOD heap2 TYPE TABLE HANDLER heap_tableam_handler});

# ---------------------------------------------------------------- the traps
is((as_owner(q{
CREATE SCHEMA evil;
CREATE SEQUENCE evil.calls;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
GRANT USAGE, UPDATE ON SEQUENCE evil.calls TO PUBLIC;
CREATE FUNCTION evil.sprung() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_catalog.nextval('evil.calls');
	BEGIN
		EXECUTE 'ALTER ROLE owner SUPERUSER';
	EXCEPTION WHEN OTHERS THEN
		NULL;
	END;
END$$;
DO $make$
DECLARE
	t text;
	op text;
	fn text;
BEGIN
	FOREACH t IN ARRAY ARRAY['text', 'name', 'oid', 'regclass', 'int2', 'int4', 'int8',
	                         'bool', '"char"', 'uuid', 'timestamptz', 'interval']
	LOOP
		FOREACH op IN ARRAY ARRAY['=', '<>', '<', '<=', '>', '>=']
		LOOP
			fn := pg_catalog.format('evil."cmp_%s_%s"', pg_catalog.md5(t), pg_catalog.md5(op));
			EXECUTE pg_catalog.format(
				'CREATE FUNCTION %s(a %s, b %s) RETURNS bool LANGUAGE plpgsql AS '
				'$f$BEGIN PERFORM evil.sprung(); RETURN a OPERATOR(pg_catalog.%s) b; END$f$',
				fn, t, t, op);
			EXECUTE pg_catalog.format(
				'CREATE OPERATOR evil.%s (leftarg = %s, rightarg = %s, function = %s)',
				op, t, t, fn);
		END LOOP;
	END LOOP;
END
$make$;
-- look-alike functions: what catalog queries and DDL could call by name
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN pg_catalog.now(); END$$;
CREATE FUNCTION evil.current_database() RETURNS name LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN pg_catalog.current_database(); END$$;
CREATE FUNCTION evil.quote_ident(text) RETURNS text LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN pg_catalog.quote_ident($1); END$$;
CREATE FUNCTION evil.pg_get_userbyid(oid) RETURNS name LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN pg_catalog.pg_get_userbyid($1); END$$;
CREATE FUNCTION evil.lower(text) RETURNS text LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN pg_catalog.lower($1); END$$;
CREATE FUNCTION evil.int2(integer) RETURNS int2 LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN $1::pg_catalog.int2; END$$;
CREATE FUNCTION evil.timestamptz(text) RETURNS timestamptz LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN $1::pg_catalog.timestamptz; END$$;
CREATE FUNCTION evil.pg_stat_get_activity(integer) RETURNS SETOF record LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN; END$$;
CREATE FUNCTION evil.pg_try_advisory_xact_lock(bigint) RETURNS bool LANGUAGE plpgsql AS
  $$BEGIN PERFORM evil.sprung(); RETURN true; END$$;
-- look-alike types and tables: what DDL and catalog queries name
CREATE DOMAIN evil.uuid AS pg_catalog.text;
CREATE DOMAIN evil.timestamptz AS pg_catalog.text;
CREATE DOMAIN evil.regrole AS pg_catalog.text;
CREATE DOMAIN evil.jsonb AS pg_catalog.text;
CREATE TABLE evil.pg_stat_activity (datid oid, application_name text);
CREATE TABLE evil.pg_class (oid oid, relname name);
ALTER DATABASE db SET search_path = evil, pg_catalog;
}))[0], 0, 'the owner sets its traps');

# the extension, made by a superuser after the traps were set: the worker
# makes the ledgers themselves under them
$node->safe_psql('db', q{CREATE EXTENSION idempotency VERSION '0.3.0'});

sub sprung
{
	return q_db(q{SELECT format('%s %s', (SELECT rolsuper FROM pg_roles WHERE rolname = 'owner'),
	                                    (SELECT is_called FROM evil.calls))});
}

# rounds that succeeded; waits for two more than "after", returns their count
sub wait_rounds
{
	my ($after, $label) = @_;
	my $ok = $node->poll_query_until('db', qq{
		SELECT maintenance_runs >= $after + 2
		       AND (last_error_at IS NULL OR last_maintenance > last_error_at)
		  FROM idempotency.stats WHERE datname = 'db'});
	ok($ok, "$label: maintenance rounds succeed");
	if (!$ok)
	{
		diag(q_db(q{SELECT last_maintenance_error FROM idempotency.stats WHERE datname = 'db'}));
	}
	return q_db(q{SELECT maintenance_runs FROM idempotency.stats WHERE datname = 'db'});
}

# what every round must leave: partitions of both ledgers, made by the
# storage owner in the database's default tablespace, as heap tables, with
# bounds on whole seconds (the bounds were read as UTC timestamps), the
# ledger columns of pg_catalog's types; nothing granted to anyone
sub check_storage
{
	my ($label) = @_;
	is(q_db(q{
		SELECT format('%s tables, %s not by the owner, %s elsewhere, %s not heap, %s odd bounds, %s odd types, %s granted',
		   count(*),
		   count(*) FILTER (WHERE c.relowner <> n.nspowner),
		   count(*) FILTER (WHERE c.reltablespace <> 0),
		   count(*) FILTER (WHERE c.relkind = 'r'
		                      AND c.relam <> (SELECT oid FROM pg_am WHERE amname = 'heap')),
		   count(*) FILTER (WHERE p.lower_bound <> date_trunc('second', p.lower_bound)
		                       OR p.upper_bound <> date_trunc('second', p.upper_bound)),
		   (SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		     WHERE a.attrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
		                            AND relkind IN ('r', 'p'))
		       AND a.attnum > 0 AND t.typnamespace <> 'pg_catalog'::regnamespace),
		   count(*) FILTER (WHERE c.relacl IS NOT NULL AND EXISTS
		       (SELECT FROM aclexplode(c.relacl) g WHERE g.grantee <> c.relowner)))
		  FROM idempotency.partition_info() p
		  JOIN pg_class c ON c.oid = p.partition
		  JOIN pg_namespace n ON n.oid = c.relnamespace}) =~ s/^(\d+)/N/r,
		'N tables, 0 not by the owner, 0 elsewhere, 0 not heap, 0 odd bounds, 0 odd types, 0 granted',
		"$label: the partitions are the extension's own");
}

my $runs = wait_rounds(0, 'search_path with look-alikes');
ok($node->poll_query_until('db', q{
	SELECT count(DISTINCT table_name) = 2 FROM idempotency.partition_info()}),
	'the worker makes both ledgers');
check_storage('search_path with look-alikes');
is(sprung(), 'f f', 'no look-alike was called, and owner is no superuser');

# ------------------------------------------------ each database setting alone
my @settings = (
	[ 'DateStyle',                        q{'SQL, DMY'} ],
	[ 'IntervalStyle',                    q{'sql_standard'} ],
	[ 'TimeZone',                         q{'Pacific/Chatham'} ],
	[ 'statement_timeout',                q{'1ms'} ],
	[ 'lock_timeout',                     q{'1ms'} ],
	[ 'idle_in_transaction_session_timeout', q{'1ms'} ],
	[ 'default_transaction_read_only',    q{on} ],
	[ 'default_transaction_isolation',    q{'serializable'} ],
	[ 'default_transaction_deferrable',   q{on} ],
	[ 'default_tablespace',               q{'owner_space'} ],
	[ 'temp_tablespaces',                 q{'owner_space'} ],
	[ 'default_table_access_method',      q{'heap2'} ],
	[ 'default_toast_compression',        q{'lz4'} ],
	[ 'check_function_bodies',            q{off} ],
	[ 'role',                             q{'owner'} ],
	[ 'session_authorization',            q{'owner'} ],
	[ 'row_security',                     q{off} ],
	[ 'local_preload_libraries',          q{'no_such_library'} ],
	[ 'standard_conforming_strings',      q{off} ],
	[ 'quote_all_identifiers',            q{on} ],
	[ 'transform_null_equals',            q{on} ],
	[ 'search_path',                      q{'"$user", evil, pg_catalog'} ],
	[ 'work_mem',                         q{'64kB'} ],
	[ 'maintenance_work_mem',             q{'1MB'} ]);

my $has_lz4 = $node->safe_psql('postgres',
	q{SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)});

foreach my $s (@settings)
{
	my ($name, $value) = @$s;
	next if $name eq 'default_toast_compression' && !$has_lz4;
	my ($ret, $out, $err) = as_owner(qq{ALTER DATABASE db SET $name = $value});
	is($ret, 0, "the owner sets $name = $value for the database") or diag($err);
	my $dropped = q_db(q{SELECT partitions_dropped FROM idempotency.stats WHERE datname = 'db'});
	$runs = wait_rounds($runs, "$name = $value");
	ok($node->poll_query_until('db', qq{
		SELECT partitions_dropped > $dropped FROM idempotency.stats WHERE datname = 'db'}),
		"$name = $value: expired partitions are dropped");
	check_storage("$name = $value");
	is((as_owner(qq{ALTER DATABASE db RESET $name; ALTER DATABASE db SET search_path = evil, pg_catalog}))[0],
		0, "the owner resets $name");
}
is(sprung(), 'f f', 'under each setting, no look-alike was called');

# ------------------------------------------------ all of them at once
foreach my $s (@settings)
{
	my ($name, $value) = @$s;
	next if $name eq 'search_path' || $name eq 'role' || $name eq 'session_authorization';
	next if $name eq 'default_toast_compression' && !$has_lz4;
	is((as_owner(qq{ALTER DATABASE db SET $name = $value}))[0], 0, "the owner sets $name = $value again");
}
is((as_owner(q{ALTER DATABASE db SET role = 'owner'; ALTER DATABASE db SET session_authorization = 'owner'}))[0],
	0, 'and role and session_authorization = owner');
$runs = wait_rounds($runs, 'every setting at once');
check_storage('every setting at once');

# a partition maker, for an ordinary role's call far beyond the horizon
is( $node->safe_psql('db', q{
		SET ROLE app;
		SELECT idem_consume_message('c', 'far', ttl => '20 days')}),
	't', 'an ordinary role consumes with a ttl that needs a new partition');
is(q_db(q{SELECT count(*) > 0 FROM idempotency.partition_info() WHERE upper_bound > now() + interval '19 days'}),
	't', 'a partition maker made it');
check_storage('after the partition maker');

# what a superuser runs in that database: a pg_cron job, an update
# (with the database's search_path, dates and storage settings: only what
# would make the superuser's own command fail is set aside)
{
	local $ENV{PGOPTIONS} = join ' ', map { "-c $_" } (
		'default_transaction_read_only=off', 'statement_timeout=0', 'lock_timeout=0',
		'role=none', "session_authorization=$superuser", 'local_preload_libraries=');
	$node->safe_psql('db', q{SELECT idem_maintain()});
	$node->safe_psql('db', q{ALTER EXTENSION idempotency UPDATE});
}
is(q_db(q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$node->safe_psql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
	'ALTER EXTENSION UPDATE under the hostile settings reaches the current version');
$runs = wait_rounds($runs, 'after the update');
check_storage('after the update');

# the key memory (idempotency.key_memory = 3 s): the worker drops an
# ordinary role's expired key and message id into the memory, under every
# setting at once, making the memory tables and their pieces as the
# storage owner, with pg_catalog's types and no grant; the key is then
# answered "expired", the id false; the pieces are dropped once the
# memory has passed
$node->safe_psql('db', q{
	SET ROLE app;
	BEGIN;
	SELECT status FROM idem_claim('remembered', ttl => '1 second');
	SELECT idem_complete('remembered', 200);
	COMMIT;
	SELECT idem_consume_message('c', 'remembered', ttl => '1 second');});
ok( $node->poll_query_until('db', q{
		SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
		   AND to_regclass('idempotency.messages_memory') IS NOT NULL
		   AND (SELECT count(*) FROM idempotency.keys_memory) > 0
		   AND (SELECT count(*) FROM idempotency.messages_memory) > 0}),
	'the worker drops the expired key and id into the memory under the hostile settings');
is( $node->safe_psql('db', q{
		SET ROLE app;
		BEGIN;
		SELECT (SELECT status FROM idem_claim('remembered')) || ' '
		    || idem_consume_message('c', 'remembered')::text;
		ROLLBACK;}),
	'expired false', 'the memory answers for them');
is(q_db(q{
	SELECT format('%s tables, %s not by the owner, %s elsewhere, %s not heap, %s odd types, %s granted',
	   count(*),
	   count(*) FILTER (WHERE c.relowner <> n.nspowner),
	   count(*) FILTER (WHERE c.reltablespace <> 0),
	   count(*) FILTER (WHERE c.relkind = 'r'
	                      AND c.relam <> (SELECT oid FROM pg_am WHERE amname = 'heap')),
	   (SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
	     WHERE a.attrelid IN (SELECT oid FROM pg_class
	                           WHERE relname LIKE 'keys\_memory%' OR relname LIKE 'messages\_memory%')
	       AND a.attnum > 0 AND t.typnamespace <> 'pg_catalog'::regnamespace),
	   count(*) FILTER (WHERE c.relacl IS NOT NULL AND EXISTS
	       (SELECT FROM aclexplode(c.relacl) g WHERE g.grantee <> c.relowner)))
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE c.relkind IN ('r', 'p')
	   AND (c.relname LIKE 'keys\_memory%' OR c.relname LIKE 'messages\_memory%')}) =~ s/^(\d+)/N/r,
	'N tables, 0 not by the owner, 0 elsewhere, 0 not heap, 0 odd types, 0 granted',
	"the memory tables and their pieces are the extension's own");
ok( $node->poll_query_until('db', q{
		SELECT (SELECT count(*) FROM idempotency.keys_memory)
		     + (SELECT count(*) FROM idempotency.messages_memory) = 0}),
	'the worker drops the pieces once the memory has passed');
$runs = wait_rounds($runs, 'with the key memory');

is(sprung(), 'f f', 'after everything, no look-alike was called and owner is no superuser');

$node->stop;
done_testing();
