
# test/t/038_citus_ledgers.pl -- ledgers distributed by Citus (issue 37):
# idempotency.citus_distribute() distributes the key and message ledgers by
# a "tenant" column co-located with the application's tables, with a
# replica identity index on every partition and shard; a call on a key
# (scope = tenant) or a message id (ttl => NULL, tenant => ...) reads and writes the
# local shard of its tenant, and only that call does: whatever the same
# backend runs next (an export, maintenance), after a call that returned,
# failed, or failed inside a savepoint, reads the node's own ledger table.
# With idempotency.key_memory, the coordinator's maintenance keeps the
# expired partitions of the distributed ledgers (no piece) until
# key_memory has passed, so that a tenant's expired keys move with its
# shards: answered "expired" on the node a force_logical move took them to.
# The role column of the distributed tables is an idempotency.role_ref:
# a role's key, message id, position and sequence moved to a node where
# the role has another OID are its own there, and no other role's.
#
# One node with Citus preloaded, holding the shards itself (the
# coordinator, shouldhaveshards); a second one for the move.  The test
# command builds Citus for the server under test (test/run-suites.sh,
# citus_for_tests); skipped where Citus is not installed.  The proof through Citus' own shard operations
# under load is examples/citus/distributed-ledger/run.sh.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use FindBin;
use lib "$FindBin::RealBin/../lib";
use Torture qw(poll_until);

my $node = PostgreSQL::Test::Cluster->new('citus_ledgers');
my $pkglibdir = $node->config_data('--pkglibdir');
plan skip_all => "Citus is not installed in $pkglibdir"
  unless -f "$pkglibdir/citus.so";

$node->init;
# wal_level logical and the node reaching itself by its socket: for the
# force_logical move of the key memory check below
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus'
max_worker_processes = 16
citus.shard_count = 4
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
} . "citus.local_hostname = '" . $node->host . "'\n");
$node->start;

my $host = $node->host;
my $port = $node->port;

# a database with Citus, one node holding the shards, and payments
# distributed by a tenant column of type $type
sub citus_db
{
	my ($db, $type) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db") unless $db eq 'postgres';
	$node->safe_psql($db, qq{
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant $type NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
});
}
citus_db('postgres', 'text');
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');

my ($stdout, $stderr);

# Who may distribute: not an ordinary role.
$node->psql('postgres', q{SELECT idempotency.citus_distribute('payments')},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'app' ]);
like($stderr, qr/permission denied/, 'an ordinary role cannot distribute the ledgers');

# Ledgers with rows of their own are not distributed (a row does not say
# its tenant): 55000, and nothing changed.
$node->psql('postgres', q{
\set VERBOSITY verbose
BEGIN;
SELECT status FROM idem_claim('early', scope => 'acme', lease => '1 hour');
SELECT idempotency.citus_distribute('payments');
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 1);
like($stderr, qr/ERROR:  55000: the ledgers of this node have rows/,
	'ledgers with rows are not distributed: 55000');

# Stream positions of the node's own with rows: the tenant calls would no
# longer read them once distributed (55000).
$node->psql('postgres', q{
\set VERBOSITY verbose
BEGIN;
SELECT * FROM idem_advance('early', 's', 0, 0, 9);
SELECT idempotency.citus_distribute('payments');
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 1);
like($stderr, qr/ERROR:  55000: the stream positions of this node have rows/,
	'stream positions with rows are not distributed: 55000');
$node->psql('postgres', q{
\set VERBOSITY verbose
BEGIN;
SELECT idem_sequence('early', 'p', 1, 1);
SELECT idempotency.citus_distribute('payments');
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 1);
like($stderr, qr/ERROR:  55000: the stream positions of this node have rows/,
	'producer sequences with rows are not distributed: 55000');

# A table not distributed by hash: 22023.
$node->safe_psql('postgres', 'CREATE TABLE local_table (tenant text)');
$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT idempotency.citus_distribute('local_table');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22023: table public.local_table is not distributed by hash/,
	'a table not distributed by hash: 22023');

$node->safe_psql('postgres', q{SELECT idempotency.citus_distribute('payments')});
is($node->safe_psql('postgres', q{
SELECT string_agg(logicalrelid::text, ',' ORDER BY logicalrelid::text)
  FROM pg_dist_partition
 WHERE logicalrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
   AND colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass)
   AND column_to_column_name(logicalrelid, partkey) = 'tenant'}),
	'idempotency.keys,idempotency.messages',
	'both ledgers distributed by tenant, co-located with payments');
is($node->safe_psql('postgres', q{
SET citus.override_table_visibility = off;
SELECT string_agg(DISTINCT c.relreplident::text, ',') || ' ' || count(*)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'idempotency' AND c.relkind = 'r'
   AND c.relname ~ '^(keys|messages)_n'}) =~ /^i [1-9][0-9]*$/ ? 'i' : 'not all i',
	'i', 'every ledger partition and every shard of one: replica identity by index');
is($node->safe_psql('postgres', q{
SET citus.override_table_visibility = off;
SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'idempotency' AND c.relname ~ '^(keys|messages)'
   AND i.indnatts = 2 AND i.indkey[0] = 3 AND i.indkey[1] = 2}), '0',
	'no (role, digest) index left: probes use the identity index');
$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT idempotency.citus_distribute('payments');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  55000: the ledgers are distributed already/,
	'distributing twice: 55000');

# Routed calls write the tenant's shard, with the tenant: the distributed
# table (read through Citus) has the rows, the node's own table does not.
$node->safe_psql('postgres', q{
BEGIN;
SELECT status FROM idem_claim('k1', scope => 'acme');
SELECT idem_complete('k1', 201, '{"routed": true}', scope => 'acme');
COMMIT;
});
is($node->safe_psql('postgres', q{SELECT tenant || ' ' || state::text FROM idempotency.keys}),
	'acme c', 'the key\'s row is in the tenant\'s shard, with its tenant');
is($node->safe_psql('postgres', q{
SELECT status || ' ' || response_code FROM idem_claim('k1', scope => 'acme')}),
	'completed 201', 'a routed call finds the key in the shard');

is($node->safe_psql('postgres', q{
SELECT idem_consume_message('events', 'm1', ttl => NULL, tenant => 'acme');
SELECT idem_consume_message('events', 'm1', ttl => NULL, tenant => 'acme');
SELECT string_agg(x, ',') FROM idem_consume_messages('events', ARRAY['m1', 'm2'], ttl => NULL, tenant => 'acme') AS x;
SELECT string_agg(tenant, ',') FROM idempotency.messages;
}), "t\nf\nm2\nacme,acme", 'message ids are recorded once, in the tenant\'s shard');

$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT idem_consume_message('events', 'm3');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22004: tenant must not be null when ledger "idempotency.messages" is distributed by Citus/,
	'a message id without its tenant: 22004');

# Stream positions (issue 37): idempotency.tenant_positions is distributed
# by tenant, co-located with payments, its primary key (with the tenant)
# its replica identity; a call that names its tenant reads and writes the
# tenant's shard, with the tenant in the position's identity; a NULL
# tenant is refused (22004); the calls without a tenant use the node's own
# idempotency.positions.
is($node->safe_psql('postgres', q{
SELECT (colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass))
       || ' ' || column_to_column_name(logicalrelid, partkey)
  FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tenant_positions'::regclass;
SELECT pg_get_indexdef(indexrelid) FROM pg_index
 WHERE indrelid = 'idempotency.tenant_positions'::regclass AND indisprimary;
SELECT (colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass))
       || ' ' || column_to_column_name(logicalrelid, partkey)
  FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tenant_sequences'::regclass;
SELECT pg_get_indexdef(indexrelid) FROM pg_index
 WHERE indrelid = 'idempotency.tenant_sequences'::regclass AND indisprimary;
}), "true tenant\nCREATE UNIQUE INDEX tenant_positions_pkey ON idempotency.tenant_positions USING btree (role, consumer, stream, part, tenant)\n"
  . "true tenant\nCREATE UNIQUE INDEX tenant_sequences_pkey ON idempotency.tenant_sequences USING btree (role, consumer, producer, tenant)",
	'the tenant positions and sequences: distributed by tenant, co-located with payments, the tenant in the primary key');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM idem_assign('c', 's', ARRAY[0, 1], 1, 'acme');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9, 1, 'acme');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 5, 14, 1, 'acme');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9, NULL, 'globex');
SELECT string_agg(part || ':' || coalesce(next_offset::text, '-') || ':' || generation, ',' ORDER BY part)
  FROM idem_positions('c', 's', 'acme');
SELECT string_agg(tenant || ':' || part || ':' || coalesce(next_offset::text, '-'), ',' ORDER BY tenant, part)
  FROM idempotency.tenant_positions;
SELECT count(*) FROM idempotency.positions;
}), "2\n0-9\n10-14\n0-9\n0:15:1,1:-:1\nacme:0:15,acme:1:-,globex:0:10\n0",
	'tenant positions are read and written in the tenant\'s shard, one per tenant');
is($node->safe_psql('postgres', q{
SELECT idem_sequence('c', 'p', 1, 1, false, 'acme');
SELECT idem_sequence('c', 'p', 1, 1, false, 'acme');
SELECT idem_sequence('c', 'p', 1, 1, false, 'globex');
SELECT idem_sequence('c', 'p', 1, 3, false, 'acme');
SELECT string_agg(tenant || ':' || epoch || ':' || seq, ',' ORDER BY tenant) FROM idempotency.tenant_sequences;
SELECT count(*) FROM idempotency.sequences;
}), "new\nduplicate\nnew\ngap\nacme:1:3,globex:1:1\n0",
	'tenant producer sequences are checked and written in the tenant\'s shard, one per tenant');
# another role with the same consumer, stream, producer and tenant has rows
# of its own in the same shard: it neither sees nor moves the first role's
is($node->safe_psql('postgres', q{
GRANT USAGE ON SCHEMA public TO app;
SET ROLE app;
SELECT string_agg(part || ':' || coalesce(next_offset::text, '-'), ',' ORDER BY part)
  FROM idem_positions('c', 's', 'acme');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 4, NULL, 'acme');
SELECT idem_sequence('c', 'p', 1, 1, false, 'acme');
RESET ROLE;
SELECT string_agg(role::text || ':' || next_offset, ',' ORDER BY role::text)
  FROM idempotency.tenant_positions WHERE tenant = 'acme' AND part = 0;
SELECT string_agg(role::text || ':' || seq, ',' ORDER BY role::text)
  FROM idempotency.tenant_sequences WHERE tenant = 'acme';
}), "\n0-4\nnew\napp:5,postgres:15\napp:1,postgres:3",
	'another role\'s tenant positions and sequences of the same names are its own');
$node->safe_psql('postgres', q{DELETE FROM idempotency.tenant_positions WHERE role = 'app'::regrole;
DELETE FROM idempotency.tenant_sequences WHERE role = 'app'::regrole});
$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT idem_sequence('c', 'p', 1, 4, false, NULL);
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22004: tenant must not be null when table "idempotency.tenant_sequences" is distributed by Citus/,
	'a tenant producer sequence without its tenant: 22004');
