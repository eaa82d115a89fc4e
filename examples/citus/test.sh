#!/usr/bin/env bash
#
# examples/citus/test.sh -- scale-out test on a real Citus cluster: a
# coordinator and two workers on this machine, each running the
# idempotency extension; payments distributed by tenant, create_payment()
# delegated to the tenant's worker.  Exactly once through concurrent
# duplicates, calls that are not delegated, and shard moves under load.
#
#   bash examples/citus/test.sh
#
# Run by the "examples" suite of test/run-all.sh, which builds Citus from
# its pinned release (test/lib/citus.sh: 13.2.2 for PostgreSQL 15, 14.0.1
# for 17 and 18; downloaded, or from a local copy), installs it, and sets
# SRC, PG_CONFIG and EXAMPLES_PORT_BASE.  When Citus cannot be had there (no
# network and no local copy), it says why in IDEM_CITUS_UNAVAILABLE, and
# this test is skipped (exit 77) with that reason, or fails if
# IDEM_NO_SKIP=1 (test/lib/skip.sh).  Standalone, Citus must be installed
# for $PG_CONFIG already (as root: . test/lib/citus.sh; citus_ensure), and
# the servers run as $CLUSTER_USER (default postgres) when run as root.
#
# Layout (unix sockets only, ports EXAMPLES_PORT_BASE .. +2; +3 .. +5 for
# distributed-ledger/run.sh):
#   coordinator   database postgres: schema.sql, move.sql
#   worker1, worker2
#
# Steps: start the servers with shared_preload_libraries = 'citus,
# idempotency' and idempotency.key_memory on (expired keys remembered, and
# moved with their tenant), make the cluster, check what Citus did with CREATE
# EXTENSION idempotency, load schema.sql and move.sql, a smoke test, then
# loadtest.py (every load phase, move and check; see its header), then the
# ledgers distributed by Citus (distributed-ledger/run.sh, on servers of its
# own: ports EXAMPLES_PORT_BASE+3 .. +5).  Exit
# status 0 = every check passed.  The servers are stopped on exit, pass or
# fail; the scratch directory is kept on failure (KEEP_WORKDIR=1: always).

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/examples.sh
. "$SRC/test/lib/examples.sh"
# shellcheck source=test/lib/citus.sh
. "$SRC/test/lib/citus.sh"
# shellcheck source=test/lib/skip.sh
. "$SRC/test/lib/skip.sh"

export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54470}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
	DBUSER=$CLUSTER_USER
else
	DBUSER=$(id -un)
fi

say() { printf 'citus: %s\n' "$*"; }
fail() {
	say "FAILED: $*" >&2
	exit 1
}

if ! citus_installed; then
	[ -z "${IDEM_CITUS_UNAVAILABLE:-}" ] ||
		skip_unavailable "needs Citus: $IDEM_CITUS_UNAVAILABLE"
	fail "Citus is not installed for $("$PG_CONFIG" --version) (as root: . test/lib/citus.sh; citus_ensure)"
fi
examples_python
NODES=(coordinator worker1 worker2)
examples_workdir citus "${NODES[@]}"

start=$SECONDS
declare -A PORT=()
i=0
for s in "${NODES[@]}"; do
	PORT[$s]=$((BASE + i))
	i=$((i + 1))
	# citus first in shared_preload_libraries, as Citus requires;
	# local_hostname: how a node reaches itself (here its socket directory)
	cluster_start "$WORK/$s" "${PORT[$s]}" \
		"shared_preload_libraries = 'citus,idempotency'" \
		"citus.local_hostname = '$WORK/$s/sock'" \
		"citus.node_conninfo = 'sslmode=prefer'" \
		"max_prepared_transactions = 50" \
		"idempotency.key_memory = '1h'" \
		"fsync = off" "synchronous_commit = off" \
		"log_min_messages = warning" ||
		fail "could not start $s"
done
say "3 servers up in $((SECONDS - start)) s (ports $BASE..$((BASE + 2))), Citus $(citus_version)"

co() { cluster_psql "$WORK/coordinator" "$@"; }
for s in "${NODES[@]}"; do
	cluster_psql "$WORK/$s" -q -c "CREATE EXTENSION citus" ||
		fail "CREATE EXTENSION citus failed on $s"
