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
# Debian's python3 first: another python3 on PATH (pyenv, venv) may lack
# psycopg
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
	for py in /usr/bin/python3 python3; do
		if "$py" -c 'import psycopg' 2>/dev/null; then
			PYTHON=$py
			break
		fi
	done
fi
[ -n "$PYTHON" ] ||
	fail "psycopg 3 is not installed (apt-get install python3-psycopg)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-plproxy.XXXXXX") || exit 1
chmod 755 "$WORK"
SERVERS=(proxy shard0 shard1 shard2)

cleanup() {
	local rc=$? s
	trap - EXIT INT TERM
	for s in "${SERVERS[@]}"; do
		cluster_stop "$WORK/$s" || rc=1
	done
	cluster_stop_any_under "$WORK" || rc=1
	if [ "$rc" -ne 0 ]; then
		for s in "${SERVERS[@]}"; do
			if [ -f "$WORK/$s/postgresql.log" ]; then
				echo "---- $s/postgresql.log (last 30 lines)"
				tail -n 30 "$WORK/$s/postgresql.log"
			fi
		done
	fi
	if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
		rm -rf "$WORK"
	else
		say "scratch directory kept: $WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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

args=(--proxy "host=$WORK/proxy/sock port=${PORT[proxy]} dbname=proxy user=$DBUSER")
for p in 0 1 2 3; do
	args+=(--part "$(conninfo "$p") user=$DBUSER")
done
"$PYTHON" "$HERE/loadtest.py" "${args[@]}" || fail "loadtest.py reported failures"

say "passed in $((SECONDS - start)) s"
