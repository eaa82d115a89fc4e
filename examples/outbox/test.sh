#!/usr/bin/env bash
#
# examples/outbox/test.sh -- the outbox example end to end, on a throwaway
# cluster: the orders service publishes its orders in their business
# transactions, the relay delivers them over HTTP (Standard Webhooks) to
# the shipping service, which makes one shipment per order, exactly once,
# although the relay is SIGKILLed in the middle of a batch, the shipping
# service is killed and down for a second, PostgreSQL is stopped with -m
# immediate and restarted, and shipping answers 503 now and then.
#
#   bash examples/outbox/test.sh                  # as root or not
#
#   1. Two databases, "orders" and "shipping", each with the extension.
#      When the installed extension has no outbox yet (idem_publish and the
#      relay calls), the orders database gets clients/conformance/
#      outbox-fake.sql, a stand-in with the same calls, and says so.
#   2. The shipping service (shipping.py, Flask) starts; it answers 503 to
#      the first delivery of every 7th event (FAIL_EVERY).
#   3. A relay (orders.py relay, batches of 100) starts, and 4 publishers
#      (orders.py place) place 75 orders each at the same time: every 10th
#      transaction rolls back after it published its event, every 25th
#      stays open a second after publishing while the others commit.
#   4. Once shipping has made 20 shipments, the relay is SIGKILLed (in the
#      middle of a batch) and a second one starts; at 150 orders,
#      PostgreSQL (both databases) is stopped with -m immediate and
#      restarted (the publishers connect again and place the interrupted
#      order again; the relay and shipping connect again); at 100
#      shipments the shipping service is SIGKILLed, and restarted on its
#      port a second later.  The relay runs until every committed order is
#      shipped.
#   5. Checks: one shipment per committed order, none twice, none for a
#      rolled-back order; each customer's shipments in the order their
#      orders committed (a per-customer number taken under the customer's
#      row lock); the kill really interrupted a batch (shipping answered
#      "duplicate" to redelivered events); failed attempts were retried and
#      nothing was dead-lettered.
#
# Environment: SRC (repository, default two levels up), PG_CONFIG (default
# /usr/lib/postgresql/15/bin/pg_config; the extension installed there),
# EXAMPLES_PORT_BASE (default 54480: the cluster's unix socket port),
# OUTBOX_TEST_DEADLINE (default 300: seconds any wait for a condition may
# take; a bound for a hung run, not for a slow machine), OUTBOX_FAKE=1 (the
# stand-in even when the extension has an outbox), KEEP_WORKDIR=1.
# Exit status 0 = pass.  Everything started here is stopped on exit.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54480}
DEADLINE=${OUTBOX_TEST_DEADLINE:-300}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi
PY=/usr/bin/python3
"$PY" -c 'import psycopg, psycopg_pool, flask' 2>/dev/null || {
	echo "outbox example: needs Debian's python3-psycopg, python3-psycopg-pool and python3-flask" >&2
	exit 1
}

WORK=""
PIDS=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	for pid in "${PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null
	done
	wait 2>/dev/null
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
		if [ "$rc" -ne 0 ]; then
			for f in shipping.log relay1.log relay2.log; do
				[ -f "$WORK/$f" ] && { echo "---- $f (last 20 lines)"; tail -n 20 "$WORK/$f"; }
			done
		fi
		if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
			rm -rf "$WORK"
		else
			echo "scratch directory kept: $WORK"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

