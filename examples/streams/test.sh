#!/usr/bin/env bash
#
# examples/streams/test.sh -- end-to-end test of the example stream consumer
# (examples/streams/consumer.py) on Redis Streams: every record is applied
# exactly once through crashes, restarts, compaction gaps, a rebalance and
# a zombie.
#
#   bash examples/streams/test.sh                      # by hand, as root or not
#   SUITES=examples bash test/run-all.sh               # with the other examples
#
# On a throwaway cluster and a redis-server of its own (unix socket in the
# scratch directory, no TCP, no persistence; as CLUSTER_USER when root):
#   1. 4 partitions of 300 records each, 10 % of the offsets missing.  A
#      consumer of all four dies inside its fourth transaction (os._exit
#      before COMMIT); restarted (a new generation), it applies the rest;
#      restarted again, it applies nothing.
#   2. 300 more records per partition.  A consumer of all four stops itself
#      (SIGSTOP) with a batch in hand after two batches; meanwhile two
#      consumers take two partitions each with newer generations and apply
#      everything; resumed, the first is refused (ID001) on every partition
#      it still holds, applies nothing more and exits 3 (rejoin).
#   3. Checks: one ledger line per record in Redis, none twice, the
#      balances add up to what was produced, the zombie wrote nothing after
#      the takeover, and the 4 positions are at each partition's end.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG,
# EXAMPLES_PORT_BASE (default 54490; the cluster's unix socket port),
# PYTHON, REDIS_SERVER, WAIT_SECONDS (default 300: how long a wait for a
# condition may take; a bound for a hung test, not for a slow machine).
# Skipped (exit 77) without redis-server or python3-redis; IDEM_NO_SKIP=1
# makes that a failure.  Exit status 0 = pass.  Everything started here is
# stopped on exit.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/skip.sh
. "$SRC/test/lib/skip.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54490}
WAIT_SECONDS=${WAIT_SECONDS:-300}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi

PY=""
for p in ${PYTHON:-} /usr/bin/python3 python3; do
	if "$p" -c 'import psycopg' 2>/dev/null; then
		PY=$p
		break
	fi
done
if [ -z "$PY" ]; then
	echo "streams test: no python3 with psycopg 3 (apt-get install python3-psycopg)" >&2
	exit 1
fi
REDIS_SERVER=${REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}
[ -x "$REDIS_SERVER" ] ||
	skip_unavailable "needs redis-server (Debian package redis-server)"
"$PY" -c 'import redis' 2>/dev/null ||
	skip_unavailable "needs redis-py for $PY (Debian package python3-redis)"

WORK=""
PIDS=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	for pid in "${PIDS[@]}"; do
		kill -CONT "$pid" 2>/dev/null
		kill -KILL "$pid" 2>/dev/null
	done
	if [ -n "$WORK" ] && [ -f "$WORK/redis/redis.pid" ]; then
		kill -TERM "$(cat "$WORK/redis/redis.pid")" 2>/dev/null
	fi
	wait 2>/dev/null
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		if [ "$rc" -ne 0 ]; then
			for f in "$WORK"/*.out "$WORK/redis/redis.log"; do
				[ -f "$f" ] && { echo "---- $f (last 20 lines)"; tail -n 20 "$f"; }
			done
		fi
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-streams.XXXXXX") || exit 1
chmod 755 "$WORK"

FAILS=0
ok() { echo "ok   - $*"; }
not_ok() {
	echo "FAIL - $*"
	FAILS=$((FAILS + 1))
}
# check DESCRIPTION ACTUAL EXPECTED
check() {
	if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1: got '$2', expected '$3'"; fi
}
# wait_until DESCRIPTION COMMAND...: until COMMAND succeeds, for at most
# WAIT_SECONDS
wait_until() {
	local what=$1 end=$((SECONDS + WAIT_SECONDS))
	shift
	until "$@"; do
		if [ "$SECONDS" -ge "$end" ]; then
			not_ok "timed out waiting for $what"
			return 1
		fi
		sleep 0.05
	done
}

# ---------------------------------------------------------------- servers
DB="$WORK/cluster"
cluster_start "$DB" "$BASE" "fsync = off" || exit 1
cluster_psql "$DB" -q -c "CREATE DATABASE app" || exit 1
cluster_psql "$DB" -q -d app <<EOF || exit 1
CREATE EXTENSION idempotency;
\i $HERE/schema.sql
-- the consumers run as an ordinary role: EXECUTE on idem_* comes with the
-- extension, the rest is ours to grant
CREATE ROLE streams_app LOGIN;
GRANT SELECT, INSERT, UPDATE ON ledger, balances TO streams_app;
EOF
sql() { cluster_psql "$DB" -d app -qAt -c "$1"; }

mkdir -p "$WORK/redis"
[ "$(id -u)" -ne 0 ] || chown "$CLUSTER_USER:" "$WORK/redis"
RSOCK="$WORK/redis/redis.sock"
(cd "$WORK" && cluster_as_user "$REDIS_SERVER" --port 0 --unixsocket "$RSOCK" \
	--unixsocketperm 700 --save '' --appendonly no --dir "$WORK/redis" \
	--pidfile "$WORK/redis/redis.pid" --logfile "$WORK/redis/redis.log" \
	--daemonize no) &
PIDS+=($!)
# shellcheck disable=SC2317  # called by wait_until
redis_up() { [ -S "$RSOCK" ] && [ "$(redis-cli -s "$RSOCK" ping 2>/dev/null)" = PONG ]; }
wait_until "redis-server to answer" redis_up || exit 1

export REDIS_URL="unix://$RSOCK"
# the consumers, as the application's role
C=(env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=app PGUSER=streams_app
	"$PY" "$HERE/consumer.py")
TOTAL=0
produce() {
	local out
	out=$("${C[@]}" produce "$@") || { not_ok "produce $*"; return 1; }
	echo "  $out"
	TOTAL=$((TOTAL + $(sed -n 's/.*total amount \([0-9]*\).*/\1/p' <<<"$out")))
}
records_in_redis() {
	"$PY" -c 'import redis, sys; r = redis.Redis.from_url(sys.argv[1]); print(sum(r.xlen("payments:%d" % p) for p in range(4)))' "$REDIS_URL"
}
duplicates() { sql "SELECT count(*) - count(DISTINCT (part, off)) FROM ledger"; }

