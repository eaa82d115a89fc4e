#!/usr/bin/env bash
#
# examples/http/test.sh -- end-to-end test of the example payments API
# (examples/http/server.py): starts a throwaway cluster, loads the extension
# and schema.sql, starts the service on 127.0.0.1 and drives it with curl.
#
#   bash examples/http/test.sh                         # by hand, as root or not
#   SUITES=examples bash test/run-all.sh               # with the other examples
#
# Checks the Idempotency-Key contract of the IETF draft: a retry replays the
# stored response (Idempotent-Replayed: true, identical body); a key reused
# with another body is 422; a missing, empty, malformed, repeated or too long
# key is 400; a retry while the first request runs is 409; 20 parallel
# requests with one key make exactly one charge; a request that fails before
# COMMIT leaves its key unused; keys are per account; the published
# retention is the keys' real lifetime.  A second instance with --wait makes
# concurrent retries wait and replay instead of 409.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG,
# EXAMPLES_PORT_BASE (default 54470; uses BASE for the cluster's socket,
# BASE+1 and BASE+2 on 127.0.0.1 for the two service instances), PYTHON.
# Exit status 0 = pass.  The cluster and services are stopped on exit.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54470}
HTTP_PORT=$((BASE + 1))
HTTP_PORT_WAIT=$((BASE + 2))
URL="http://127.0.0.1:$HTTP_PORT"
URL_WAIT="http://127.0.0.1:$HTTP_PORT_WAIT"
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi

PY=""
for p in ${PYTHON:-} python3 /usr/bin/python3; do
	if "$p" -c 'import psycopg' 2>/dev/null; then
		PY=$p
		break
	fi
done
if [ -z "$PY" ]; then
	echo "http test: no python3 with psycopg 3 (apt-get install python3-psycopg)" >&2
	exit 1
fi
command -v curl >/dev/null || {
	echo "http test: curl is not installed" >&2
	exit 1
}

