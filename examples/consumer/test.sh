#!/usr/bin/env bash
#
# examples/consumer/test.sh -- end-to-end test of the example queue consumer
# (examples/consumer/consumer.py): every message is applied exactly once
# although the queue delivers some of them several times and consumers die
# mid-batch.
#
#   bash examples/consumer/test.sh                     # by hand, as root or not
#   SUITES=examples bash test/run-all.sh               # with the other examples
#
# On a throwaway cluster:
#   1. Control: one consumer with --no-dedup (no idem_consume_messages) on a
#      queue with duplicates.  The check below must find the damage
#      (duplicate ledger lines, wrong balances), or it could not fail.
#   2. The real run: a producer publishes messages with duplicates, in two
#      waves, the second also republishing messages consumed long ago.  A
#      consumer takes a batch and keeps its transaction open; it is killed
#      with kill -9 while other consumers run.  Four supervised consumers
#      (two in tx mode, two in lease mode with a 2 s visibility timeout)
#      each crash twice (os._exit just before and just after a batch's
#      COMMIT) and are restarted, until the queue is empty.
#   3. Checks: one ledger line per published message and none twice; every
#      balance is the sum of its account's distinct messages; nothing of
#      the killed consumer's batch was kept; and the run really had
#      duplicates, crashes and lease redeliveries.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG,
# EXAMPLES_PORT_BASE (default 54480; the cluster's unix socket port),
# PYTHON, CONSUMER_TEST_DEADLINE (default 600: seconds the real run may take
# to drain the queue, and any wait for a condition; a bound for a hung
# test, not for a slow machine).  Exit status 0 = pass.  Everything started
# here is stopped on exit.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/examples.sh
. "$SRC/test/lib/examples.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54480}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi
DEADLINE=${CONSUMER_TEST_DEADLINE:-600}   # seconds for the real run, and for a wait

PY=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
	if "$p" -c 'import psycopg' 2>/dev/null; then
		PY=$p
		break
	fi
done
if [ -z "$PY" ]; then
	echo "consumer test: no python3 with psycopg 3 (apt-get install python3-psycopg)" >&2
	exit 1
fi