FAILS=0
ok() { echo "ok   - $*"; }
not_ok() {
	echo "FAIL - $*"
	FAILS=$((FAILS + 1))
}
check() {
	if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1: got '$2', expected '$3'"; fi
}
# wait_for WHAT CMD...: until CMD succeeds, at most DEADLINE seconds
wait_for() {
	local what=$1 end=$((SECONDS + DEADLINE))
	shift
	until "$@"; do
		if [ "$SECONDS" -gt "$end" ]; then
			not_ok "timed out waiting for $what"
			exit 1
		fi
		sleep 0.05
	done
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-outbox.XXXXXX") || exit 1
chmod 755 "$WORK"
DB="$WORK/cluster"

# ---------------------------------------------------------------- databases
echo "== cluster ($("$PG_CONFIG" --version), socket port $BASE)"
cluster_start "$DB" "$BASE" "fsync = off" "max_connections = 50" \
	"shared_preload_libraries = 'idempotency'" || exit 1
cluster_psql "$DB" -q <<'SQL' || exit 1
CREATE ROLE orders_app LOGIN;
CREATE ROLE shipping_app LOGIN;
CREATE DATABASE orders OWNER orders_app;
CREATE DATABASE shipping OWNER shipping_app;
SQL
for d in orders shipping; do
	cluster_psql "$DB" -q -d "$d" -c 'CREATE EXTENSION idempotency' || exit 1
done
cluster_psql "$DB" -q -d orders -U orders_app -f "$HERE/orders.sql" || exit 1
cluster_psql "$DB" -q -d shipping -U shipping_app -f "$HERE/shipping.sql" || exit 1
has_outbox=$(cluster_psql "$DB" -d orders -At -c "SELECT count(DISTINCT p.proname) FROM pg_proc p
	JOIN pg_depend d ON d.objid = p.oid JOIN pg_extension e ON d.refobjid = e.oid
	WHERE e.extname = 'idempotency' AND p.proname IN
	('idem_publish', 'idem_outbox_next', 'idem_outbox_ack', 'idem_outbox_dead_letter')")
if [ "$has_outbox" != 4 ] || [ "${OUTBOX_FAKE:-0}" = 1 ]; then
	if [ "$has_outbox" != 4 ]; then
		echo "NOTE: the installed extension has no outbox yet (idem_publish, idem_outbox_next, ...):"
	else
		echo "NOTE: OUTBOX_FAKE=1:"
	fi
	echo "      the orders database runs on clients/conformance/outbox-fake.sql, a stand-in with the same calls"
	cluster_psql "$DB" -q -d orders -f "$SRC/clients/conformance/outbox-fake.sql" || exit 1
	# shellcheck disable=SC2016  # $user is PostgreSQL's
	cluster_psql "$DB" -q -d orders -c \
		'ALTER ROLE orders_app IN DATABASE orders SET search_path = outbox_fake, pg_catalog, "$user", public' || exit 1
fi

export PGHOST="$DB/sock" PGPORT="$BASE"
export PYTHONPATH="$SRC/clients/python/src" PYTHONDONTWRITEBYTECODE=1
HOOK_SECRET=$("$PY" -c 'from pg_idempotency.webhooks import generate_secret; print(generate_secret())')
export HOOK_SECRET
as_orders() { PGDATABASE=orders PGUSER=orders_app "$@"; }
sql_orders() { cluster_psql "$DB" -d orders -U orders_app -At -c "$1"; }
sql_shipping() { cluster_psql "$DB" -d shipping -U shipping_app -At -c "$1"; }

# ---------------------------------------------------------------- services
shipped() { sql_shipping 'SELECT count(*) FROM shipments'; }
shipped_at_least() { [ "$(shipped)" -ge "$1" ]; }
start_shipping() {
	(cd "$HERE" && PGDATABASE=shipping PGUSER=shipping_app FAIL_EVERY=7 \
		exec "$PY" shipping.py --port "$1") >>"$WORK/shipping.log" 2>&1 &
	SHIPPING=$!
	PIDS+=("$SHIPPING")
}
answers() { "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null; }
# 200 attempts, waits of at most 0.5 s: about 100 s to wait out shipping's
# outage and the restart (a bound for a slow machine, not the expected time)
start_relay() {
	(cd "$HERE" && as_orders exec "$PY" orders.py relay --url "$URL" --max-events 100 \
		--initial-delay 0.05 --max-delay 0.5 --max-attempts 200 --poll-interval 0.2) >"$WORK/$1" 2>&1 &
	RELAY=$!
	PIDS+=("$RELAY")
}

echo "== the shipping service"
start_shipping 0
port_known() { grep -q '^PORT ' "$WORK/shipping.log"; }
wait_for "the shipping service to listen" port_known
PORT=$(awk '/^PORT /{print $2; exit}' "$WORK/shipping.log")
URL="http://127.0.0.1:$PORT/hooks/orders"
echo "shipping listens at $URL (answering 503 to the first delivery of every 7th event)"

echo "== 4 publishers and a relay at once"
start_relay relay1.log
PUBLISHERS=()
for p in 1 2 3 4; do
	(cd "$HERE" && as_orders exec "$PY" orders.py place --count 75 --seed "$p" \
		--rollback-every 10 --hold-every 25 --hold 1) >"$WORK/publisher$p.log" 2>&1 &
	PUBLISHERS+=($!)
	PIDS+=($!)
done
wait_for "20 shipments" shipped_at_least 20
kill -KILL "$RELAY"
wait "$RELAY" 2>/dev/null
echo "relay SIGKILLed after $(shipped) shipments; a new one starts"
start_relay relay2.log
placed_at_least() { [ "$(sql_orders 'SELECT count(*) FROM orders')" -ge "$1" ]; }
wait_for "150 orders" placed_at_least 150
echo "PostgreSQL stopped with -m immediate after $(sql_orders 'SELECT count(*) FROM orders') orders, $(shipped) shipments; restarted"
(cd "$DB" && cluster_as_user "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$DB/data" -m immediate -w -s stop) ||
	{ not_ok "pg_ctl stop -m immediate"; exit 1; }
cluster_start "$DB" "$BASE" || exit 1
wait_for "100 shipments" shipped_at_least 100
{
	kill -KILL "$SHIPPING"
	wait "$SHIPPING"
} 2>/dev/null
echo "shipping SIGKILLed after $(shipped) shipments; down for a second"
sleep 1
start_shipping "$PORT"
wait_for "shipping to listen again" answers "$PORT"
echo "shipping is back"
pub_fail=0
for pid in "${PUBLISHERS[@]}"; do
	wait "$pid" || pub_fail=1
done
check "the publishers finished" "$pub_fail" 0
committed=$(sql_orders 'SELECT count(*) FROM orders')
wait_for "every order shipped" shipped_at_least "$committed"
# the relay acknowledges after delivering: wait until it next finds nothing
idle_before=$(grep -c '^idle' "$WORK/relay2.log")
relay_idle() { [ "$(grep -c '^idle' "$WORK/relay2.log")" -gt "$idle_before" ]; }
wait_for "the relay to acknowledge everything" relay_idle
kill -TERM "$RELAY"
wait "$RELAY" 2>/dev/null

# ---------------------------------------------------------------- checks
echo "== checks"
# a publisher whose connection died in its COMMIT places that order again:
# one more order when the COMMIT had gone through
lost=$(cat "$WORK"/publisher*.log | awk '/^placed/ {gsub(/[(,]/, ""); s += $7} END {print s + 0}')
if [ "$committed" -ge 272 ] && [ "$committed" -le $((272 + lost)) ]; then
	ok "$committed orders committed: 300 placed, 28 rolled back, $lost interrupted by the restart and placed again"
else
	not_ok "$committed orders committed, expected 272 to $((272 + lost))"
fi
orders=$(sql_orders 'SELECT id FROM orders ORDER BY id')
shipments=$(sql_shipping 'SELECT order_id FROM shipments ORDER BY order_id')
check "one shipment per committed order, none twice, none for a rolled-back order" \
	"$(echo "$shipments" | md5sum)" "$(echo "$orders" | md5sum)"
check "shipments are distinct" "$(sql_shipping 'SELECT count(*) - count(DISTINCT order_id) FROM shipments')" 0
check "each customer's shipments in the order their orders committed" \
	"$(sql_shipping "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY customer ORDER BY id) AS prev FROM shipments) s WHERE seq <> coalesce(prev, 0) + 1")" 0
dups=$(grep -c '^duplicate ' "$WORK/shipping.log")
if [ "$dups" -ge 1 ]; then
	ok "the SIGKILL interrupted a batch: $dups redelivered events answered \"duplicate\", none applied twice"
else
	not_ok "no redelivered event: the kill did not interrupt a batch"
fi
retries=$(cat "$WORK/relay1.log" "$WORK/relay2.log" | grep -c '^attempt-failed')
if [ "$retries" -ge 1 ]; then
	ok "503 answers and the shipping outage were retried ($retries failed attempts)"
else
	not_ok "no failed attempt was retried"
fi
check "no dead letters" "$(cat "$WORK/relay1.log" "$WORK/relay2.log" | grep -c '^dead-letter')" 0

if [ "$FAILS" -ne 0 ]; then
	echo "outbox example: $FAILS checks failed"
	exit 1
fi
echo "outbox example: all checks passed"
