
# test/t/038_citus_ledgers.pl -- idempotency.citus_ledgers (issue 37): a
# call on a key ledger distributed by Citus reads and writes the local
# shard of its tenant, and only that call does.  Whatever the same backend
# runs next (an export, maintenance), after a call that returned, failed,
# or failed inside a savepoint, reads the node's own ledger again.
#
# One node with Citus preloaded, holding the shards itself (the
# coordinator, shouldhaveshards).  Skipped where Citus is not installed
# for the server under test (test/lib/citus.sh builds it for CI).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('citus_ledgers');
my $pkglibdir = $node->config_data('--pkglibdir');
plan skip_all => "Citus is not installed in $pkglibdir"
  unless -f "$pkglibdir/citus.so";

$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'citus'
max_worker_processes = 16
citus.shard_count = 4
});
$node->start;

my $host = $node->host;
my $port = $node->port;
$node->safe_psql('postgres', qq{
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('$host', $port);
SELECT citus_set_node_property('$host', $port, 'shouldhaveshards', true);
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text NOT NULL, id bigserial, PRIMARY KEY (tenant, id));
SELECT create_distributed_table('payments', 'tenant');
SELECT * FROM idem_maintain();
});

$node->safe_psql('postgres', q{
SELECT create_distributed_table('idempotency.keys', 'kept_scope', colocate_with => 'payments');
});

# A key of the node's own ledger: written with the setting off (the C path
# then never looks at Citus), it goes to the local table's partitions, not
# to a shard.  Exports show keys by their response code: 200 for this one,
# 201 for those written by routed calls.
$node->safe_psql('postgres', q{
BEGIN;
SELECT status FROM idem_claim('own-key', scope => 'acme');
SELECT idem_complete('own-key', 200, '{"own": true}', scope => 'acme');
COMMIT;
});

my $export = q{SELECT coalesce(string_agg(k.response_code::text, ',' ORDER BY k.response_code), 'none')
	FROM idempotency.export_keys() AS k};
is($node->safe_psql('postgres', $export), '200',
	'the node\'s own ledger holds the key written with the setting off');

# A routed call writes to the tenant's shard: the shard has the key, the
# node's own ledger does not.
my $routed = $node->safe_psql('postgres', qq{
SET idempotency.citus_ledgers = on;
BEGIN;
SELECT status FROM idem_claim('routed-key', scope => 'acme');
SELECT idem_complete('routed-key', 201, '{"routed": true}', scope => 'acme');
COMMIT;
RESET idempotency.citus_ledgers;
$export;
});
is((split /\n/, $routed)[-1], '200',
	'an export after routed calls in the same backend reads the own ledger, not the shard');
is($node->safe_psql('postgres', $export), '200',
	'the routed key is not in the own ledger');
is($node->safe_psql('postgres', q{
SET idempotency.citus_ledgers = on;
SELECT status || ' ' || response_code FROM idem_claim('routed-key', scope => 'acme');
}), 'completed 201', 'a routed call finds the routed key in the shard');

# A routed call that fails: idem_complete() of a key never claimed is
# refused after the routing.  The next transaction of the backend, and the
# rest of a transaction whose savepoint rolled the failure back, read the
# own ledger.
my ($stdout, $stderr);
$node->psql('postgres', qq{
SET idempotency.citus_ledgers = on;
SELECT idem_complete('never-claimed', 200, scope => 'acme');
RESET idempotency.citus_ledgers;
$export;
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/is not claimed/, 'the routed call failed');
is($stdout, '200',
	'an export in the next transaction after a failed routed call reads the own ledger');

$node->psql('postgres', qq{
BEGIN;
SET LOCAL idempotency.citus_ledgers = on;
SAVEPOINT s;
SELECT idem_complete('never-claimed', 200, scope => 'acme');
ROLLBACK TO SAVEPOINT s;
SET LOCAL idempotency.citus_ledgers = off;
$export;
COMMIT;
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/is not claimed/, 'the routed call in the savepoint failed');
is($stdout, '200',
	'an export after a routed call rolled back to a savepoint reads the own ledger');

# The same through PL/pgSQL's exception block (a subtransaction), then
# maintenance and an export in the same backend.
is($node->safe_psql('postgres', qq{
SET idempotency.citus_ledgers = on;
DO \$\$
BEGIN
  PERFORM idem_complete('never-claimed', 200, scope => 'acme');
EXCEPTION WHEN object_not_in_prerequisite_state THEN NULL;
END \$\$;
SELECT status FROM idem_claim('routed-2', scope => 'acme', lease => '1 hour');
RESET idempotency.citus_ledgers;
SELECT count(*) >= 0 FROM idem_maintain();
$export;
}), "claimed\nt\n200",
	'an export after routed calls (one failed in an exception block) and maintenance reads the own ledger');

# Partitions of the distributed ledger are made by maintenance on the
# coordinator (Citus makes their shards), with a replica identity so that
# Citus can move them logically; a routed call that lacks one does not make
# it.  The newest partition is dropped, and made again by idem_maintain().
my $newest = $node->safe_psql('postgres', q{
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'idempotency.keys'::regclass
 ORDER BY pg_get_expr(c.relpartbound, c.oid) DESC LIMIT 1});
$node->safe_psql('postgres', "DROP TABLE idempotency.$newest");
is($node->safe_psql('postgres', q{SELECT partitions_created >= 1 FROM idem_maintain()}),
	't', 'maintenance on the coordinator made the dropped partition again');
is($node->safe_psql('postgres', qq{
SELECT string_agg(DISTINCT c.relreplident::text, ',')
  FROM pg_class c
 WHERE c.relname = '$newest' OR c.relname ~ ('^' || '$newest' || '_[0-9]+\$')}),
	'f', 'the partition made by maintenance and its shards have a replica identity (FULL)');

$node->psql('postgres', q{
\set VERBOSITY verbose
SET idempotency.citus_ledgers = on;
SELECT status FROM idem_claim('far', scope => 'acme', ttl => '29 days', lease => '1 hour');
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/ERROR:  55000: the ledger shard "keys_[0-9]+" has no partition for this key's expiry/,
	'a routed call that lacks a partition does not make one: 55000');

# The setting on in a database without Citus' functions: refused, naming
# what is missing, and nothing written.
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('plain', 'CREATE EXTENSION idempotency');
$node->psql('plain', q{
\set VERBOSITY verbose
SET idempotency.citus_ledgers = on;
SELECT status FROM idem_claim('k', scope => 'acme', lease => '1 hour');
}, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
like($stderr, qr/ERROR:  55000: idempotency.citus_ledgers is on, but Citus' function pg_catalog.get_shard_id_for_distribution_column\(\) is not found/,
	'the setting on without Citus: 55000, naming the function');
is($node->safe_psql('plain', $export), 'none', 'nothing written');

$node->stop;
done_testing();