WORK=""
SERVER_PIDS=()
HOLDER_PID=""
# how long a wait for a condition may take (a bound for a hung test, not
# for a slow machine)
WAIT_SECONDS=${WAIT_SECONDS:-300}
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	exec 8>&- 2>/dev/null
	[ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null
	for pid in "${SERVER_PIDS[@]}"; do
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		if [ "$rc" -ne 0 ]; then
			for f in "$WORK"/server*.log; do
				[ -f "$f" ] && { echo "---- $f (last 30 lines)"; tail -n 30 "$f"; }
			done
		fi
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-http.XXXXXX") || exit 1
chmod 755 "$WORK"
R="$WORK/responses"
mkdir -p "$R"

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

# ---------------------------------------------------------------- database
DB="$WORK/cluster"
cluster_start "$DB" "$BASE" "fsync = off" "max_connections = 50" || exit 1
cluster_psql "$DB" -q -c "CREATE DATABASE payments" || exit 1
cluster_psql "$DB" -q -d payments <<EOF || exit 1
CREATE EXTENSION idempotency;
\i $HERE/schema.sql
-- the service runs as an ordinary role: EXECUTE on idem_* comes with the
-- extension, the rest is ours to grant
CREATE ROLE payments_app LOGIN;
GRANT SELECT, INSERT ON charges TO payments_app;
EOF

sql() { cluster_psql "$DB" -d payments -qAt -c "$1"; }
# charges made with idempotency key $1 (any account)
charges_for() { sql "SELECT count(*) FROM charges WHERE idempotency_key = '$1'"; }

# ---------------------------------------------------------------- service
# start_server PORT LOG [ARG...]: start server.py and wait until it answers
start_server() {
	local port=$1 log=$2 pid end
	shift 2
	env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=payments PGUSER=payments_app \
		"$PY" "$HERE/server.py" --port "$port" --test-hooks "$@" >"$log" 2>&1 &
	pid=$!
	SERVER_PIDS+=("$pid")
	end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		if curl -sf -o /dev/null "http://127.0.0.1:$port/docs/idempotency"; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "http test: server.py exited; log:" >&2
			cat "$log" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "http test: server.py did not answer on port $port" >&2
	return 1
}

start_server "$HTTP_PORT" "$WORK/server.log" --key-ttl 2h --pool-size 4 || exit 1

# post NAME BODY [CURL_ARG...]: POST /charges, save headers and body as
# $R/NAME.hdr / $R/NAME.body, print the status code
post() {
	local name=$1 body=$2
	shift 2
	curl -sS -o "$R/$name.body" -D "$R/$name.hdr" -w '%{http_code}' \
		-X POST -H 'Content-Type: application/json' --data-binary "$body" \
		"$@" "${TARGET:-$URL}/charges"
}
# header NAME FIELD: value of a response header (last one), CR stripped
header() {
	tr -d '\r' <"$R/$1.hdr" | awk -v f="$2" 'BEGIN { f = tolower(f) ":" }
		tolower($1) == f { sub(/^[^:]*:[ \t]*/, ""); v = $0 } END { print v }'
}
replayed() { header "$1" Idempotent-Replayed; }
# json NAME EXPR: a field of a JSON response body, with Python's syntax
json() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$R/$1.body" "$2"; }
same_body() { cmp -s "$R/$1.body" "$R/$2.body" && echo same || echo different; }

B1='{"amount": 1999, "currency": "eur", "description": "order 42"}'
B1_REORDERED='{ "currency":"eur","description":"order 42",   "amount":1999 }'
B2='{"amount": 2999, "currency": "eur", "description": "order 42"}'

# ---------------------------------------------------------------- docs
echo "# retention is published in the documentation (draft: expiry policy)"
curl -sS -H 'Accept: application/json' -o "$R/doc.body" "$URL/docs/idempotency"
check "docs: key_retention_seconds" "$(json doc 'd["key_retention_seconds"]')" 7200
curl -sS -o "$R/dochtml.body" "$URL/docs/idempotency"
check "docs (HTML): retention" \
	"$(grep -c 'kept for 2 hours .*<span id="retention-seconds">7200</span> seconds' "$R/dochtml.body")" 1

# ---------------------------------------------------------------- replay
echo "# first request, then a retry"
check "first request: status" "$(post first "$B1" -H 'Idempotency-Key: "k-1"')" 201
check "first request: not marked as a replay" "$(replayed first)" ""
check "first request: Location" "$(header first Location)" "/charges/$(json first 'd["id"][3:]')"
check "retry (same JSON, other key order and spacing): status" \
	"$(post retry "$B1_REORDERED" -H 'Idempotency-Key: "k-1"')" 201
check "retry: Idempotent-Replayed" "$(replayed retry)" true
check "retry: body identical to the first response" "$(same_body first retry)" same
check "retry: Location" "$(header retry Location)" "$(header first Location)"
check "one charge for k-1" "$(charges_for k-1)" 1
check "GET the charge" "$(curl -sS -o "$R/get.body" -w '%{http_code}' "$URL$(header first Location)")" 200
check "GET the charge: same charge" "$(json get 'd["id"]')" "$(json first 'd["id"]')"

echo "# the key's lifetime is the published retention"
check "expires_at - claimed_at of k-1" \
	"$(sql "SET ROLE payments_app; SELECT extract(epoch FROM expires_at - claimed_at)::int FROM idem_lookup('k-1', 'acct_default POST /charges')")" \
	7200

# ---------------------------------------------------------------- 422
echo "# key reused with a different body"
check "different body, same key: status" "$(post mismatch "$B2" -H 'Idempotency-Key: "k-1"')" 422
check "422: problem+json" "$(header mismatch Content-Type)" "application/problem+json"
check "422: Link to the documentation" "$(header mismatch Link)" \
	"<$URL/docs/idempotency>; rel=\"describedby\"; type=\"text/html\""
check "422: problem type is the documentation" "$(json mismatch 'd["type"]')" "$URL/docs/idempotency"
check "still one charge for k-1" "$(charges_for k-1)" 1
check "the first request's retry still replays" "$(post retry2 "$B1" -H 'Idempotency-Key: "k-1"')/$(replayed retry2)" 201/true

# ---------------------------------------------------------------- 400
echo "# missing or bad keys"
before=$(sql "SELECT count(*) FROM charges")
check "no Idempotency-Key: status" "$(post nokey "$B1")" 400
check "no Idempotency-Key: title" "$(json nokey 'd["title"]')" "Idempotency-Key is missing"
check "no Idempotency-Key: Link" "$(header nokey Link | grep -c 'rel="describedby"')" 1
check "empty key: status" "$(post empty "$B1" -H 'Idempotency-Key: ""')" 400
long=$(printf 'k%.0s' $(seq 1 256))
check "256-character key: status" "$(post long "$B1" -H "Idempotency-Key: \"$long\"")" 400
check "unterminated string: status" "$(post bad "$B1" -H 'Idempotency-Key: "k-2')" 400
check "two Idempotency-Key fields: status" \
	"$(post two "$B1" -H 'Idempotency-Key: "k-2"' -H 'Idempotency-Key: "k-3"')" 400
