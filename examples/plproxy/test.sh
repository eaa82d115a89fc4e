#!/usr/bin/env bash
#
# examples/plproxy/test.sh -- scale-out test: a PL/Proxy node routing
# create_payment() by hashtext(tenant) to four partitions on three shard
# servers, each partition running the idempotency extension; concurrent
# duplicate requests through the proxy must make every payment exactly once,
# on the tenant's own partition.
#
#   bash examples/plproxy/test.sh
#
# Run by the "examples" suite of test/run-all.sh (which sets SRC, PG_CONFIG
# and EXAMPLES_PORT_BASE and has installed the extension).  Standalone it
# uses the installed extension and this checkout; as root, the servers run
# as $CLUSTER_USER (default postgres).  Needs postgresql-15-plproxy and
# python3-psycopg (PYTHON picks the interpreter).
#
# Layout (unix sockets only, ports EXAMPLES_PORT_BASE .. +3):
#   shard0  databases part0 and part3      shard1  part1      shard2  part2
#   proxy   database proxy: SERVER payments (p0..p3), create_payment()
#
# Steps: start the four servers, load shard.sql into each partition database
# and proxy.sql into the proxy, then run loadtest.py (load phases and every
# check; see its header).  Exit status 0 = every check passed.  All servers
# are stopped on exit, pass or fail; the scratch directory is kept on
# failure (KEEP_WORKDIR=1 keeps it always).

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/examples.sh
. "$SRC/test/lib/examples.sh"

export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54460}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
	DBUSER=$CLUSTER_USER
else
	DBUSER=$(id -un)
fi

say() { printf 'plproxy: %s\n' "$*"; }
fail() {
	say "FAILED: $*" >&2
	exit 1
}

if [ ! -f "$("$PG_CONFIG" --sharedir)/extension/plproxy.control" ]; then
	fail "PL/Proxy is not installed (apt-get install postgresql-15-plproxy)"
fi
examples_python
SERVERS=(proxy shard0 shard1 shard2)
examples_workdir plproxy "${SERVERS[@]}"

start=$SECONDS
declare -A PORT=()
i=0
for s in "${SERVERS[@]}"; do
	PORT[$s]=$((BASE + i))
	i=$((i + 1))
	cluster_start "$WORK/$s" "${PORT[$s]}" "fsync = off" \
		"synchronous_commit = off" "log_min_messages = warning" ||
		fail "could not start $s"
done
say "4 servers up in $((SECONDS - start)) s (ports ${PORT[proxy]}..$((BASE + 3)))"

# conninfo PART: libpq connection string of partition database partN
PART_SERVER=(shard0 shard1 shard2 shard0)
conninfo() {
	local s=${PART_SERVER[$1]}
	printf 'host=%s port=%s dbname=part%s' "$WORK/$s/sock" "${PORT[$s]}" "$1"
}

# The application role, with the same name on every server (the ledger keys
# belong to it: PL/Proxy connects to the partitions as the calling role).
for s in "${SERVERS[@]}"; do
	cluster_psql "$WORK/$s" -q -c "CREATE ROLE app LOGIN" ||
		fail "could not create role app on $s"
done