WORK=""
declare -A SLOT_PID=()
OTHER_PIDS=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	for pid in "${SLOT_PID[@]}" "${OTHER_PIDS[@]}"; do
		[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	done
	wait 2>/dev/null
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		if [ "$rc" -ne 0 ] && [ -f "$WORK/consumers.log" ]; then
			echo "---- consumers.log (last 40 lines)"
			tail -n 40 "$WORK/consumers.log"
		fi
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-consumer.XXXXXX") || exit 1
chmod 755 "$WORK"
LOG="$WORK/consumers.log"
: >"$LOG"

FAILS=0
ok() { echo "ok   - $*"; }
not_ok() {
	echo "FAIL - $*"
	FAILS=$((FAILS + 1))
}
check() {
	if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1: got '$2', expected '$3'"; fi
}
check_ge() {
	if [ "$2" -ge "$3" ]; then ok "$1 ($2)"; else not_ok "$1: got $2, expected at least $3"; fi
}

# ---------------------------------------------------------------- database
DB="$WORK/cluster"
cluster_start "$DB" "$BASE" "fsync = off" "max_connections = 50" \
	"deadlock_timeout = 100ms" || exit 1
for d in control app; do
	cluster_psql "$DB" -q -c "CREATE DATABASE $d" || exit 1
	cluster_psql "$DB" -q -d "$d" <<EOF || exit 1
CREATE EXTENSION idempotency;
\i $HERE/schema.sql
EOF
done
cluster_psql "$DB" -q <<EOF || exit 1
CREATE ROLE queue_app LOGIN;
EOF
for d in control app; do
	cluster_psql "$DB" -q -d "$d" <<EOF || exit 1
GRANT SELECT, INSERT, UPDATE, DELETE ON queue, accounts, ledger, batches, published TO queue_app;
EOF
done

sql() { cluster_psql "$DB" -d "$1" -qAt -c "$2"; }
# wait_sql DB SQL WANT: until SQL answers WANT, for at most DEADLINE seconds;
# the caller checks the answer after
wait_sql() {
	local end=$((SECONDS + DEADLINE))
	while [ "$SECONDS" -lt "$end" ]; do
		[ "$(sql "$1" "$2")" = "$3" ] && return 0
		sleep 0.05
	done
	return 1
}
# consumer.py against database "control" or "app", as queue_app.  Arrays,
# not functions, so that "${CQ_APP[@]}" ... & gives python's own pid in $!.
CQ_CONTROL=(env PGHOST="$DB/sock" PGPORT="$BASE" PGUSER=queue_app PGDATABASE=control
	"$PY" "$HERE/consumer.py")
CQ_APP=(env PGHOST="$DB/sock" PGPORT="$BASE" PGUSER=queue_app PGDATABASE=app
	"$PY" "$HERE/consumer.py")

# verify DB: print what the consumer did wrong, if anything; exit status 0
# when every published message was applied exactly once
verify() {
	sql "$1" "
	SELECT format('ledger lines %s for %s published messages; %s message(s) applied more than once; %s never; %s unknown; %s account(s) with a wrong balance',
	       (SELECT count(*) FROM ledger),
	       (SELECT count(*) FROM published),
	       (SELECT count(*) FROM (SELECT message_id FROM ledger GROUP BY 1 HAVING count(*) > 1) d),
	       (SELECT count(*) FROM (SELECT message_id FROM published EXCEPT SELECT message_id FROM ledger) n),
	       (SELECT count(*) FROM (SELECT message_id FROM ledger EXCEPT SELECT message_id FROM published) u),
	       (SELECT count(*)
	          FROM (SELECT account, sum(amount) AS expected FROM published GROUP BY 1) e
	          FULL JOIN accounts a USING (account)
	         WHERE e.expected IS DISTINCT FROM a.balance))" >"$WORK/verify.out" || return 2
	cat "$WORK/verify.out"
	grep -q ' 0 message(s) applied more than once; 0 never; 0 unknown; 0 account(s) ' "$WORK/verify.out" &&
		[ "$(sql "$1" "SELECT count(*) = (SELECT count(*) FROM published) FROM ledger")" = t ]
}

# ---------------------------------------------------------------- 1. control
echo "# control: without idem_consume_messages, duplicates are applied twice"
"${CQ_CONTROL[@]}" produce --count 300 --dup-rate 0.3 --seed 7 2>>"$LOG" || exit 1
"${CQ_CONTROL[@]}" consume --name naive --no-dedup --exit-when-empty 2>>"$LOG" || exit 1
if out=$(verify control); then
	not_ok "control: the check found nothing wrong with --no-dedup ($out)"
else
	ok "control: the check finds the double applications ($out)"
fi

# ---------------------------------------------------------------- 2. real run
echo "# exactly once: duplicates, kill -9 mid-transaction, crashes around COMMIT"
"${CQ_APP[@]}" produce --count 2000 --dup-rate 0.25 --seed 1 2>>"$LOG" || exit 1

# A consumer that takes a batch, applies it and keeps its transaction open.
"${CQ_APP[@]}" consume --name c-hold --batch 40 --hold 120 2>>"$LOG" &
hold_pid=$!
OTHER_PIDS+=("$hold_pid")
# (its log line first: between the statements of its batch the session is
# "idle in transaction" for a moment too, and the check would then catch it
# running the next one)
end=$((SECONDS + DEADLINE))
until grep -q '^c-hold: holding the transaction' "$LOG" 2>/dev/null || [ "$SECONDS" -ge "$end" ]; do
	sleep 0.05
done
wait_sql app "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c-hold' AND state = 'idle in transaction'" 1
check "c-hold is inside its batch's transaction" \
	"$(sql app "SELECT state FROM pg_stat_activity WHERE application_name = 'c-hold'")" \
	"idle in transaction"

# slot_start SLOT: start (or restart) the consumer of SLOT.  Odd slots are
# tx mode, even slots lease mode.  Its first run crashes just before a
# COMMIT, its second just after one, later runs do not crash.
declare -A SLOT_RUN=()
slot_start() {
	local s=$1 run mode crash=()
	run=$((${SLOT_RUN[$s]:-0} + 1))
	SLOT_RUN[$s]=$run
	if [ $((s % 2)) -eq 1 ]; then mode=tx; else mode=lease; fi
	case $run in
	1) crash=(--crash-at-batch $((s + 1)) --crash-point before-commit) ;;
	2) crash=(--crash-at-batch 2 --crash-point after-commit) ;;
	esac
	"${CQ_APP[@]}" consume --name "c$s" --mode "$mode" --visibility 2 --batch 25 \
		--exit-when-empty "${crash[@]}" 2>>"$LOG" &
	SLOT_PID[$s]=$!
}