$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT * FROM idem_advance('c', 's', 0, 15, 19, 1, NULL);
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22004: tenant must not be null when table "idempotency.tenant_positions" is distributed by Citus/,
	'a tenant position without its tenant: 22004');
is($node->safe_psql('postgres', q{
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9);
SELECT count(*) FROM idempotency.positions;
}), "0-9\n1", 'the calls without a tenant use the node\'s own positions');
# maintenance deletes the unused rows of the shards this node holds
is($node->safe_psql('postgres', q{
UPDATE idempotency.tenant_positions SET updated_at = now() - interval '400 days'
 WHERE tenant = 'globex';
UPDATE idempotency.tenant_sequences SET updated_at = now() - interval '400 days'
 WHERE tenant = 'globex';
SELECT count(*) >= 0 FROM idem_maintain();
SELECT string_agg(DISTINCT tenant, ',') || ' ' || count(*) FROM idempotency.tenant_positions;
SELECT string_agg(DISTINCT tenant, ',') || ' ' || count(*) FROM idempotency.tenant_sequences;
}), "t\nacme 2\nacme 1", 'maintenance deletes the tenant positions and sequences unused for position_ttl, in the local shards');
is($node->safe_psql('postgres', q{
SELECT string_agg(deptype::text, ',') FROM pg_depend
 WHERE classid = 'pg_class'::regclass
   AND objid IN ('idempotency.tenant_positions'::regclass, 'idempotency.tenant_sequences'::regclass)
   AND refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')}), 'a,a',
	'maintenance on the coordinator makes the tenant positions and sequences depend on the extension (AUTO)');
# granted to nobody: a grant is taken back by maintenance on the coordinator
is($node->safe_psql('postgres', q{
GRANT SELECT ON idempotency.tenant_positions, idempotency.tenant_sequences TO app;
SELECT count(*) >= 0 FROM idem_maintain();
SELECT has_table_privilege('app', 'idempotency.tenant_positions', 'SELECT'),
       has_table_privilege('app', 'idempotency.tenant_sequences', 'SELECT');
}), "t\nf|f", 'maintenance takes back a grant on the tenant positions and sequences');

# Every call's routing is its own: an export in the same transaction after
# routed calls reads the node's own (empty) table, not the last shard.
my $export = q{SELECT count(*) FROM idempotency.export_keys()};
is($node->safe_psql('postgres', qq{
BEGIN;
SELECT status FROM idem_claim('k2', scope => 'acme', lease => '1 hour');
SELECT idem_consume_message('events', 'm4', ttl => NULL, tenant => 'acme');
$export;
SELECT count(*) FROM idempotency.export_messages();
COMMIT;
}), "claimed\nt\n0\n0", 'an export in the transaction of routed calls reads the own tables, not the shards');

# A routed call that fails: idem_complete() of a key never claimed is
# refused after the routing.  The next transaction of the backend, and the
# rest of a transaction whose savepoint rolled the failure back, read the
# own table.
$node->psql('postgres', qq{
SELECT idem_complete('never-claimed', 200, scope => 'acme');
$export;
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/is not claimed/, 'the routed call failed');
is($stdout, '0',
	'an export in the next transaction after a failed routed call reads the own table');

$node->psql('postgres', qq{
BEGIN;
SAVEPOINT s;
SELECT idem_complete('never-claimed', 200, scope => 'acme');
ROLLBACK TO SAVEPOINT s;
$export;
COMMIT;
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/is not claimed/, 'the routed call in the savepoint failed');
is($stdout, '0',
	'an export after a routed call rolled back to a savepoint reads the own table');

is($node->safe_psql('postgres', qq{
BEGIN;
DO \$\$
BEGIN
  PERFORM idem_complete('never-claimed', 200, scope => 'acme');
EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL;
END \$\$;
SELECT status FROM idem_claim('k3', scope => 'acme', lease => '1 hour');
SELECT count(*) >= 0 FROM idem_maintain();
$export;
COMMIT;
}), "claimed\nt\n0",
	'an export after routed calls (one failed in an exception block) and maintenance reads the own table');

# An import cannot tell its row's tenant: refused, nothing written.  (The
# key comes from a database without Citus.)
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('plain', 'CREATE EXTENSION idempotency');
my $record = $node->safe_psql('plain', q{
SELECT status FROM idem_claim('exported', scope => 'acme', lease => '1 hour');
SELECT k::text FROM idempotency.export_keys() AS k;
});
$record = (split /\n/, $record)[-1];
$node->psql('postgres', qq{
\\set VERBOSITY verbose
SELECT idempotency.import_key('$record'::idempotency.key_record);
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  55000: cannot write into ledger "idempotency.keys" without a tenant/,
	'an import into a distributed ledger: 55000');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.keys}), '3',
	'nothing imported');

# Partitions of the distributed ledgers are made by maintenance on the
# coordinator (Citus makes their shards) with their replica identity
# index; a routed call that lacks one does not make it.  The newest
# partition is dropped, and made again by idem_maintain().
my $newest = $node->safe_psql('postgres', q{
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'idempotency.keys'::regclass
 ORDER BY pg_get_expr(c.relpartbound, c.oid) DESC LIMIT 1});
$node->safe_psql('postgres', "DROP TABLE idempotency.$newest");
is($node->safe_psql('postgres', q{SELECT partitions_created >= 1 FROM idem_maintain()}),
	't', 'maintenance on the coordinator made the dropped partition again');
is($node->safe_psql('postgres', qq{
SET citus.override_table_visibility = off;
SELECT string_agg(DISTINCT c.relreplident::text || coalesce(i.indisunique::text, '-'), ',') || ' ' || count(*)
  FROM pg_class c LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisreplident
 WHERE c.relname = '$newest' OR c.relname ~ ('^' || '$newest' || '_[0-9]+\$')}),
	'itrue 5', 'the partition made by maintenance and its 4 shards: replica identity by a unique index');

$node->psql('postgres', q{
\set VERBOSITY verbose
SELECT status FROM idem_claim('far', scope => 'acme', ttl => '29 days', lease => '1 hour');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  55000: the ledger shard "keys_[0-9]+" has no partition for this key's expiry/,
	'a routed call that lacks a partition does not make one: 55000');

# A tenant column of another type: the scope is converted by the type's
# input function; a scope that is not a value of it is refused (22P02).
citus_db('bigints', 'bigint');
$node->safe_psql('bigints', q{SELECT idempotency.citus_distribute('payments')});
is($node->safe_psql('bigints', q{
SELECT status FROM idem_claim('k', scope => '42', lease => '1 hour');
SELECT format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'idempotency.keys'::regclass AND attname = 'tenant';
SELECT tenant FROM idempotency.keys;
}), "claimed\nbigint\n42", 'a bigint tenant: the scope converted to it');
$node->psql('bigints', q{
\set VERBOSITY verbose
SELECT status FROM idem_claim('k', scope => 'acme', lease => '1 hour');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22P02: invalid input syntax for type bigint: "acme"/,
	'a scope that is not a tenant of that type: 22P02');
is($node->safe_psql('bigints', q{
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9, NULL, '42');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 5, 19, NULL, '42');
SELECT next_offset FROM idem_positions('c', 's', '42');
SELECT format_type(atttypid, atttypmod) || ' ' || (SELECT string_agg(tenant::text, ',') FROM idempotency.tenant_positions)
  FROM pg_attribute WHERE attrelid = 'idempotency.tenant_positions'::regclass AND attname = 'tenant';
}), "0-9\n10-19\n20\nbigint 42", 'a bigint tenant position: the tenant converted to it');
$node->psql('bigints', q{
\set VERBOSITY verbose
SELECT * FROM idem_advance('c', 's', 0, 0, 9, NULL, 'acme');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  22P02: invalid input syntax for type bigint: "acme"/,
	'a tenant position whose tenant is not of that type: 22P02');

# A tenant column whose equality is not pg_catalog's: idem_positions()
# lists the positions that idem_advance() wrote, under the equality of the
# column's btree operator class, as the calls find them.  citext: 'Acme'
# and 'ACME' are one tenant (one shard, one row), and its = is citext's
# own (before the review, idem_positions(..., 'acme') compared the text
# through pg_catalog's = and listed nothing).
SKIP:
{
	skip 'citext is not installed', 2
	  unless -f $node->config_data('--sharedir') . '/extension/citext.control';
	$node->safe_psql('postgres', 'CREATE DATABASE citexts');
	$node->safe_psql('citexts', 'CREATE EXTENSION citus; CREATE EXTENSION citext');
	$node->safe_psql('citexts', qq{
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant citext NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
});
	is($node->safe_psql('citexts', q{
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9, NULL, 'Acme');
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 5, 19, NULL, 'ACME');
SELECT part || ':' || next_offset FROM idem_positions('c', 's', 'acme');
SELECT part || ':' || next_offset FROM idem_positions('c', 's', 'ACME');
SELECT count(*) FROM idempotency.tenant_positions;
}), "0-9\n10-19\n0:20\n0:20\n1", 'a citext tenant: its positions listed under citext\'s equality');

	# An enum tenant whose owner adds an implicit cast to text: the list
	# still names the enum's own equality (before the review, pg_catalog's
	# = of the enum was ambiguous with text's: 42725 for every role).
	$node->safe_psql('postgres', 'CREATE DATABASE enums');
	$node->safe_psql('enums', q{
CREATE EXTENSION citus;
CREATE TYPE region AS ENUM ('eu', 'us');
CREATE FUNCTION region_text(region) RETURNS text LANGUAGE sql IMMUTABLE
  AS 'SELECT $1::name::text';
CREATE CAST (region AS text) WITH FUNCTION region_text(region) AS IMPLICIT;
});
	$node->safe_psql('enums', qq{
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant region NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
});
	is($node->safe_psql('enums', q{
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 9, NULL, 'eu');
SELECT part || ':' || next_offset FROM idem_positions('c', 's', 'eu');
SELECT count(*) FROM idem_positions('c', 's', 'us');
}), "0-9\n0:10\n0", 'an enum tenant with an implicit cast to text: its positions listed');
}

# Tenant calls concurrent with citus_distribute() (review): a position
# written by a transaction still open when citus_distribute() checks that
# the node's positions are empty is waited for and refused (55000), and a
# tenant call that comes while citus_distribute()'s transaction is open
# waits for it and writes the tenant's shard.  Before the review, the first
# was distributed past (its row left in idempotency.positions, which no
# tenant call reads: the batch processed again), and the second wrote into
# idempotency.positions too.
citus_db('races', 'text');
$node->safe_psql('races', 'SELECT idem_maintain()');
my $open = $node->background_psql('races', on_error_stop => 0);
my $dist = $node->background_psql('races', on_error_stop => 0);
my $open_pid = $open->query_safe('SELECT pg_backend_pid()');
my $dist_pid = $dist->query_safe('SELECT pg_backend_pid()');
$dist->query_safe('\set VERBOSITY verbose');
# waits until the session is blocked on a lock, or done
my $blocked_or_done = sub {
	my ($pid) = @_;
	return poll_until("backend $pid blocked or idle", sub {
		$node->safe_psql('races', qq{
SELECT wait_event_type = 'Lock' OR state LIKE 'idle%' FROM pg_stat_activity WHERE pid = $pid}) eq 't';
	});
};
is($open->query_safe(q{BEGIN;
SELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 99, NULL, 'acme')}),
	'0-99', 'an open transaction advanced a tenant position before the distribution');