check "no charge made by a 400" "$(sql "SELECT count(*) FROM charges")" "$before"
check "255-character key: status" "$(post long255 "$B1" -H "Idempotency-Key: \"${long:1}\"")" 201
check "escaped quote in the key: status" "$(post esc "$B1" -H 'Idempotency-Key: "k\"q"')" 201
check "escaped quote in the key: stored as k\"q" "$(charges_for 'k"q')" 1
check "bare key: status" "$(post bare "$B1" -H 'Idempotency-Key: k-bare')" 201
check "its quoted form is the same key" \
	"$(post bare2 "$B1" -H 'Idempotency-Key: "k-bare"')/$(replayed bare2)" 201/true
check "invalid JSON body: status" "$(post badjson '{"amount": ' -H 'Idempotency-Key: "k-json"')" 400
check "invalid JSON body left the key unused" \
	"$(post goodjson "$B1" -H 'Idempotency-Key: "k-json"')/$(replayed goodjson)" 201/

# ---------------------------------------------------------------- scope
echo "# keys are per account"
check "same key and body, other account: status" \
	"$(post other "$B1" -H 'Idempotency-Key: "k-1"' -H 'Account-Id: acct_other')" 201
check "other account: not a replay" "$(replayed other)" ""
check "other account: its own charge" \
	"$([ "$(json other 'd["id"]')" != "$(json first 'd["id"]')" ] && echo yes)" yes
check "k-1: one charge per account" \
	"$(sql "SELECT string_agg(account_id || '=' || n, ',' ORDER BY account_id) FROM (SELECT account_id, count(*) AS n FROM charges WHERE idempotency_key = 'k-1' GROUP BY 1) s")" \
	"acct_default=1,acct_other=1"

# ---------------------------------------------------------------- errors
echo "# a stored error is replayed too"
check "declined charge: status" "$(post decline '{"amount": 5000000, "currency": "eur"}' -H 'Idempotency-Key: "k-big"')" 402
check "declined charge retried: replayed 402" \
	"$(post decline2 '{"amount": 5000000, "currency": "eur"}' -H 'Idempotency-Key: "k-big"')/$(replayed decline2)" 402/true
check "declined: same body" "$(same_body decline decline2)" same
check "declined: no charge" "$(charges_for k-big)" 0

echo "# a request that fails before COMMIT leaves its key unused"
check "failure after the INSERT: status" \
	"$(post fail "$B1" -H 'Idempotency-Key: "k-fail"' -H 'Test-Fail: after-insert')" 500
check "failure: the INSERT rolled back" "$(charges_for k-fail)" 0
check "failure: no key recorded" \
	"$(sql "SET ROLE payments_app; SELECT count(*) FROM idem_lookup('k-fail', 'acct_default POST /charges')")" 0
check "retry after the failure: made now, not replayed" \
	"$(post fail2 "$B1" -H 'Idempotency-Key: "k-fail"')/$(replayed fail2)" 201/
check "failure then retry: one charge" "$(charges_for k-fail)" 1

# ---------------------------------------------------------------- 409
echo "# a retry while the first request is still running"
# The first request is held inside its transaction, after its claim, for as
# long as the test needs, not for a time the retry must fall within: this
# session locks charges, so the first request's INSERT waits until the
# session commits, once the retry has been answered.
mkfifo "$WORK/holder.in" || exit 1
cluster_psql "$DB" -d payments -q <"$WORK/holder.in" >"$WORK/holder.out" 2>&1 &
HOLDER_PID=$!
exec 8>"$WORK/holder.in"
echo "BEGIN; LOCK TABLE charges IN EXCLUSIVE MODE;" >&8
# wait_sql SQL WANT: until SQL answers WANT, for at most WAIT_SECONDS
wait_sql() {
	local end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		[ "$(sql "$1")" = "$2" ] && return 0
		sleep 0.05
	done
	return 1
}
wait_sql "SELECT count(*) FROM pg_locks WHERE relation = 'charges'::regclass AND mode = 'ExclusiveLock' AND granted" 1 ||
	not_ok "the test session could not lock charges"