start=$SECONDS
for s in 1 2 3 4; do slot_start "$s"; done
"${CQ_APP[@]}" produce --first 2000 --count 1000 --dup-rate 0.25 --redeliver 500 \
	--seed 2 2>>"$LOG" &
producer_pid=$!
OTHER_PIDS+=("$producer_pid")

# Kill c-hold once the others are busy: when one of them waits for it (a
# duplicate of a message c-hold recorded), or has applied 200 messages.
end=$((SECONDS + DEADLINE))
while [ "$SECONDS" -lt "$end" ]; do
	waiting=$(sql app "SELECT count(*) FROM pg_stat_activity WHERE application_name ~ '^c[0-9]' AND wait_event_type = 'Lock'")
	[ "$waiting" -gt 0 ] && break
	[ "$(sql app "SELECT count(*) FROM ledger")" -ge 200 ] && break
	sleep 0.05
done
echo "  (killing c-hold with SIGKILL; $waiting consumer(s) waiting for it)"
kill -KILL "$hold_pid"
wait "$hold_pid" 2>/dev/null
wait_sql app "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c-hold'" 0
check "c-hold's backend is gone (its transaction rolled back)" \
	"$(sql app "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c-hold'")" 0

# Supervise: restart consumers that crashed while there is work left.
crashes=0
unexpected=0
producer_done=0
while :; do
	if [ "$producer_done" = 0 ] && ! kill -0 "$producer_pid" 2>/dev/null; then
		wait "$producer_pid" || { not_ok "the producer failed"; exit 1; }
		producer_done=1
	fi
	pending=$(sql app "SELECT count(*) FROM queue")
	running=0
	for s in 1 2 3 4; do
		pid=${SLOT_PID[$s]}
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			rc=$?
			SLOT_PID[$s]=""
			case $rc in
			0) ;;
			3) crashes=$((crashes + 1)) ;;
			*)
				unexpected=$((unexpected + 1))
				echo "  consumer c$s exited with status $rc"
				;;
			esac
		fi
		if [ -z "${SLOT_PID[$s]}" ] && { [ "$producer_done" = 0 ] || [ "$pending" -gt 0 ]; }; then
			slot_start "$s"
		fi
		[ -n "${SLOT_PID[$s]}" ] && running=$((running + 1))
	done
	if [ "$producer_done" = 1 ] && [ "$pending" -eq 0 ] && [ "$running" -eq 0 ]; then
		break
	fi
	if [ $((SECONDS - start)) -ge "$DEADLINE" ]; then
		not_ok "the queue was not drained within ${DEADLINE}s ($pending rows left)"
		exit 1
	fi
	sleep 0.1
done
echo "  (drained in $((SECONDS - start))s)"

# ---------------------------------------------------------------- 3. checks
if out=$(verify app); then
	ok "every message applied exactly once ($out)"
else
	not_ok "exactly once: $out"
fi
check "queue empty" "$(sql app "SELECT count(*) FROM queue")" 0
check "nothing of c-hold's batch was kept" \
	"$(sql app "SELECT count(*) FROM ledger WHERE consumer = 'c-hold'")" 0
check "no consumer failed" "$unexpected" 0
check_ge "crashes injected around COMMIT" "$crashes" 4
check_ge "duplicate deliveries published" \
	"$(sql app "SELECT pg_sequence_last_value(pg_get_serial_sequence('queue', 'seq')) - (SELECT count(*) FROM published)")" 1
check_ge "deliveries skipped as already consumed (committed batches)" \
	"$(sql app "SELECT sum(delivered - applied) FROM batches")" 1
check_ge "redeliveries after a lease-mode crash (visibility timeout)" \
	"$(sql app "SELECT sum(redelivered) FROM batches")" 1
check_ge "... of which skipped: their effect had committed before the crash" \
	"$(sql app "SELECT sum(redelivered_skipped) FROM batches")" 1
check_ge "tx-mode and lease-mode consumers both applied messages" \
	"$(sql app "SELECT count(DISTINCT mode) FROM batches WHERE applied > 0")" 2
if out=$(examples_amcheck "$DB" app); then
	ok "amcheck of every ledger index after the crashes: $out"
else
	not_ok "amcheck of every ledger index after the crashes: $out"
fi

echo
if [ "$FAILS" -ne 0 ]; then
	echo "consumer test: $FAILS check(s) failed"
	exit 1
fi
echo "consumer test: all checks passed"
exit 0