$dist->query_until(qr/go\n/, "\\echo go\nSELECT idempotency.citus_distribute('payments');\n");
ok($blocked_or_done->($dist_pid), 'citus_distribute() started');
is($node->safe_psql('races', qq{SELECT wait_event_type FROM pg_stat_activity WHERE pid = $dist_pid}),
	'Lock', 'citus_distribute() waits for the open transaction that wrote a position');
$open->query_safe('COMMIT');
$dist->query('SELECT 1');
like($dist->{stderr}, qr/ERROR:  55000: the stream positions of this node have rows/,
	'and then refuses: the row it wrote is in the node\'s own positions');
$dist->{stderr} = '';

$node->safe_psql('races', 'DELETE FROM idempotency.positions');
$dist->query_safe(q{BEGIN; SELECT idempotency.citus_distribute('payments')});
$open->query_until(qr/go\n/, "\\echo go\nSELECT first_offset || '-' || last_offset FROM idem_advance('c', 's', 0, 0, 99, NULL, 'acme');\n");
ok($blocked_or_done->($open_pid), 'a tenant call started during the distribution');
is($node->safe_psql('races', qq{SELECT wait_event_type FROM pg_stat_activity WHERE pid = $open_pid}),
	'Lock', 'a tenant call waits for citus_distribute()\'s transaction');
$dist->query_safe('COMMIT');
like($open->query('SELECT 1'), qr/^0-99\n1$/, 'and then processes its batch');
is($node->safe_psql('races', q{
SELECT (SELECT count(*) FROM idempotency.positions) || ' ' || (SELECT count(*) FROM idempotency.tenant_positions);
SELECT count(*) FROM idem_advance('c', 's', 0, 0, 99, NULL, 'acme');
}), "0 1\n0", 'its position is in the tenant\'s shard: the batch is not processed again');
$open->quit;
$dist->quit;

# A maintenance run in progress when citus_distribute() makes the ledgers
# (the background worker's first run in a fresh database, here a
# transaction that ran idem_maintain() and is still open: it holds the
# maintenance lock and its ledgers are not committed yet): citus_distribute()
# waits for it, instead of failing with "the ledgers of this database could
# not be made" (55000) as it did before the review.
citus_db('first_run', 'text');
my $first = $node->background_psql('first_run', on_error_stop => 0);
$first->query_safe('BEGIN; SELECT idem_maintain()');
my $distributer = $node->background_psql('first_run', on_error_stop => 0);
my $distributer_pid = $distributer->query_safe('SELECT pg_backend_pid()');
$distributer->query_until(qr/go\n/, "\\echo go\nSELECT idempotency.citus_distribute('payments');\n");
# between its tries, or failed already
poll_until('citus_distribute() waits for the maintenance run in progress, or has ended', sub {
	$node->safe_psql('first_run', qq{
SELECT wait_event IS NOT DISTINCT FROM 'PgSleep' OR state LIKE 'idle%'
  FROM pg_stat_activity WHERE pid = $distributer_pid}) eq 't';
});
$first->query_safe('COMMIT');
$distributer->query('SELECT 1');
unlike($distributer->{stderr}, qr/ERROR/, 'citus_distribute() did not fail while a maintenance run held the lock');
is(() = $distributer->{stderr} =~ /already running/g, 1, 'and said once that maintenance was running');
is($node->safe_psql('first_run', q{
SELECT string_agg(logicalrelid::text, ' ' ORDER BY logicalrelid::text) FROM pg_dist_partition
 WHERE logicalrelid::text IN ('idempotency.keys', 'idempotency.messages')}),
	'idempotency.keys idempotency.messages', 'and distributed the ledgers once it ended');
$first->quit;
$distributer->quit;

# Without Citus: citus_distribute() refuses (55000), and calls are not
# routed.
$node->psql('plain', q{
\set VERBOSITY verbose
SELECT idempotency.citus_distribute('pg_class');
}, stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  55000: Citus is not installed in this database/,
	'citus_distribute() without Citus: 55000');
is($node->safe_psql('plain', q{
SELECT status FROM idem_claim('k', scope => 'acme', lease => '1 hour');
SELECT idem_consume_message('events', 'm1', ttl => NULL, tenant => 'acme');
SELECT count(*) FROM idempotency.export_keys();
}), "claimed\nt\n2", 'without Citus the ledgers are the node\'s own, and tenant is not used');

# Key memory on distributed ledgers: the coordinator's maintenance keeps a
# partition whose range ended until key_memory has passed since (no piece
# of the node's memory: Citus could not move it), so the expired rows stay
# in the tenants' shards and move with them.  A key and a message id of
# tenant acme expire (1 s partitions, ttl 1 s); maintenance keeps their
# partitions; acme's shards move to a second node with force_logical; the
# key is "expired" there, the message id consumed.  Once key_memory has
# passed, maintenance drops the kept partitions, on every node.
my $node2 = PostgreSQL::Test::Cluster->new('citus_ledgers_2');
$node2->init;
$node2->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus'
max_worker_processes = 16
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
} . "citus.local_hostname = '" . $node2->host . "'\n");
$node2->start;
my $host2 = $node2->host;
my $port2 = $node2->port;
my $fast = q{
SET idempotency.partition_interval = '1s';
SET idempotency.key_ttl = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.premake = 10;
SET idempotency.key_memory = '1h';
};
for my $n ($node, $node2)
{
	$n->safe_psql('postgres', 'CREATE DATABASE mem');
	$n->safe_psql('mem', 'CREATE EXTENSION citus');
}
$node->safe_psql('mem', qq{
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
$fast
SELECT idempotency.citus_distribute('payments');
SELECT count(*) FROM idem_maintain();
SELECT citus_add_node('$host2', $port2);
});
# the rows of acme, on the coordinator (which holds every shard so far)
my $ends = $node->safe_psql('mem', qq{
$fast
SELECT count(*) FROM idem_maintain();
BEGIN;
SELECT status FROM idem_claim('late', scope => 'acme', ttl => '1 second');
SELECT idem_complete('late', 201, '{"id": 1}', scope => 'acme');
COMMIT;
SELECT idem_consume_message('events', 'late-m', ttl => '1 second', tenant => 'acme');
SELECT max(p.upper_bound) FROM idempotency.partitions p
 WHERE p.lower_bound <= (SELECT max(expires_at) FROM idempotency.keys)
    OR p.lower_bound <= (SELECT max(expires_at) FROM idempotency.messages);
});
$ends = (split /\n/, $ends)[-1];
ok( poll_until(
		'the partitions of acme\'s rows ended',
		sub {
			$node->safe_psql('mem', qq{SELECT clock_timestamp() > '$ends'}) eq 't';
		}),
	'the partitions holding acme\'s key and message id ended');
is($node->safe_psql('mem', qq{
$fast
SELECT count(*) FROM idem_maintain();
SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme') || ' '
    || (SELECT count(*) FROM idempotency.messages WHERE tenant = 'acme') || ' '
    || (SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= '$ends') || ' '
    || (SELECT count(*) FROM pg_inherits
         WHERE inhparent IN (SELECT c.oid FROM pg_class c
                              WHERE c.relnamespace = 'idempotency'::regnamespace
                                AND c.relname IN ('keys_memory', 'messages_memory')));
}) =~ s/^(?:.*\n)*//r =~ s/^(\d+ \d+) [1-9]\d* /$1 some /r, '1 1 some 0',
	'with key_memory, maintenance keeps the ended partitions of distributed ledgers (the rows stay in the shards), and writes no piece');

$node->safe_psql('mem', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host', $port, '$host2', $port2,
                                  shard_transfer_mode => 'force_logical');