# ---------------------------------------------------------------- crashes
echo "# 4 partitions, 10 % of the offsets missing; a consumer dies inside a transaction"
produce --parts 4 --count 300 --missing-pct 10
"${C[@]}" consume --name a --parts 0,1,2,3 --batch 50 --crash-after-batches 3 >"$WORK/a1.out" 2>&1
check "the consumer died before its fourth COMMIT" "$?" 9
check "3 batches of 50 kept, the fourth rolled back" "$(sql "SELECT count(*) FROM ledger")" 150
"${C[@]}" consume --name a --parts 0,1,2,3 --batch 50 --exit-when-idle >"$WORK/a2.out" 2>&1
check "restarted with a new generation: it ran to the end" "$?" 0
check "every record applied once" "$(sql "SELECT count(*) FROM ledger")/$(duplicates)" "$(records_in_redis)/0"
"${C[@]}" consume --name a --parts 0,1,2,3 --exit-when-idle >"$WORK/a3.out" 2>&1
check "restarted again: it ran to the end" "$?" 0
check "restarted again: nothing applied" "$(grep -c ': 0 records applied in 0 batches' "$WORK/a3.out")" 1
check "balances add up to what was produced" "$(sql "SELECT sum(balance) FROM balances")" "$TOTAL"

# ---------------------------------------------------------------- zombie
echo "# a consumer frozen with a batch in hand; its partitions taken over meanwhile"
produce --parts 4 --count 300
"${C[@]}" consume --name zombie --parts 0,1,2,3 --batch 20 --pause-after-batches 2 \
	>"$WORK/zombie.out" 2>&1 &
ZPID=$!
PIDS+=("$ZPID")
# shellcheck disable=SC2317  # called by wait_until
stopped() { [ "$(awk '{ print $3 }' "/proc/$ZPID/stat" 2>/dev/null)" = T ]; }
wait_until "the zombie to stop itself" stopped
check "the zombie applied 2 batches before it stopped" "$(sql "SELECT count(*) FROM ledger WHERE consumer = 'zombie'")" 40
"${C[@]}" consume --name b --parts 0,1 --exit-when-idle >"$WORK/b.out" 2>&1 &
BPID=$!
"${C[@]}" consume --name c --parts 2,3 --exit-when-idle >"$WORK/c.out" 2>&1
check "c took partitions 2 and 3 and ran to the end" "$?" 0
wait "$BPID"
check "b took partitions 0 and 1 and ran to the end" "$?" 0
kill -CONT "$ZPID"
wait "$ZPID"
check "the zombie, resumed, lost every partition and exits to rejoin" "$?" 3
check "it was refused on each of the 4 partitions" "$(grep -c 'fenced, generation .* is stale' "$WORK/zombie.out")" 4
check "it wrote nothing after the takeover" "$(sql "SELECT count(*) FROM ledger WHERE consumer = 'zombie'")" 40
grep -h 'fenced' "$WORK/zombie.out" | head -n 1 | sed 's/^/  /'

# ---------------------------------------------------------------- the end
check "one ledger line per record in Redis, none twice" \
	"$(sql "SELECT count(*) FROM ledger")/$(duplicates)" "$(records_in_redis)/0"
check "balances add up to what was produced" "$(sql "SELECT sum(balance) FROM balances")" "$TOTAL"
ends=$("$PY" -c 'import redis, sys; r = redis.Redis.from_url(sys.argv[1], decode_responses=True)
print(",".join("%d:%s" % (p, r.xrevrange("payments:%d" % p, count=1)[0][0].split("-")[1]) for p in range(4)))' "$REDIS_URL")
check "4 positions, each at its partition's end" \
	"$(sql "SET ROLE streams_app; SELECT string_agg(part || ':' || next_offset, ',' ORDER BY part) FROM idem_positions('billing', 'payments')")" \
	"$ends"

echo
if [ "$FAILS" -ne 0 ]; then
	echo "streams test: $FAILS check(s) failed"
	exit 1
fi
echo "streams test: all checks passed"
exit 0