post slow "$B1" -H 'Idempotency-Key: "k-slow"' >"$R/slow.code" &
slow_pid=$!
wait_sql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payments-example' AND wait_event_type = 'Lock'" 1 ||
	not_ok "the first request did not reach its INSERT, after its claim"
check "concurrent retry: status" "$(post conc "$B1" -H 'Idempotency-Key: "k-slow"')" 409
check "409: Retry-After" "$(header conc Retry-After)" 1
check "409: Link" "$(header conc Link | grep -c 'rel="describedby"')" 1
check "409: title" "$(json conc 'd["title"]')" "A request is outstanding for this Idempotency-Key"
echo "COMMIT;" >&8
exec 8>&-
wait "$HOLDER_PID"
HOLDER_PID=""
wait "$slow_pid"
check "first request: status" "$(cat "$R/slow.code")" 201
check "retry after it finished: replayed" \
	"$(post slow2 "$B1" -H 'Idempotency-Key: "k-slow"')/$(replayed slow2)" 201/true
check "retry after it finished: same body" "$(same_body slow slow2)" same
check "k-slow: one charge" "$(charges_for k-slow)" 1

# parallel NAME KEY [URL]: 20 parallel curl requests with one key, each
# inside a transaction for 1 s on its first run; prints "code replayed" lines
parallel() {
	local name=$1 key=$2 i pids=()
	for i in $(seq 1 20); do
		TARGET=${3:-$URL} post "$name-$i" "$B1" -H "Idempotency-Key: \"$key\"" \
			-H 'Test-Delay-Ms: 1000' >"$R/$name-$i.code" 2>"$R/$name-$i.err" &
		pids+=($!)
	done
	wait "${pids[@]}"
	for i in $(seq 1 20); do
		echo "$(cat "$R/$name-$i.code") $(replayed "$name-$i")"
	done
}

echo "# 20 parallel requests with one fresh key"
parallel par k-par >"$R/par.summary"
check "parallel: exactly one charge" "$(charges_for k-par)" 1
check "parallel: every response is 201 or 409" \
	"$(grep -cvE '^(201 |201 true|409 )$' "$R/par.summary")" 0
check "parallel: exactly one 201 made the charge" "$(grep -c '^201 $' "$R/par.summary")" 1
check "parallel: at least one 409" "$([ "$(grep -c '^409' "$R/par.summary")" -ge 1 ] && echo yes)" yes
n201=0
for i in $(seq 1 20); do
	if [ "$(cat "$R/par-$i.code")" = 201 ]; then
		n201=$((n201 + 1))
		if [ -z "${first201:-}" ]; then first201=par-$i; fi
		[ "$(same_body "$first201" "par-$i")" = same ] || not_ok "parallel: par-$i differs from $first201"
	fi
done
check "parallel: a retry afterwards replays the same body" \
	"$(post par-after "$B1" -H 'Idempotency-Key: "k-par"')/$(replayed par-after)/$(same_body "$first201" par-after)" \
	201/true/same
echo "  (parallel: $n201 x 201, $(grep -c '^409' "$R/par.summary") x 409)"

echo "# the same with --wait: concurrent retries wait and replay"
start_server "$HTTP_PORT_WAIT" "$WORK/server-wait.log" --wait --pool-size 4 || exit 1
parallel pw k-par-wait "$URL_WAIT" >"$R/pw.summary"
check "--wait parallel: exactly one charge" "$(charges_for k-par-wait)" 1
check "--wait parallel: one 201 made it, 19 replayed it" \
	"$(sort "$R/pw.summary" | uniq -c | awk '{ printf "%s:%s%s ", $1, $2, ($3 ? "r" : "") }')" \
	"1:201 19:201r "
for i in $(seq 1 20); do
	[ "$(same_body pw-1 "pw-$i")" = same ] || not_ok "--wait parallel: pw-$i differs from pw-1"
done

echo
if [ "$FAILS" -ne 0 ]; then
	echo "http test: $FAILS check(s) failed"
	exit 1
fi
echo "http test: all checks passed"
exit 0