$fast
SELECT count(*) FROM idem_maintain();
});
is($node->safe_psql('mem', q{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
 WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.keys', 'acme')}),
	$port2, 'acme\'s ledger shard moved to the second node');
my $answers = q{
BEGIN;
SELECT (SELECT status FROM idem_claim('late', scope => 'acme', ttl => '1 second')) || ' '
    || coalesce((SELECT status FROM idem_lookup('late', scope => 'acme')), 'none') || ' '
    || idem_consume_message('events', 'late-m', ttl => '1 second', tenant => 'acme')::text || ' '
    || (SELECT status FROM idem_claim('fresh', scope => 'acme', ttl => '1 second'));
ROLLBACK;
};
is($node2->safe_psql('mem', "$fast $answers"), 'expired expired false claimed',
	'after the move, the new node answers for the expired key and message id of acme');

# What the kept partitions cost a call on the second node, counted by the
# index scans of their shards in the call's transaction: a key with a
# live row finds it before them (none scanned), a key never seen scans
# each of its lanes' kept partitions once (not a second time for the
# memory).
my $kept_scans = q{
SET citus.override_table_visibility = off;
SELECT coalesce(sum(t.idx_scan), 0) || ' ' || coalesce(max(t.idx_scan), 0)
  FROM pg_stat_xact_user_tables t
 WHERE t.schemaname = 'idempotency'
   AND EXISTS (SELECT FROM idempotency.partitions p JOIN pg_class c ON c.oid = p.partition
                WHERE p.upper_bound <= now() AND c.relname ~ '^keys_'
                  AND t.relname ~ ('^' || c.relname || '_[0-9]+$'));
};
$node->safe_psql('mem', "$fast SELECT count(*) FROM idem_maintain()");
$node2->safe_psql('mem', qq{
$fast
BEGIN;
SELECT status FROM idem_claim('live', scope => 'acme', ttl => '8 seconds');
SELECT idem_complete('live', 200, scope => 'acme');
COMMIT;
});
is($node2->safe_psql('mem', qq{
$fast
BEGIN;
SELECT status FROM idem_claim('live', scope => 'acme', ttl => '8 seconds');
$kept_scans
ROLLBACK;
}), "completed\n0 0", 'a call on a live key scans no kept partition');
like($node2->safe_psql('mem', qq{
$fast
BEGIN;
SELECT status FROM idem_claim('never-seen', scope => 'acme', ttl => '8 seconds');
$kept_scans
ROLLBACK;
}), qr/^claimed\n[1-9][0-9]* 1$/, 'a key never seen scans each kept partition of its lanes once');

# key_memory (3 s here) passes: maintenance drops the kept partitions,
# their shards on the second node with them, and the key runs again
ok( poll_until(
		'key_memory passed since the partitions ended',
		sub {
			$node->safe_psql('mem', qq{SELECT clock_timestamp() > '$ends'::timestamptz + interval '3.1 seconds'}) eq 't';
		}),
	'3 s have passed since the partitions of acme\'s rows ended');
is($node->safe_psql('mem', qq{
$fast
SET idempotency.key_memory = '3s';
SELECT partitions_dropped > 0 FROM idem_maintain();
SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme' AND expires_at < '$ends') || ' '
    || (SELECT count(*) FROM idempotency.messages WHERE tenant = 'acme' AND expires_at < '$ends') || ' '
    || (SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= '$ends');
}), "t\n0 0 0", 'once key_memory has passed, maintenance drops the kept partitions');
is($node2->safe_psql('mem', "$fast SET idempotency.key_memory = '3s'; $answers"),
	'claimed in_progress true claimed', 'forgotten: the key and the message id run again');
# A transaction a tenant's call left open on the second node holds its
# locks on acme's shard (the metadata lock, the shard's parent and the
# partitions it probed) until it ends: the coordinator's maintenance does
# not wait for it, since its DDL waits on every node at most its own lock
# timeout (citus.c, IdemCitusExecDdl), and leaves the partition it could
# not make there for its next run, which makes it once the transaction
# has ended.  Before the review, the ATTACH of a new partition (Citus'
# renaming of its shards' indexes on the worker) waited for the open
# transaction as long as it stayed open (here, until the statement_timeout
# that bounds the test), and the calls on the shard queued behind it.
my $t0 = $node->safe_psql('mem', qq{$fast SELECT count(*) FROM idem_maintain(); SELECT clock_timestamp()});
$t0 = (split /\n/, $t0)[-1];
my $holder = $node2->background_psql('mem', on_error_stop => 0);
$holder->query_safe("$fast BEGIN; SELECT status FROM idem_claim('held-open', scope => 'acme', ttl => '8 seconds')");
# 1 s partitions: the next run has partitions to make
ok( poll_until(
		'a partition is due',
		sub {
			$node->safe_psql('mem', qq{SELECT clock_timestamp() > '$t0'::timestamptz + interval '1.5 seconds'}) eq 't';
		}),
	'the next maintenance run has partitions to make');
my $log_off = -s $node->logfile;
$node->psql('mem', qq{
$fast
SET statement_timeout = '60s';
SELECT count(*) FROM idem_maintain();
}, stdout => \$stdout, stderr => \$stderr);
is($stderr, '', 'a transaction left open on a worker does not hold the coordinator\'s maintenance');
like(slurp_file($node->logfile, $log_off),
	qr/LOG:  could not make a partition of distributed ledger "idempotency\.\w+" now, will retry/,
	'which leaves the partition it could not make on the worker in time for its next run');
$holder->query_safe('ROLLBACK');
$holder->quit;
is($node->safe_psql('mem', qq{$fast SELECT partitions_created > 0 FROM idem_maintain()}), 't',
	'the next run makes it, once the transaction has ended');

# A role granted idem_maintain() that sends its own search_path to the
# workers (SET LOCAL with citus.propagate_set_commands = 'local', which any
# role may set) does not get its function run by the storage owner there:
# Citus runs the DDL of a new partition on a worker through
# worker_apply_shard_ddl_command(), named without its schema, and the
# maintenance's DDL now sends the pinned settings first (citus.c,
# IdemCitusExecDdl).  Before, this role's function of that name in its
# schema ran on the second node as the superuser.
$node2->safe_psql('mem', q{
SET citus.enable_ddl_propagation = off;
CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.worker_apply_shard_ddl_command(bigint, text, text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the caller''s function ran as %', current_user; END $$;
CREATE FUNCTION evil.worker_apply_shard_ddl_command(bigint, text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the caller''s function ran as %', current_user; END $$;
CREATE FUNCTION evil.worker_apply_inter_shard_ddl_command(bigint, text, bigint, text, text) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the caller''s function ran as %', current_user; END $$;
});
$node->safe_psql('mem', q{
CREATE ROLE maint LOGIN;
GRANT EXECUTE ON FUNCTION idem_maintain() TO maint;
ALTER ROLE maint IN DATABASE mem SET idempotency.partition_interval = '1s';
ALTER ROLE maint IN DATABASE mem SET idempotency.key_ttl = '1s';
ALTER ROLE maint IN DATABASE mem SET idempotency.message_ttl = '1s';
ALTER ROLE maint IN DATABASE mem SET idempotency.premake = 10;
ALTER ROLE maint IN DATABASE mem SET idempotency.key_memory = '1h';
});
$t0 = $node->safe_psql('mem', qq{$fast SELECT count(*) FROM idem_maintain(); SELECT clock_timestamp()});
$t0 = (split /\n/, $t0)[-1];
ok( poll_until(
		'a partition is due',
		sub {
			$node->safe_psql('mem', qq{SELECT clock_timestamp() > '$t0'::timestamptz + interval '1.5 seconds'}) eq 't';
		}),
	'the next maintenance run has partitions to make');
$node->psql('mem', q{
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL search_path = evil, pg_catalog;
SELECT partitions_created > 0 FROM idem_maintain();
COMMIT;
}, stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'maint' ]);
is("$stdout|$stderr", 't|',
	'a role granted idem_maintain() with its own search_path sent to the workers: its function is not run there');

# A backend keeps what it found of a shard's placement (citus.c,
# IdemCitusShardIsLocal) only until the shard moves: a backend of the second
# node whose calls on acme were routed there, with a transaction open
# before the move and the move done meanwhile, is refused with 40001 by
# its next call on acme, of the key ledger or of the tenant positions (it
# would otherwise write the shard acme left, kept until Citus' deferred
# drop); a backend of the first node refused (0A000: acme was on the
# second node) is routed by its next call once acme is back.
my $stay = $node2->background_psql('mem', on_error_stop => 0);
my $back = $node->background_psql('mem', on_error_stop => 0);
$_->query_safe('\set VERBOSITY verbose') for ($stay, $back);
is($stay->query_safe(q{
SELECT count(*) FROM idem_lookup('moved', scope => 'acme');
SELECT count(*) FROM idem_positions('c', 's', 'acme');
}), "0\n0", 'a backend of the second node routes calls on acme to its shards there');
$back->query(q{SELECT count(*) FROM idem_lookup('moved', scope => 'acme')});
like($back->{stderr}, qr/ERROR:  0A000: the tenant's ledger shard is not on this node/,
	'a backend of the first node is refused while acme is on the second: 0A000');
$back->{stderr} = '';
$stay->query_safe('BEGIN; SELECT 1');
$node->safe_psql('mem', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host2', $port2, '$host', $port,
                                  shard_transfer_mode => 'block_writes');
});
$stay->query(q{SELECT count(*) FROM idem_lookup('moved', scope => 'acme')});
like($stay->{stderr}, qr/ERROR:  40001: the tenant's ledger shard is not on this node/,
	'after acme\'s shards moved back, the same backend\'s call in a transaction open before the move: 40001');
$stay->{stderr} = '';
$stay->query('ROLLBACK');
$stay->query(q{SELECT count(*) FROM idem_positions('c', 's', 'acme')});
like($stay->{stderr}, qr/ERROR:  40001: the tenant's ledger shard is not on this node/,
	'and its next call on acme\'s tenant positions: 40001');
$stay->{stderr} = '';
is($back->query_safe(q{SELECT count(*) FROM idem_lookup('moved', scope => 'acme')}), '0',
	'the backend of the first node refused before is routed to acme\'s shard now there');

# The same, with the call made while the move holds the shards' metadata
# lock (block_writes: taken before the copy; the copy is held here by a
# lock on acme's payments shard on the second node): the call waits for
# the move, and once it has the lock it reads the move's invalidations
# before the backend's "here" (IdemCitusRouteShard), so the shard acme
# left is refused (40001), not written.
$node->safe_psql('mem', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host', $port, '$host2', $port2,
                                  shard_transfer_mode => 'block_writes');
});
is($stay->query_safe(q{SELECT count(*) FROM idem_lookup('moved', scope => 'acme')}), '0',
	'acme\'s shards on the second node again: the backend routes there');
my $payments_shard = 'payments_'
  . $node->safe_psql('mem', q{SELECT get_shard_id_for_distribution_column('payments', 'acme')});
my $copy_holder = $node2->background_psql('mem', on_error_stop => 0);
$copy_holder->query_safe("SET citus.enable_manual_changes_to_shards = on; BEGIN; LOCK TABLE $payments_shard IN ACCESS EXCLUSIVE MODE");
my $mover = $node->background_psql('mem', on_error_stop => 0);
$mover->query_until(qr/go\n/, qq{
SET citus.check_available_space_before_move = off;
\\echo go
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host2', $port2, '$host', $port,
                                  shard_transfer_mode => 'block_writes');
});
ok( poll_until(
		'the move waits for its copy of acme\'s payments shard',
		sub {
			$node2->safe_psql('mem', qq{
SELECT count(*) > 0 FROM pg_locks WHERE NOT granted AND relation = '$payments_shard'::regclass}) eq 't';
		}),
	'the move holds the metadata locks and waits to copy acme\'s payments shard');
my $stay_pid = $stay->query_safe('SELECT pg_backend_pid()');
$stay->query_until(qr/go\n/, q{
\\echo go
SELECT count(*) FROM idem_lookup('moved', scope => 'acme');
});
ok( poll_until(
		'the call waits for the shard\'s metadata lock',
		sub {
			$node2->safe_psql('mem', qq{
SELECT wait_event FROM pg_stat_activity WHERE pid = $stay_pid}) eq 'advisory';
		}),
	'a call on acme during the move waits for the shards\' metadata lock');