done
co -q -At -c "SELECT citus_set_coordinator_host('$WORK/coordinator/sock', ${PORT[coordinator]})" \
	-c "SELECT citus_add_node('$WORK/worker1/sock', ${PORT[worker1]})" \
	-c "SELECT citus_add_node('$WORK/worker2/sock', ${PORT[worker2]})" \
	-c "CREATE ROLE app LOGIN" >/dev/null ||
	fail "could not make the cluster"

# What Citus does with CREATE EXTENSION idempotency: it runs it on every
# worker too (and on workers added later), so each node gets its own
# "idempotency" schema and functions; the ledger tables are made later by
# each node itself, on its first call, as local tables that Citus neither
# distributes nor propagates.
co -q -c "CREATE EXTENSION idempotency" || fail "CREATE EXTENSION idempotency failed"
for s in worker1 worker2; do
	got=$(cluster_psql "$WORK/$s" -At -c \
		"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'") ||
		fail "could not read $s"
	[ "$got" = "$(co -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" ] ||
		fail "CREATE EXTENSION idempotency did not reach $s (got '$got')"
done
say "CREATE EXTENSION idempotency on the coordinator was propagated to both workers"

cp "$HERE/schema.sql" "$HERE/move.sql" "$WORK/" && chmod 644 "$WORK"/*.sql
co -q -c "SET client_min_messages = warning" -f "$WORK/schema.sql" -f "$WORK/move.sql" >/dev/null ||
	fail "could not load schema.sql and move.sql"

# smoke test: a payment, its replay, and where its key went
got=$(co -U app -At -c "SELECT status FROM create_payment('acme', 'k-1', '{\"amount\": 5}', 5)" \
	-c "SELECT status FROM create_payment('acme', 'k-1', '{\"amount\": 5}', 5)" |
	paste -sd' ') || fail "create_payment through the coordinator failed"
[ "$got" = "created replayed" ] || fail "smoke test: got '$got', want 'created replayed'"
holder=$(co -At -c "SELECT n.nodename FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                     WHERE p.shardid = get_shard_id_for_distribution_column('payments', 'acme')")
for s in worker1 worker2; do
	n=$(cluster_psql "$WORK/$s" -At -c "SELECT count(*) FROM idempotency.export_keys(ARRAY['acme'])")
	want=0
	[ "$holder" = "$WORK/$s/sock" ] && want=1
	[ "$n" = "$want" ] || fail "smoke test: $s holds $n keys of acme, want $want"
done
n=$(co -At -c "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idempotency.%'")
[ "$n" = 0 ] || fail "Citus distributed $n ledger tables"
say "smoke test: created on the tenant's worker ($(basename "$(dirname "$holder")")), replayed; ledgers stay local"

args=(--coordinator "host=$WORK/coordinator/sock port=${PORT[coordinator]} dbname=postgres user=$DBUSER")
for s in worker1 worker2; do
	args+=(--worker "host=$WORK/$s/sock port=${PORT[$s]} dbname=postgres user=$DBUSER")
done
"$PYTHON" "$HERE/loadtest.py" "${args[@]}" || fail "loadtest.py reported failures"

# every ledger index of every node is intact after the load and the moves
for s in "${NODES[@]}"; do
	out=$(examples_amcheck "$WORK/$s" postgres) || fail "amcheck on $s: $out"
	say "amcheck on $s: $out"
done
# The ledgers distributed by Citus (0.5.0, issue 37): a cluster of its own
# (ports BASE+3 .. BASE+5, under $WORK/dl) where the key ledger is co-located
# with the payments, through Citus' own rebalance, force_logical move, split
# and isolation under load, with a control that must pay keys twice
# (distributed-ledger/run.sh).  Its servers run as the cluster user.
mkdir -p "$WORK/dl" && chmod 755 "$WORK/dl"
[ "$(id -u)" -ne 0 ] || chown "$CLUSTER_USER" "$WORK/dl"
cluster_as_user env PG_CONFIG="$PG_CONFIG" WORK="$WORK/dl/run" BASE=$((BASE + 3)) \
	PY="$PYTHON" KEYS=1000 bash "$HERE/distributed-ledger/run.sh" ||
	fail "distributed-ledger/run.sh: the distributed ledger did not keep exactly-once through Citus' shard operations"
say "passed in $((SECONDS - start)) s"