# shard.sql is read by the server user: give it a copy it can read
cp "$HERE/shard.sql" "$HERE/proxy.sql" "$WORK/" && chmod 644 "$WORK"/*.sql

for p in 0 1 2 3; do
	s=${PART_SERVER[$p]}
	cluster_psql "$WORK/$s" -q -c "CREATE DATABASE part$p" &&
		CLUSTER_DB=part$p cluster_psql "$WORK/$s" -q -f "$WORK/shard.sql" ||
		fail "could not set up partition $p on $s"
done

cluster_psql "$WORK/proxy" -q -c "CREATE DATABASE proxy" &&
	CLUSTER_DB=proxy cluster_psql "$WORK/proxy" -q \
		-v p0="$(conninfo 0)" -v p1="$(conninfo 1)" \
		-v p2="$(conninfo 2)" -v p3="$(conninfo 3)" \
		-f "$WORK/proxy.sql" ||
	fail "could not set up the proxy"

# A smoke test of the routing before the load: the reply names partition
# hashtext('acme') & 3, and a retry replays it.
first=$(CLUSTER_DB=proxy cluster_psql "$WORK/proxy" -U app -At -c \
	"SELECT status, response_body->>'partition' = 'part' || (hashtext('acme') & 3)
	   FROM create_payment('acme', 'k-1', '{\"amount\": 5}', 5)") ||
	fail "create_payment through the proxy failed"
again=$(CLUSTER_DB=proxy cluster_psql "$WORK/proxy" -U app -At -c \
	"SELECT status FROM create_payment('acme', 'k-1', '{\"amount\": 5}', 5)") ||
	fail "create_payment through the proxy failed"
[ "$first" = "created|t" ] && [ "$again" = "replayed" ] ||
	fail "smoke test: got '$first' then '$again', expected 'created|t' then 'replayed'"
say "smoke test: created on partition hashtext('acme') & 3, then replayed"

# loadtest ARG...: run loadtest.py against the proxy and the partitions
# (every partition of PART_SERVER, in order)
loadtest() {
	local p args
	args=(--state "$WORK/state.json"
		--proxy "host=$WORK/proxy/sock port=${PORT[proxy]} dbname=proxy user=$DBUSER")
	for p in "${!PART_SERVER[@]}"; do
		args+=(--part "$(conninfo "$p") user=$DBUSER")
	done
	"$PYTHON" "$HERE/loadtest.py" "${args[@]}" "$@"
}
loadtest --mode load || fail "loadtest.py reported failures"

# ---------------------------------------------------------------- re-sharding
# Move partition 3 from shard0 to shard1, the way README.md describes: freeze
# it, copy the whole database (payments and idempotency ledger together),
# point the proxy at the copy, drop the original.  No tenant changes
# partition, so every key must still be found where its tenant's calls go.
px() { CLUSTER_DB=proxy cluster_psql "$WORK/proxy" "$@"; }
mover=$(px -At -c "SELECT t FROM (SELECT 'mover-' || i AS t
                                   FROM generate_series(1, 1000) i) s
                   WHERE hashtext(t) & 3 = 3 LIMIT 1") && [ -n "$mover" ] ||
	fail "no tenant name hashes to partition 3"

# An application session opened before the move and kept across it: PL/Proxy
# caches the cluster and its connections per session, and must notice the
# ALTER SERVER below.
coproc LONG { CLUSTER_DB=proxy cluster_psql "$WORK/proxy" -U app -At -q 2>&1; }
long_in=${LONG[1]}
long_out=${LONG[0]}
ask() {
	local line
	echo "$1" >&"$long_in" &&
		read -r -t 30 line <&"$long_out" || line="(no answer)"
	printf '%s\n' "$line"
}
got=$(ask "SELECT status FROM create_payment('$mover', 'before-move', '{}', 1);")
[ "$got" = created ] || fail "long session before the move: got '$got'"

# 1. freeze: the application can no longer reach partition 3 (its requests
#    fail, commit nothing, and are retried by the client later)
cluster_psql "$WORK/shard0" -q -At -c "REVOKE CONNECT ON DATABASE part3 FROM PUBLIC" \
	-c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	     WHERE datname = 'part3' AND usename = 'app'" >/dev/null ||
	fail "could not freeze partition 3"
if px -U app -At -c "SELECT status FROM create_payment('$mover', 'during-move', '{}', 1)" \
	>/dev/null 2>&1; then
	fail "a request reached partition 3 while it was frozen"
fi
# 2. copy the whole database, ledger included, to shard1
move_start=$SECONDS
cluster_psql "$WORK/shard1" -q -c "CREATE DATABASE part3" &&
	cluster_run "$WORK/shard0" pg_dump -Fc -d part3 |
	cluster_run "$WORK/shard1" pg_restore --exit-on-error -d part3 ||
	fail "could not copy partition 3 to shard1"
# 3. point the proxy at the copy; 4. drop the original
PART_SERVER[3]=shard1
px -q -c "ALTER SERVER payments OPTIONS (SET p3 '$(conninfo 3)')" &&
	cluster_psql "$WORK/shard0" -q -c "DROP DATABASE part3 WITH (FORCE)" ||
	fail "could not switch partition 3 to shard1"
say "partition 3 moved from shard0 to shard1 in $((SECONDS - move_start)) s"

# The long session follows the move: the key it paid before is replayed
# from the copied ledger, and the request that failed during the freeze now
# goes through once.
got=$(ask "SELECT status, response_body->>'partition' FROM create_payment('$mover', 'before-move', '{}', 1);")
[ "$got" = "replayed|part3" ] ||
	fail "long session after the move, old key: got '$got', expected 'replayed|part3'"
got=$(ask "SELECT status FROM create_payment('$mover', 'during-move', '{}', 1);")
[ "$got" = created ] ||
	fail "long session after the move, retried key: got '$got', expected 'created'"
got=$(CLUSTER_DB=part3 cluster_psql "$WORK/shard1" -At -c \
	"SELECT string_agg(key, ',' ORDER BY key) FROM payments WHERE tenant = '$mover'")
[ "$got" = "before-move,during-move" ] ||
	fail "payments of $mover on shard1/part3: '$got'"
exec {long_in}>&- {long_out}<&-
say "a session opened before the move follows it: replay from the copied ledger, retry paid once"

loadtest --mode after-move || fail "loadtest.py reported failures after the move"

# ---------------------------------------------------------------- splitting
# Split every partition in two, 4 -> 8: partition p keeps the tenants with
# hashtext(tenant) & 7 = p and hands those with & 7 = p + 4 to a new
# partition p + 4, with their payments and their live idempotency keys
# (idempotency.export_keys() on p, idempotency.import_key() on p + 4).  The
# whole service is frozen meanwhile: PL/Proxy maps every tenant with one
# partition count.
split_start=$SECONDS
PART_SERVER+=(shard1 shard2 shard0 shard2)
part() { CLUSTER_DB=part$1 cluster_psql "$WORK/${PART_SERVER[$1]}" "${@:2}"; }
for p in 0 1 2 3; do
	cluster_psql "$WORK/${PART_SERVER[$p]}" -q -At -c "REVOKE CONNECT ON DATABASE part$p FROM PUBLIC" \
		-c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		     WHERE datname = 'part$p' AND usename = 'app'" >/dev/null ||
		fail "could not freeze partition $p"
done
for p in 0 1 2 3; do
	q=$((p + 4))
	cluster_psql "$WORK/${PART_SERVER[$q]}" -q -c "CREATE DATABASE part$q" &&
		part "$q" -q -f "$WORK/shard.sql" ||
		fail "could not make partition $q"
	tenants=$(part "$p" -At -c "SELECT coalesce(array_agg(DISTINCT tenant), '{}')
	                               FROM payments WHERE hashtext(tenant) & 7 = $q") ||
		fail "could not list the tenants leaving partition $p"
	# the tenants' payments (ids kept), then their live keys
	part "$p" -c "\\copy (SELECT id, tenant, key, amount, created_at FROM payments WHERE hashtext(tenant) & 7 = $q) TO STDOUT" |
		part "$q" -q -c "\\copy payments (id, tenant, key, amount, created_at) FROM pstdin" \
			-c "SELECT setval('payments_id_seq', (SELECT max(id) FROM payments))" >/dev/null ||
		fail "could not copy the payments of partition $p to $q"
	imported=$(part "$p" -c "\\copy (SELECT * FROM idempotency.export_keys('$tenants')) TO STDOUT" |
		part "$q" -At -c "CREATE TEMP TABLE moving (LIKE idempotency.key_record)" \
			-c "\\copy moving FROM pstdin" \
			-c "SELECT count(*) FILTER (WHERE idempotency.import_key(m) = 'inserted')
			             || ' of ' || count(*) FROM moving m" | tail -n 1) ||
		fail "could not move the keys of partition $p to $q"
	part "$p" -q -c "DELETE FROM payments WHERE hashtext(tenant) & 7 = $q" ||
		fail "could not delete the moved payments from partition $p"
	say "partition $p -> $p and $q: $(tr -d '{}' <<<"$tenants" | tr ',' '\n' | grep -c .) tenants, $imported keys imported"
done
px -q -c "ALTER SERVER payments OPTIONS (ADD p4 '$(conninfo 4)', ADD p5 '$(conninfo 5)',
                                         ADD p6 '$(conninfo 6)', ADD p7 '$(conninfo 7)')" ||
	fail "could not give the proxy eight partitions"
for p in 0 1 2 3; do
	cluster_psql "$WORK/${PART_SERVER[$p]}" -q -c "GRANT CONNECT ON DATABASE part$p TO PUBLIC" ||
		fail "could not unfreeze partition $p"
done
say "split 4 -> 8 partitions in $((SECONDS - split_start)) s"

loadtest --mode after-split || fail "loadtest.py reported failures after the split"

# every ledger index of every partition database is intact after the load
for p in "${!PART_SERVER[@]}"; do
	out=$(examples_amcheck "$WORK/${PART_SERVER[$p]}" "part$p") ||
		fail "amcheck of partition $p: $out"
	say "amcheck of partition $p: $out"
done

say "passed in $((SECONDS - start)) s"