$copy_holder->query_safe('COMMIT');
$mover->query_safe('SELECT 1');
is($node->safe_psql('mem', q{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
 WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.keys', 'acme')}),
	$port, 'the move ended: acme\'s shards on the first node');
$stay->query('SELECT 1');
like($stay->{stderr}, qr/ERROR:  40001: the tenant's ledger shard is not on this node/,
	'the call that waited for the move is refused: 40001');
$stay->quit;
$back->quit;
$copy_holder->quit;
$mover->quit;

# The outbox of a tenant (issue 37; src/outbox_tenant.c): with the tenant
# outbox made by citus_distribute(), idem_publish(..., tenant) numbers a
# tenant's events of a topic densely in commit order in the tenant's shard,
# and the relay on the coordinator (idem_outbox_next/ack(..., tenant))
# reads them per tenant in that order, the same batch until acknowledged,
# fenced by its generation, each role only its own.  A force_logical move
# of the tenant's shard carries its unrelayed events: the relay then reads
# them from the new node, none lost, none twice.  Maintenance drops a
# partition once its events are acknowledged and the retention passed,
# keeps one not acknowledged, and past the max age drops it and the relay
# is told of the loss (ID003).
my $ob_fast = q{
SET idempotency.partition_interval = '2s';
SET idempotency.key_ttl = '1s';
SET idempotency.message_ttl = '1s';
SET idempotency.premake = 8;
};
for my $n ($node, $node2)
{
	$n->safe_psql('postgres', 'CREATE DATABASE obx');
	$n->safe_psql('obx', 'CREATE EXTENSION citus');
	$n->safe_psql('obx', qq{
SET citus.enable_ddl_propagation = off;
ALTER DATABASE obx SET idempotency.partition_interval = '2s';
ALTER DATABASE obx SET idempotency.key_ttl = '1s';
ALTER DATABASE obx SET idempotency.message_ttl = '1s';
ALTER DATABASE obx SET idempotency.premake = 8;
});
}
$node->safe_psql('obx', qq{
CREATE ROLE ob_a LOGIN;
CREATE ROLE ob_b LOGIN;
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
-- what default privileges would give ob_b on the tenant outbox
ALTER DEFAULT PRIVILEGES IN SCHEMA idempotency GRANT SELECT ON TABLES TO ob_b;
ALTER DEFAULT PRIVILEGES IN SCHEMA idempotency GRANT EXECUTE ON FUNCTIONS TO ob_b;
SELECT idempotency.citus_distribute('payments');
SELECT citus_add_node('$host2', $port2);
$ob_fast
SELECT count(*) FROM idem_maintain();
});
is($node->safe_psql('obx', q{
SELECT string_agg(logicalrelid::text, ',' ORDER BY logicalrelid::text)
  FROM pg_dist_partition
 WHERE logicalrelid IN ('idempotency.tenant_outbox_heads'::regclass, 'idempotency.tenant_events'::regclass)
   AND colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass)
   AND column_to_column_name(logicalrelid, partkey) = 'tenant'}),
	'idempotency.tenant_events,idempotency.tenant_outbox_heads',
	'the tenant outbox is distributed by tenant, co-located with payments');
is($node->safe_psql('obx', q{
SELECT count(*) FROM pg_dist_partition
 WHERE logicalrelid::text ~ '^idempotency\.tenant_(relays|relay_positions|event_partitions)$'}) . ' '
   . $node2->safe_psql('obx', q{
SELECT (to_regclass('idempotency.tenant_relays') IS NULL)::text || ' '
    || (to_regproc('idempotency.tenant_outbox_next') IS NULL)::text}), '0 true true',
	'the relays\' positions and functions stay on the coordinator');
is($node->safe_psql('obx', q{
SELECT string_agg(c.relname || ':' || coalesce((SELECT string_agg(a.grantee::regrole::text || '=' || a.privilege_type, ',')
                                                    FROM aclexplode(c.relacl) a
                                                   WHERE a.grantee <> c.relowner), 'none'), ' ' ORDER BY c.relname)
  FROM pg_class c
 WHERE c.relnamespace = 'idempotency'::regnamespace
   AND c.relname IN ('tenant_outbox_heads', 'tenant_events', 'tenant_relays', 'tenant_relay_positions')}),
	'tenant_events:none tenant_outbox_heads:none tenant_relay_positions:none tenant_relays:none',
	'the tenant outbox\'s tables are granted to nobody, whatever default privileges say');
is($node->safe_psql('obx', q{
SELECT count(*) FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = 'idempotency.tenant_events'::regclass
   AND c.relacl::text ~ 'ob_b'}), '0', 'and so are its partitions');
is($node->safe_psql('obx', qq{
GRANT SELECT ON idempotency.tenant_events, idempotency.tenant_relay_positions TO ob_b;
$ob_fast
SELECT count(*) FROM idem_maintain();
SELECT count(*) FROM pg_class c
 WHERE c.oid IN ('idempotency.tenant_events'::regclass, 'idempotency.tenant_relay_positions'::regclass)
   AND c.relacl::text ~ 'ob_b'}) =~ s/^(?:.*\n)*//r, '0',
	'a grant on them is taken back by maintenance on the coordinator');
$node->psql('obx', q{SELECT * FROM idempotency.tenant_outbox_next('ob_a', 'r', 'orders', 10, NULL, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_b' ]);
like($stderr, qr/permission denied/, 'a role cannot call the relay\'s SQL function itself');

my $pub = sub {
	my ($role, $topic, $payload, $tenant, $db_node) = @_;
	$db_node //= $node;
	return $db_node->safe_psql('obx', qq{
SELECT idem_publish('$topic', '$payload', NULL, NULL, NULL, '$tenant')},
		extra_params => [ '-U', $role ]);
};
# seq of an event id (through Citus, as the superuser)
my $seq_of = sub {
	my ($id) = @_;
	return $node->safe_psql('obx', qq{
SELECT tenant || ':' || seq FROM idempotency.tenant_events WHERE event_id = '$id'});
};
my $next = sub {
	my ($role, $relay, $topic, $max, $generation, $tenant) = @_;
	$generation //= 'NULL';
	$tenant = defined $tenant ? "'$tenant'" : 'NULL';
	return $node->safe_psql('obx', qq{
SELECT string_agg(batch || ':' || tenant || ':' || seq || ':' || (payload->>'n'), ' ')
  FROM idem_outbox_next('$relay', '$topic', $max, $generation, $tenant)},
		extra_params => [ '-U', $role ]);
};
my $ack = sub {
	my ($role, $relay, $topic, $batch, $generation, $tenant) = @_;
	$generation //= 'NULL';
	$tenant = defined $tenant ? "'$tenant'" : 'NULL';
	return $node->safe_psql('obx', qq{
SELECT idem_outbox_ack('$relay', '$topic', $batch, $generation, $tenant)},
		extra_params => [ '-U', $role ]);
};

$node->safe_psql('obx', "$ob_fast SELECT count(*) FROM idem_maintain()");
$pub->('ob_a', 'orders', qq{{"n": "a$_"}}, 'acme') for 1 .. 3;
$pub->('ob_a', 'orders', qq{{"n": "b$_"}}, 'beta') for 1 .. 2;
is($node->safe_psql('obx', q{
SELECT string_agg(tenant || ':' || seq || ':' || (payload->>'n'), ' ' ORDER BY tenant, seq)
  FROM idempotency.tenant_events}), 'acme:1:a1 acme:2:a2 acme:3:a3 beta:1:b1 beta:2:b2',
	'the events of each tenant are numbered densely, in the shard of the tenant');
is($node->safe_psql('obx', q{SELECT to_regclass('idempotency.outbox') IS NULL}), 't',
	'the node\'s own outbox has none of them (it was never made)');

# a batch: a prefix of each tenant, round robin; the same until ack
is($next->('ob_a', 'r', 'orders', 3), '1:acme:1:a1 1:beta:1:b1 1:acme:2:a2',
	'the relay gets each tenant\'s events in order, round robin');
is($next->('ob_a', 'r', 'orders', 100), '1:acme:1:a1 1:beta:1:b1 1:acme:2:a2',
	'the same batch until it is acknowledged');
is($ack->('ob_a', 'r', 'orders', 1), 't', 'ack moves the relay past the batch');
is($ack->('ob_a', 'r', 'orders', 1), 'f', 'a second ack of the batch: false');
is($next->('ob_a', 'r', 'orders', 100), '2:acme:3:a3 2:beta:2:b2',
	'the next batch: the rest of each tenant');
is($ack->('ob_a', 'r', 'orders', 2), 't', 'acknowledged');
is($next->('ob_a', 'r', 'orders', 100), '', 'nothing more');
# one tenant's events only
$pub->('ob_a', 'orders', qq{{"n": "a4"}}, 'acme');
$pub->('ob_a', 'orders', qq{{"n": "b3"}}, 'beta');
is($next->('ob_a', 'solo', 'orders', 100, undef, 'beta'), '1:beta:1:b1 1:beta:2:b2 1:beta:3:b3',
	'a relay of one tenant reads that tenant only');

# generation fence, as the relay without a tenant
is($next->('ob_a', 'r', 'orders', 1, 5), '3:acme:4:a4', 'a generation fences the relay');
# a dead letter of an event of the current batch, listed with the node's own
$node->safe_psql('obx', q{
SELECT idem_outbox_dead_letter('r', 'orders', (SELECT event_id FROM idem_outbox_next('r', 'orders', 1, 5, NULL)),
                               'gone', 3, NULL)}, extra_params => [ '-U', 'ob_a' ]);
is($node->safe_psql('obx', q{
SELECT relay || ' ' || topic || ' ' || (payload->>'n') || ' ' || reason || ' ' || attempts
  FROM idem_outbox_dead_letters('r', 'orders')}, extra_params => [ '-U', 'ob_a' ]),
	'r orders a4 gone 3', 'a dead letter of the tenant outbox, listed by idem_outbox_dead_letters()');
my $b1 = $node->safe_psql('obx', q{SELECT event_id FROM idempotency.tenant_events WHERE payload->>'n' = 'b1'});
$node->psql('obx', qq{
\\set VERBOSITY verbose
SELECT idem_outbox_dead_letter('r', 'orders', '$b1', 'gone', 3, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
like($stderr, qr/ERROR:  55000: event $b1 is not in the current batch of relay "r" of topic "orders"/,
	'an event not in the current batch (acknowledged before): 55000');
$node->psql('obx', q{
\set VERBOSITY verbose
SELECT * FROM idem_outbox_next('r', 'orders', 1, 4, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
like($stderr, qr/ERROR:  ID001: generation 4 of relay "r" of topic "orders" is stale/,
	'a lower generation is refused: ID001');
$node->psql('obx', q{
\set VERBOSITY verbose
SELECT idem_outbox_ack('r', 'orders', 3, NULL, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
like($stderr, qr/ERROR:  ID001: relay "r" of topic "orders" is fenced, and no generation was given/,
	'no generation once fenced: ID001');
is($ack->('ob_a', 'r', 'orders', 3, 5), 't', 'the fenced relay acknowledges with its generation');
is($next->('ob_a', 'r', 'orders', 100, 5), '4:beta:3:b3', 'and goes on');
is($ack->('ob_a', 'r', 'orders', 4, 5), 't', 'acknowledged');

# roles: another role's relay of the same name and topic sees none of the
# first role's events; its own events of the same topic and tenant are
# numbered on their own
is($next->('ob_b', 'r', 'orders', 100), '', 'another role\'s relay sees no event of the first role');
$pub->('ob_b', 'orders', qq{{"n": "x1"}}, 'acme');
is($next->('ob_b', 'r', 'orders', 100), '1:acme:1:x1', 'its own events, numbered on their own');
is($ack->('ob_b', 'r', 'orders', 1), 't', 'acknowledged');
is($next->('ob_a', 'r', 'orders', 100, 5), '', 'the first role\'s relay does not see them');

# with idempotency.outbox_logical, the event is also a logical decoding
# message of the node that writes it, with its tenant and number
$node->safe_psql('obx', q{SELECT pg_create_logical_replication_slot('ob_slot', 'test_decoding')});
$node->safe_psql('obx', q{
SET idempotency.outbox_logical = on;
BEGIN;
SELECT idem_publish('logical', '{"n": "g1"}', 'k', NULL, NULL, 'beta');
COMMIT;
BEGIN;
SELECT idem_publish('logical', '{"n": "rolled-back"}', 'k', NULL, NULL, 'beta');
ROLLBACK;
});
like($node->safe_psql('obx', q{
SELECT string_agg(data, ' ') FROM pg_logical_slot_get_changes('ob_slot', NULL, NULL, 'include-xids', '0')
 WHERE data LIKE 'message:%'}),
	qr/^message: transactional: 1 prefix: idempotency\.outbox, sz: \d+ content:\{"event_id": "[0-9a-f-]+", "role": "[^"]+", "topic": "logical", "key": "k", "headers": null, "payload": \{"n": "g1"\}, "payload_raw": null, "published_at": "[^"]+", "tenant": "beta", "seq": 1\}$/,
	'with outbox_logical, a committed tenant event is a logical decoding message with its tenant and number, a rolled back one is not');
$node->safe_psql('obx', q{SELECT pg_drop_replication_slot('ob_slot')});

# the relays of a role that no longer exists go at the next maintenance
$node->safe_psql('obx', 'CREATE ROLE ob_c LOGIN');
$pub->('ob_c', 'orders', qq{{"n": "c1"}}, 'acme');
is($next->('ob_c', 'gone', 'orders', 10), '1:acme:1:c1', 'a relay of a role about to be dropped');
$node->safe_psql('obx', 'DROP ROLE ob_c');
is($node->safe_psql('obx', qq{
$ob_fast
SELECT count(*) FROM idem_maintain();
SELECT (SELECT count(*) FROM idempotency.tenant_relays WHERE relay = 'gone') || ' '
    || (SELECT count(*) FROM idempotency.tenant_relay_positions WHERE relay = 'gone')}) =~ s/^(?:.*\n)*//r,
	'0 0', 'maintenance deletes the relays of a dropped role');

# a rollback gives its number back: no event, no gap
$node->safe_psql('obx', q{
BEGIN;
SELECT idem_publish('orders', '{"n": "rolled-back"}', NULL, NULL, NULL, 'acme');
ROLLBACK;
}, extra_params => [ '-U', 'ob_a' ]);
is($seq_of->($pub->('ob_a', 'orders', qq{{"n": "a5"}}, 'acme')), 'acme:5',
	'a rolled back publish leaves no event and no gap');

# a second publisher of the same (role, topic, tenant) waits for the first
# to commit, and takes the next number
$node->safe_psql('obx', "$ob_fast SELECT count(*) FROM idem_maintain()");
my $p1 = $node->background_psql('obx', on_error_stop => 0, extra_params => [ '-U', 'ob_a' ]);
my $p2 = $node->background_psql('obx', on_error_stop => 0, extra_params => [ '-U', 'ob_a' ]);
my $p2_pid = $p2->query_safe('SELECT pg_backend_pid()');
my $id1 = $p1->query_safe(q{BEGIN; SELECT idem_publish('orders', '{"n": "a6"}', NULL, NULL, NULL, 'acme')});
$p2->query_until(qr/go\n/, "\\echo go\nSELECT idem_publish('orders', '{\"n\": \"a7\"}', NULL, NULL, NULL, 'acme');\n");
ok( poll_until(
		'the second publisher waits',
		sub {
			$node->safe_psql('obx', qq{
SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $p2_pid}) eq 't';
		}),
	'a second publisher of the tenant\'s topic waits for the first');
$p1->query_safe('COMMIT');
my $id2 = $p2->query('SELECT 1');
$id2 = (split /\n/, $id2)[0];
is($seq_of->($id1) . ' ' . $seq_of->($id2), 'acme:6 acme:7',
	'and takes the next number once the first committed');

# The head row is updated directly once it exists, and made by a statement
# the first time (outbox_tenant.c): a rolled back savepoint gives its number
# back on both paths, and a publisher that waited for one that rolled back
# takes the number it gave back, whether the head was new or not.
my $fresh = sub {
	my ($topic) = @_;
	return $node->safe_psql('obx', qq{
SELECT string_agg(seq || ':' || (payload->>'n'), ' ' ORDER BY seq)
  FROM idempotency.tenant_events WHERE topic = '$topic'});
};
$node->safe_psql('obx', q{
BEGIN;
SAVEPOINT s;
SELECT idem_publish('fresh', '{"n": "f0"}', NULL, NULL, NULL, 'acme');
ROLLBACK TO s;
SELECT idem_publish('fresh', '{"n": "f1"}', NULL, NULL, NULL, 'acme');
SAVEPOINT s;
SELECT idem_publish('fresh', '{"n": "f2"}', NULL, NULL, NULL, 'acme');
ROLLBACK TO s;
SELECT idem_publish('fresh', '{"n": "f3"}', NULL, NULL, NULL, 'acme');
COMMIT;
}, extra_params => [ '-U', 'ob_a' ]);
is($fresh->('fresh'), '1:f1 2:f3',
	'a rolled back savepoint gives its number back, on a new head and on an existing one');
my $waits = sub {
	my ($what) = @_;
	return poll_until($what, sub {
		$node->safe_psql('obx', qq{
SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $p2_pid}) eq 't';
	});
};
for my $round (1 .. 2)
{
	$p1->query_safe(qq{BEGIN; SELECT idem_publish('fresh2', '{"n": "gone$round"}', NULL, NULL, NULL, 'acme')});
	$p2->query_until(qr/go\n/, "\\echo go\nSELECT idem_publish('fresh2', '{\"n\": \"w$round\"}', NULL, NULL, NULL, 'acme');\n");
	ok($waits->("publisher $round waits"),
		$round == 1 ? 'a second first publisher of a new head waits for the first'
		  : 'a second publisher waits for the first');
	$p1->query_safe('ROLLBACK');
	$p2->query('SELECT 1');
}
is($fresh->('fresh2'), '1:w1 2:w2',
	'and takes the number the first gave back by rolling back');
# under REPEATABLE READ, a head committed since the snapshot is a
# serialization failure, as INSERT ... ON CONFLICT DO UPDATE's
$p2->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
$pub->('ob_a', 'fresh2', qq{{"n": "w3"}}, 'acme');
my $rr = $p2->query(q{SELECT idem_publish('fresh2', '{"n": "rr"}', NULL, NULL, NULL, 'acme')});
like($p2->{stderr}, qr/could not serialize access due to concurrent update/,
	'a REPEATABLE READ publisher fails (40001) after another committed since its snapshot');
$p2->query('ROLLBACK');
is($fresh->('fresh2'), '1:w1 2:w2 3:w3', 'and writes nothing');

# A backend keeps the last shards of the heads it checked (columns, primary
# key), each until an invalidation of it: a column's type a DBA changed on
# a shard it checked, while it wrote another shard, is seen at its next
# publish there (55000), and its change back lets the publishes go on.
my ($ta, $tb) = split / /, $node->safe_psql('obx', q{
SELECT string_agg(t, ' ' ORDER BY t) FROM (
  SELECT DISTINCT ON (s) t FROM (
    SELECT 'k' || i AS t,
           get_shard_id_for_distribution_column('idempotency.tenant_outbox_heads', 'k' || i) AS s
      FROM generate_series(1, 60) i) x
   WHERE EXISTS (SELECT FROM pg_dist_placement p JOIN pg_dist_local_group l USING (groupid)
                  WHERE p.shardid = x.s)
   ORDER BY s, t LIMIT 2) y});
ok(defined $tb, "two tenants of two local shards of the heads: $ta, $tb");
my $sa = $node->safe_psql('obx', qq{
SELECT 'idempotency.tenant_outbox_heads_' || get_shard_id_for_distribution_column('idempotency.tenant_outbox_heads', '$ta')});
$p1->query_safe(qq{SELECT idem_publish('shards', '{}', NULL, NULL, NULL, '$_')}) for ($ta, $tb, $ta, $tb);
$node->safe_psql('obx', "SET citus.enable_manual_changes_to_shards = on; ALTER TABLE $sa ALTER COLUMN topic TYPE varchar");
$p1->query(qq{\\set VERBOSITY verbose
SELECT idem_publish('shards', '{}', NULL, NULL, NULL, '$ta')});
like($p1->{stderr}, qr/ERROR:  55000: table "idempotency.tenant_outbox_heads" does not have the columns and primary key the extension made/,
	'a column type changed on a heads shard checked before is seen at the next publish there (55000)');
$node->safe_psql('obx', "SET citus.enable_manual_changes_to_shards = on; ALTER TABLE $sa ALTER COLUMN topic TYPE text");
$p1->{stderr} = '';
$p1->query_safe(qq{SELECT idem_publish('shards', '{}', NULL, NULL, NULL, '$_')}) for ($ta, $tb);
is($node->safe_psql('obx', q{
SELECT string_agg(tenant || ':' || seq, ' ' ORDER BY tenant, seq) FROM idempotency.tenant_events WHERE topic = 'shards'}),
	"$ta:1 $ta:2 $ta:3 $tb:1 $tb:2 $tb:3", 'and once it is changed back, the numbers go on');

# A DBA's trigger on a heads shard fires at every publish there, not only at
# a head's first (the statement's insert): a shard with a trigger, row
# security or CHECK constraint is written with the statement, as the
# events' partitions are.
$node->safe_psql('obx', qq{
CREATE TABLE public.head_audit (op text, last_seq bigint);
CREATE FUNCTION public.head_audit() RETURNS trigger LANGUAGE plpgsql
  AS \$\$BEGIN INSERT INTO public.head_audit VALUES (TG_OP, NEW.last_seq); RETURN NEW; END\$\$;
SET citus.enable_manual_changes_to_shards = on;
CREATE TRIGGER head_audit AFTER INSERT OR UPDATE ON $sa
  FOR EACH ROW EXECUTE FUNCTION public.head_audit();
});
$p1->query_safe(qq{SELECT idem_publish('audited', '{}', NULL, NULL, NULL, '$ta')}) for 1 .. 3;
is($node->safe_psql('obx', q{
SELECT string_agg(op || ':' || last_seq, ' ' ORDER BY last_seq) FROM public.head_audit}),
	'INSERT:1 UPDATE:2 UPDATE:3', 'a DBA\'s trigger on a heads shard fires at every publish');
$node->safe_psql('obx', "SET citus.enable_manual_changes_to_shards = on; DROP TRIGGER head_audit ON $sa");
$p1->quit;
$p2->quit;

# A force_logical move of acme's shard carries its unrelayed events and
# their numbers; the relay then reads the rest from the new node, none lost,
# none twice.
$node->safe_psql('obx', "$ob_fast SELECT count(*) FROM idem_maintain()");
my $su = $node->safe_psql('obx', 'SELECT current_user');
$pub->($su, 'moved', qq{{"n": "m$_"}}, 'acme') for 1 .. 4;
$pub->($su, 'moved', qq{{"n": "n$_"}}, 'beta') for 1 .. 2;
is($next->($su, 'r', 'moved', 3), '1:acme:1:m1 1:beta:1:n1 1:acme:2:m2',
	'a batch handed out before the move');
$pub->('ob_a', 'orders', qq{{"n": "a$_"}}, 'acme') for 8 .. 9;
# and a key of the ordinary role, paid before the move
my $ob_pay = q{
BEGIN;
SELECT status FROM idem_claim('pay-1', scope => 'acme', ttl => '10 seconds');
SELECT idem_complete('pay-1', 201, '{"id": 1}', scope => 'acme');
COMMIT;
};
like($node->safe_psql('obx', $ob_pay, extra_params => [ '-U', 'ob_a' ]), qr/^claimed\n?$/,
	'an ordinary role\'s key of acme, paid before the move');
$node->safe_psql('obx', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.tenant_events', 'acme'),
                                  '$host', $port, '$host2', $port2,
                                  shard_transfer_mode => 'force_logical');
});
is($node->safe_psql('obx', q{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
 WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.tenant_events', 'acme')}),
	$port2, 'acme\'s outbox shard moved to the second node');
$node->psql('obx', q{
\set VERBOSITY verbose
SELECT idem_publish('moved', '{"n": "nowhere"}', NULL, NULL, NULL, 'acme')},
	stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  0A000: /, 'a publish for acme on the coordinator is refused (0A000)');
is($seq_of->($pub->($su, 'moved', qq{{"n": "m5"}}, 'acme', $node2)), 'acme:5',
	'on the new node, acme\'s numbers go on');
$node2->psql('obx', q{
\set VERBOSITY verbose
SELECT * FROM idem_outbox_next('r', 'moved', 10, NULL, NULL)},
	stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/ERROR:  0A000: the outbox of the tenants is relayed on the Citus coordinator/,
	'a relay with a tenant on a worker is refused (0A000)');
is($next->($su, 'r', 'moved', 100), '1:acme:1:m1 1:beta:1:n1 1:acme:2:m2',
	'the batch handed out before the move, again');
is($ack->($su, 'r', 'moved', 1), 't', 'acknowledged');
is($next->($su, 'r', 'moved', 100), '2:acme:3:m3 2:beta:2:n2 2:acme:4:m4 2:acme:5:m5',
	'the relay reads the rest from the new node: none lost, none twice');
is($ack->($su, 'r', 'moved', 2), 't', 'acknowledged');
# An ordinary role, whose OID differs between the nodes: its heads, events
# and keys moved are its own on the new node (idempotency.role_ref).
is($seq_of->($pub->('ob_a', 'orders', qq{{"n": "a10"}}, 'acme', $node2)), 'acme:10',
	'an ordinary role\'s numbers go on on the new node');
is($next->('ob_a', 'r', 'orders', 100, 5), '5:acme:5:a5 5:acme:6:a6 5:acme:7:a7 5:acme:8:a8 5:acme:9:a9 5:acme:10:a10',
	'and its relay reads them from there');
# and its key, paid before the move, replays there (the role column of
# the distributed tables is an idempotency.role_ref, copied by name)
is($node2->safe_psql('obx', q{SELECT status FROM idem_claim('pay-1', scope => 'acme', ttl => '10 seconds')},
		extra_params => [ '-U', 'ob_a' ]), 'completed',
	'an ordinary role\'s key paid before the move replays on the new node');

# Maintenance: the partition of an acknowledged event is dropped once the
# retention has passed, that of an event not acknowledged is kept, until
# the max age, when it is dropped and the relay is told of the loss.
my $part_of = sub {
	my ($id) = @_;
	my $at = $node->safe_psql('obx', qq{
SELECT published_at FROM idempotency.tenant_events WHERE event_id = '$id'});
	return $node->safe_psql('obx', qq{
SELECT p.partition || ' ' || p.upper_bound FROM idempotency.tenant_event_partitions p
 WHERE '$at' >= p.lower_bound AND '$at' < p.upper_bound});
};
# a partition of its own for each of the two events below: one that
# starts after every event published so far
my $last_end = (split / /, $part_of->($pub->($su, 'moved', qq{{"n": "n3"}}, 'beta')), 2)[1];
ok( poll_until(
		'the partition of the last event so far ended',
		sub {
			$node->safe_psql('obx', qq{SELECT clock_timestamp() > '$last_end'}) eq 't';
		}),
	'the partition of the last event so far ended');
$node->safe_psql('obx', "$ob_fast SELECT count(*) FROM idem_maintain()");
is($next->('ob_a', 'slow', 'ledger', 10), '', 'a relay of topic "ledger" that will not acknowledge');
my ($done_part, $done_end) = split / /, $part_of->($pub->('ob_a', 'done', qq{{"n": "d1"}}, 'beta')), 2;
is($next->('ob_a', 'd', 'done', 100), '1:beta:1:d1', 'an event relayed');
is($ack->('ob_a', 'd', 'done', 1), 't', 'and acknowledged');
ok( poll_until(
		'the partition of the acknowledged event ended',
		sub {
			$node->safe_psql('obx', qq{SELECT clock_timestamp() > '$done_end'}) eq 't';
		}),
	'the partition of the acknowledged event ended');
my ($kept_part, $kept_end) = split / /, $part_of->($pub->('ob_a', 'ledger', qq{{"n": "l1"}}, 'beta')), 2;
isnt($kept_part, $done_part, 'an event not acknowledged, in a later partition');
ok( poll_until(
		'the partition of the unacknowledged event ended, and 1 s more',
		sub {
			$node->safe_psql('obx', qq{SELECT clock_timestamp() > '$kept_end'::timestamptz + interval '1.1 s'}) eq 't';
		}),
	'both partitions ended more than the retention ago');
$node->safe_psql('obx', qq{
$ob_fast
SET idempotency.outbox_retention = '1s';
SELECT count(*) FROM idem_maintain();
});
is($node->safe_psql('obx', qq{
SELECT (SELECT count(*) FROM idempotency.tenant_event_partitions WHERE partition = '$done_part') || ' '
    || (SELECT count(*) FROM idempotency.tenant_event_partitions WHERE partition = '$kept_part') || ' '
    || (SELECT count(*) FROM idempotency.tenant_events WHERE topic = 'ledger')}),
	'0 1 1', 'maintenance drops the acknowledged partition and keeps the unacknowledged one');

# A partition kept for a relay that has not acknowledged its events is
# found so without locking it: maintenance's ACCESS EXCLUSIVE on its
# shards (held while it reads all their events) would hold up every
# role's relay reading the outbox, run after run.  A reader of beta's
# shard of the kept partition, left open, is not waited for.
my ($kept_shard, $kept_port) = split /\|/, $node->safe_psql('obx', qq{
SELECT s.shardid || '|' || n.nodeport
  FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)
 WHERE s.shardid = get_shard_id_for_distribution_column('idempotency.$kept_part', 'beta')});
my $kept_node = $kept_port == $port ? $node : $node2;
my $shard_reader = $kept_node->background_psql('obx', on_error_stop => 0);
$shard_reader->query_safe(qq{BEGIN; SELECT count(*) FROM idempotency.${kept_part}_$kept_shard});
my $log_at = -s $node->logfile;
$node->safe_psql('obx', qq{
$ob_fast
SET idempotency.outbox_retention = '1s';
SELECT count(*) FROM idem_maintain();
});
unlike(slurp_file($node->logfile, $log_at), qr/could not drop partition "idempotency\.$kept_part"/,
	'a partition kept for its relay is not locked: an open reader of its shard is not waited for');
is($node->safe_psql('obx', qq{
SELECT count(*) FROM idempotency.tenant_event_partitions WHERE partition = '$kept_part'}),
	'1', 'and it is kept');
$shard_reader->query_safe('COMMIT');
$shard_reader->quit;
$node->safe_psql('obx', qq{
$ob_fast
SET idempotency.outbox_retention = '1s';
SET idempotency.outbox_max_age = '1s';
SELECT count(*) FROM idem_maintain();
});
is($node->safe_psql('obx', qq{
SELECT (SELECT count(*) FROM idempotency.tenant_event_partitions WHERE partition = '$kept_part') || ' '
    || (SELECT count(*) FROM idempotency.tenant_events WHERE topic = 'ledger')}),
	'0 0', 'past the max age, it is dropped');
$node->psql('obx', q{
\set VERBOSITY verbose
SELECT * FROM idem_outbox_next('slow', 'ledger', 10, NULL, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
like($stderr, qr/ERROR:  ID003: relay "slow" of topic "ledger" lost 1 events that expired before it acknowledged them\n.*tenant beta: 1 to 1.*the loss is batch 1/s,
	'the relay is told of the loss, per tenant (ID003)');
is($ack->('ob_a', 'slow', 'ledger', 1), 't', 'the loss is acknowledged');
$pub->('ob_a', 'ledger', qq{{"n": "l2"}}, 'beta');
is($next->('ob_a', 'slow', 'ledger', 10), '2:beta:2:l2', 'and the relay goes on');

# A loss is recorded per tenant as the numbers from the lowest to the
# highest of a dropped partition's events.  An event whose number is in
# that range but which was in another partition (its publisher's clock
# behind or ahead of the others': another node after a move, a clock
# stepped back near a partition's end) still exists: once the loss is
# acknowledged the relay goes on at the first event kept above its
# acknowledged number, and relays it.  (It skipped it: the ack of the loss
# moved the relay to the range's end.)  Such an event is made here by
# moving the middle one of three into the last partition made ahead (its
# published_at updated as the superuser: what such a clock would have
# given it), not by changing a clock.
is($next->('ob_a', 'skew', 'skewed', 10), '', 'a relay of topic "skewed" that will not acknowledge');
my ($skew_part, $skew_end) = split / /, $part_of->($pub->('ob_a', 'skewed', qq{{"n": "s1"}}, 'beta')), 2;
my $s2 = $pub->('ob_a', 'skewed', qq{{"n": "s2"}}, 'beta');
$pub->('ob_a', 'skewed', qq{{"n": "s3"}}, 'beta');
$node->safe_psql('obx', qq{
UPDATE idempotency.tenant_events
   SET published_at = (SELECT max(lower_bound) FROM idempotency.tenant_event_partitions)
 WHERE event_id = '$s2'});
isnt((split / /, $part_of->($s2))[0], $skew_part, 'the middle event is in a later partition');
ok( poll_until(
		'the partition of the first and third events ended, and 1 s more',
		sub {
			$node->safe_psql('obx', qq{SELECT clock_timestamp() > '$skew_end'::timestamptz + interval '1.1 s'}) eq 't';
		}),
	'the partition of the first and third events is past the max age');
$node->safe_psql('obx', qq{
$ob_fast
SET idempotency.outbox_retention = '1s';
SET idempotency.outbox_max_age = '1s';
SELECT count(*) FROM idem_maintain();
});
is($node->safe_psql('obx', qq{
SELECT (SELECT count(*) FROM idempotency.tenant_event_partitions WHERE partition = '$skew_part') || ' '
    || (SELECT string_agg(payload->>'n', ' ') FROM idempotency.tenant_events WHERE topic = 'skewed')}),
	'0 s2', 'past the max age, the partition of the first and third events is dropped');
$node->psql('obx', q{
\set VERBOSITY verbose
SELECT * FROM idem_outbox_next('skew', 'skewed', 10, NULL, NULL)},
	stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
like($stderr, qr/ERROR:  ID003: relay "skew" of topic "skewed" lost 2 events that expired before it acknowledged them\n.*tenant beta: 1 to 3.*the loss is batch 1/s,
	'the loss is reported as the range of numbers, with the number of events dropped');
is($ack->('ob_a', 'skew', 'skewed', 1), 't', 'the loss is acknowledged');
is($next->('ob_a', 'skew', 'skewed', 10), '2:beta:2:s2',
	'the event in the loss\'s range that was not dropped is relayed, not skipped');
is($ack->('ob_a', 'skew', 'skewed', 2), 't', 'acknowledged');
is($next->('ob_a', 'late', 'skewed', 10), '1:beta:2:s2',
	'a relay that starts after the drop starts at the first event kept, with no loss');
$pub->('ob_a', 'skewed', qq{{"n": "s4"}}, 'beta');
is($next->('ob_a', 'skew', 'skewed', 10), '3:beta:4:s4', 'and the relay goes on');

# Another role's relay left in an open transaction on the coordinator
# holds the tenant outbox's table (AccessShareLock, to its end): the
# partitions ahead are still made (ATTACH PARTITION, which takes SHARE
# UPDATE EXCLUSIVE on the table), so every role's publishes keep finding
# one.  (CREATE TABLE ... PARTITION OF waited for the relay's lock and
# gave up on every run: once the premade ones ran out, every publish with
# a tenant failed.)
my $ahead = q{SELECT max(upper_bound) FROM idempotency.tenant_event_partitions};
my $ahead_before = $node->safe_psql('obx', $ahead);
my $relay_holder = $node->background_psql('obx', on_error_stop => 0, extra_params => [ '-U', 'ob_b' ]);
$relay_holder->query_safe(q{BEGIN; SELECT count(*) FROM idem_outbox_next('held', 'held', 10, NULL, NULL)});
$node->safe_psql('obx', qq{
$ob_fast
SET idempotency.premake = 16;
SELECT count(*) FROM idem_maintain();
});
my $ahead_after = $node->safe_psql('obx', $ahead);
is($node->safe_psql('obx', qq{SELECT '$ahead_after'::timestamptz > '$ahead_before'::timestamptz}), 't',
	'another role\'s relay left in an open transaction does not keep the tenant outbox\'s partitions from being made');
is($node->safe_psql('obx', qq{
SELECT count(*) FILTER (WHERE d.colocationid IS DISTINCT FROM e.colocationid) || ' '
    || count(*) FILTER (WHERE c.relreplident <> 'd' OR NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)) || ' '
    || count(*) FILTER (WHERE c.relacl::text LIKE '%ob_b%')
  FROM idempotency.tenant_event_partitions t
  JOIN pg_class c ON c.oid = format('idempotency.%I', t.partition)::regclass
  LEFT JOIN pg_dist_partition d ON d.logicalrelid = c.oid
  CROSS JOIN (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'idempotency.tenant_events'::regclass) e}),
	'0 0 0', 'every partition is distributed co-located, with its primary key as replica identity, granted to nobody');
$relay_holder->query_safe('COMMIT');
$relay_holder->quit;

# The relay's statements on the tenant outbox run on the workers as the
# text Citus deparsed on the coordinator, read there with the settings of
# the caller's SET LOCAL commands, which Citus sends the workers with
# citus.propagate_set_commands = 'local' (any role may set it): the
# storage owner's statements are read there with the settings pinned
# on the coordinator, not the caller's.  A caller's search_path found its
# own type "text" (a domain whose check runs its function) for the text's
# casts, run on the worker by the storage owner; its
# standard_conforming_strings = off ended a literal at a backslash of the
# topic, the rest of the topic read as SQL.
$node->safe_psql('obx', 'CREATE SCHEMA ob_s AUTHORIZATION ob_a');
$node->safe_psql('obx', q{
CREATE FUNCTION ob_s.check_text(v pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'ob_a''s function ran as %', current_user;
END $f$;
CREATE DOMAIN ob_s.text AS pg_catalog.text CHECK (ob_s.check_text(VALUE));
}, extra_params => [ '-U', 'ob_a' ]);
is($node2->safe_psql('obx', q{SELECT count(*) FROM pg_type WHERE typname = 'text' AND typnamespace = 'ob_s'::regnamespace}),
	'1', 'ob_a\'s type "text" is on the second node too');
$node->psql('obx', q{
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL search_path = ob_s, pg_catalog;
SELECT count(*) FROM idem_outbox_next('sp', 'sp', 10, NULL, NULL);
SHOW search_path;
COMMIT;
}, stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
is("$stdout|$stderr", "0\nob_s, pg_catalog|",
	'a relay\'s statements on the workers do not read names by the caller\'s search_path (and the caller\'s is back after the call)');
$node->psql('obx', q{
BEGIN;
SET LOCAL citus.propagate_set_commands = 'local';
SET LOCAL standard_conforming_strings = off;
SELECT count(*) FROM idem_outbox_next('sp', 'a' || chr(92), 10, NULL, NULL);
COMMIT;
}, stdout => \$stdout, stderr => \$stderr, extra_params => [ '-U', 'ob_a' ]);
is("$stdout|$stderr", "0|",
	'nor literals by the caller\'s standard_conforming_strings');

# Roles across nodes (src/role_ref.c; doc/scale-out.md, "Roles across
# nodes"): Citus makes a role on every node by its name, and each node
# gives it an OID of its own; a shard move copies the rows.  The role
# column of the distributed tables is an idempotency.role_ref, copied by
# the role's name, so an ordinary role's key, message id, stream position
# and producer sequence moved with its tenant are its own on the new node
# (a regrole column went as the source node's OID: the role did not find
# its key there, and paid it again), and a role of the new node that has
# the source node's OID of it finds nothing.  Here rr_a has another OID on
# each node (the first node's OID counter is moved past the second's
# first), and the second node's rr_victim has the first node's OID of
# rr_a.  Each node hands out OIDs from one counter, which lo_create()
# moves on.
my $next_oid = sub {
	my ($n) = @_;
	return $n->safe_psql('postgres', q{SELECT lo_create(0) AS o \gset
SELECT lo_unlink(:o); SELECT :o});
};
my $advance_to = sub {
	my ($n, $target) = @_;
	$n->safe_psql('postgres', qq{
DO \$\$
BEGIN
    WHILE lo_create(0) < $target LOOP
    END LOOP;
END
\$\$;
SELECT lo_unlink(oid) FROM pg_largeobject_metadata;
});
};
for my $n ($node, $node2)
{
	$n->safe_psql('postgres', 'CREATE DATABASE roles');
	$n->safe_psql('roles', 'CREATE EXTENSION citus');
}
$node->safe_psql('roles', qq{
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
SELECT idempotency.citus_distribute('payments');
SELECT citus_add_node('$host2', $port2);
});
is($node->safe_psql('roles', q{
SELECT string_agg(a.attrelid::regclass::text || '.' || a.atttypid::regtype::text, ' ' ORDER BY a.attrelid::regclass::text)
  FROM pg_attribute a
 WHERE a.attrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass,
                      'idempotency.tenant_positions'::regclass, 'idempotency.tenant_sequences'::regclass)
   AND a.attname = 'role'}),
	'idempotency.keys.idempotency.role_ref idempotency.messages.idempotency.role_ref idempotency.tenant_positions.idempotency.role_ref idempotency.tenant_sequences.idempotency.role_ref',
	'the role column of every table citus_distribute() distributes is an idempotency.role_ref');
$advance_to->($node, $next_oid->($node2) + 100);
$node->safe_psql('roles', 'CREATE ROLE rr_a LOGIN; CREATE ROLE rr_gone LOGIN');
my $oid_a = $node->safe_psql('roles', q{SELECT 'rr_a'::regrole::oid});
my $oid_a2 = $node2->safe_psql('roles', q{SELECT 'rr_a'::regrole::oid});
ok($oid_a2 ne '' && $oid_a2 < $oid_a, "rr_a has another OID on each node ($oid_a, $oid_a2)");
$advance_to->($node2, $oid_a - 1);
$node2->safe_psql('postgres', 'CREATE ROLE rr_victim LOGIN');
is($node2->safe_psql('postgres', q{SELECT 'rr_victim'::regrole::oid}), $oid_a,
	'the second node\'s rr_victim has the first node\'s OID of rr_a');

# rr_a's key paid, message id consumed, position and sequence written for
# tenant acme on the first node; rr_gone's key, and rr_gone dropped
my $pay = sub {
	my ($key) = @_;
	return qq{
BEGIN;
SELECT status FROM idem_claim('$key', scope => 'acme', ttl => '1 hour');
SELECT idem_complete('$key', 201, '{"id": 1}', scope => 'acme');
COMMIT;
};
};
my $replay = sub {
	my ($key) = @_;
	return qq{
BEGIN;
SELECT status FROM idem_claim('$key', scope => 'acme', ttl => '1 hour');
ROLLBACK;
};
};
my $as = sub {
	my ($n, $role, $sql) = @_;
	return $n->safe_psql('roles', $sql, extra_params => [ '-U', $role ]);
};
like($as->($node, 'rr_a', $pay->('pay-1')), qr/^claimed\n?$/, 'rr_a pays key pay-1 of acme on the first node');
is($as->($node, 'rr_a', q{
SELECT idem_consume_message('events', 'm-1', ttl => NULL, tenant => 'acme');
SELECT * FROM idem_advance('c', 's', 0, 0, 9, NULL, 'acme');
SELECT idem_sequence('c', 'p', 1, 5, false, 'acme');
}), "t\n0|9\nnew", 'and consumes message m-1, advances a position and a producer sequence of acme');
like($as->($node, 'rr_gone', $pay->('gone-1')), qr/^claimed\n?$/, 'rr_gone pays key gone-1 of acme');
$node->safe_psql('roles', 'DROP ROLE rr_gone');

# a force_logical move of acme's shards to the second node
$node->safe_psql('roles', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host', $port, '$host2', $port2,
                                  shard_transfer_mode => 'force_logical');
});
is($node->safe_psql('roles', q{
SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
 WHERE p.shardid = get_shard_id_for_distribution_column('idempotency.tenant_sequences', 'acme')}),
	$port2, 'acme\'s shards moved to the second node (force_logical)');
is($as->($node2, 'rr_a', $replay->('pay-1')), 'completed',
	'rr_a\'s key paid before a force_logical move replays on the new node');
is($as->($node2, 'rr_a', q{
SELECT idem_consume_message('events', 'm-1', ttl => NULL, tenant => 'acme');
SELECT part || ':' || next_offset FROM idem_positions('c', 's', 'acme');
SELECT idem_sequence('c', 'p', 1, 5, false, 'acme');
}), "f\n0:10\nduplicate",
	'its message id is a duplicate there, and its position and producer sequence are read back');
is($as->($node2, 'rr_victim', $replay->('pay-1') . q{
SELECT idem_consume_message('events', 'm-1', ttl => NULL, tenant => 'acme');
SELECT count(*) FROM idem_positions('c', 's', 'acme');
SELECT idem_sequence('c', 'p', 1, 5, false, 'acme');
}), "claimed\nt\n0\nnew",
	'a role of the new node with the source node\'s OID of rr_a finds none of its key, message id, position, sequence');
is($node2->safe_psql('roles', qq{
SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme' AND role::oid = 0) || ' '
    || (SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme' AND role::oid = $oid_a) || ' '
    || (SELECT count(*) FROM idempotency.keys WHERE tenant = 'acme' AND role = 'rr_a'::regrole)}),
	'1 0 1', 'the row of a role dropped before the move arrives as 0, which no role has; none under the source OID');

# and a block_writes move back, of a key rr_a paid on the second node
like($as->($node2, 'rr_a', $pay->('pay-2')), qr/^claimed\n?$/, 'rr_a pays key pay-2 of acme on the second node');
$node->safe_psql('roles', qq{
SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('idempotency.keys', 'acme'),
                                  '$host2', $port2, '$host', $port,
                                  shard_transfer_mode => 'block_writes');
});
is($as->($node, 'rr_a', $replay->('pay-1') . $replay->('pay-2') . q{
SELECT idem_consume_message('events', 'm-1', ttl => NULL, tenant => 'acme');
SELECT part || ':' || next_offset FROM idem_positions('c', 's', 'acme');
SELECT idem_sequence('c', 'p', 1, 5, false, 'acme');
}), "completed\ncompleted\nf\n0:10\nduplicate",
	'after a block_writes move back, rr_a\'s keys replay, its message id is a duplicate, its position and sequence are read back');

$node2->stop;

$node->stop;
done_testing();
