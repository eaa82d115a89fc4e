#!/usr/bin/env bash
#
# examples/http/test.sh -- end-to-end test of the example payments API
# (examples/http/server.py and recoverer.py): starts a throwaway cluster,
# loads the extension and schema.sql, starts four instances of the service
# on 127.0.0.1 and drives them with curl.
#
#   bash examples/http/test.sh                         # by hand, as root or not
#   SUITES=examples bash test/run-all.sh               # with the other examples
#
# Checks the Idempotency-Key contract of the IETF draft and the two-phase
# charge around the card network call: a retry replays the stored status,
# Content-Type, Location and body bytes (Idempotent-Replayed: true), and no
# other stored header; a key reused with another body is 422; a missing,
# empty, malformed, repeated or too long key is 400; keys are per account;
# the published retention is the keys' real lifetime; a declined charge is
# replayed; a card network that charged nothing releases the key.  A
# duplicate of a slow charge waits for its result, 20 parallel requests
# with one key make one charge and all get it; with --wait-timeout 0 the
# duplicates get 409 at once, and with a short one 409 after the wait.  A
# charge whose completion failed, or whose server was SIGKILLed during the
# card network call, is finished exactly once by a retry after the lease or
# by recoverer.py, and the retry replays it.  Every wait is for a condition
# (bounded by WAIT_SECONDS), never for a time a step must fall within.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG,
# EXAMPLES_PORT_BASE (default 54470; uses BASE for the cluster's socket,
# BASE+1 .. BASE+4 on 127.0.0.1 for the service instances), PYTHON,
# WAIT_SECONDS (300).  Exit status 0 = pass.  The cluster, the services and
# the recoverer are stopped on exit.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54470}
URL="http://127.0.0.1:$((BASE + 1))"          # duplicates wait (60 s)
URL_STRICT="http://127.0.0.1:$((BASE + 2))"   # --wait-timeout 0: 409 at once
URL_SHORT="http://127.0.0.1:$((BASE + 3))"    # --wait-timeout 1s
URL_CRASH="http://127.0.0.1:$((BASE + 4))"    # --lease 2s, killed by the test
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
RECOVERER_PID=""
# how long a wait for a condition may take (a bound for a hung test, not
# for a slow machine)
WAIT_SECONDS=${WAIT_SECONDS:-300}
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	exec 8>&- 2>/dev/null
	[ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null
	[ -n "$RECOVERER_PID" ] && kill "$RECOVERER_PID" 2>/dev/null
	for pid in "${SERVER_PIDS[@]}"; do
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		if [ "$rc" -ne 0 ]; then
			for f in "$WORK"/*.log; do
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
# preloaded, as in production: a waiting duplicate is woken by the commit
# of the first request's completion instead of polling
DB="$WORK/cluster"
cluster_start "$DB" "$BASE" "fsync = off" "max_connections = 100" \
	"shared_preload_libraries = 'idempotency'" || exit 1
cluster_psql "$DB" -q -c "CREATE DATABASE payments" || exit 1
cluster_psql "$DB" -q -d payments <<EOF || exit 1
CREATE EXTENSION idempotency;
\i $HERE/schema.sql
-- the service runs as an ordinary role: EXECUTE on idem_* comes with the
-- extension, the rest is ours to grant
CREATE ROLE payments_app LOGIN;
GRANT SELECT, INSERT ON charges, provider_charges TO payments_app;
EOF

sql() { cluster_psql "$DB" -d payments -qAt -c "$1"; }
# wait_sql SQL WANT: until SQL answers WANT, for at most WAIT_SECONDS
wait_sql() {
	local end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		[ "$(sql "$1")" = "$2" ] && return 0
		sleep 0.05
	done
	return 1
}
# charges made with idempotency key $1 (any account), and the card
# network's charges for it
charges_for() { sql "SELECT count(*) FROM charges WHERE idempotency_key = '$1'"; }
provider_for() { sql "SELECT count(*) FROM provider_charges WHERE metadata->>'idempotency_key' = '$1'"; }
# lookup KEY EXPR: EXPR over idem_lookup() of KEY of acct_default, as the
# service's role
lookup() {
	sql "SET ROLE payments_app; SELECT $2 FROM idem_lookup('$1', 'acct_default POST /charges')"
}
# lapsed KEY: SQL that says t once the key's lease has run out
lapsed() {
	echo "SET ROLE payments_app; SELECT lease_expires_at <= clock_timestamp() FROM idem_lookup('$1', 'acct_default POST /charges')"
}

# ---------------------------------------------------------------- service
LAST_PID=""
# start_server PORT LOG [ARG...]: start server.py and wait until it answers
start_server() {
	local port=$1 log=$2 pid end
	shift 2
	env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=payments PGUSER=payments_app \
		"$PY" "$HERE/server.py" --port "$port" --test-hooks "$@" >"$log" 2>&1 &
	pid=$!
	SERVER_PIDS+=("$pid")
	LAST_PID=$pid
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
# recoverer LOG [ARG...]: run recoverer.py as the service's role; with
# RECOVERER_BG=1 in the background, its pid in RECOVERER_PID
recoverer() {
	local log=$1
	shift
	if [ "${RECOVERER_BG:-}" = 1 ]; then
		env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=payments PGUSER=payments_app \
			"$PY" "$HERE/recoverer.py" "$@" >"$log" 2>&1 &
		RECOVERER_PID=$!
	else
		env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=payments PGUSER=payments_app \
			"$PY" "$HERE/recoverer.py" "$@" >"$log" 2>&1
	fi
}

# long leases, so that no charge of these lapses while the test holds it
start_server $((BASE + 1)) "$WORK/server.log" --key-ttl 2h --pool-size 4 \
	--lease 2m --wait-timeout 60s || exit 1
start_server $((BASE + 2)) "$WORK/server-strict.log" --pool-size 4 \
	--lease 2m --wait-timeout 0 || exit 1
start_server $((BASE + 3)) "$WORK/server-short.log" --pool-size 4 \
	--lease 2m --wait-timeout 1s || exit 1
start_server $((BASE + 4)) "$WORK/server-crash.log" --pool-size 4 \
	--lease 2s --wait-timeout 60s || exit 1
CRASH_PID=$LAST_PID

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
# body_hex NAME: the response body's bytes in hex, to compare with a bytea
body_hex() { "$PY" -c 'import sys; print(open(sys.argv[1], "rb").read().hex())' "$R/$1.body"; }
# same_reply NAME OTHER: status, Content-Type, Location and body bytes equal
same_reply() {
	if [ "$(head -n 1 "$R/$1.hdr")" = "$(head -n 1 "$R/$2.hdr")" ] &&
		[ "$(header "$1" Content-Type)" = "$(header "$2" Content-Type)" ] &&
		[ "$(header "$1" Location)" = "$(header "$2" Location)" ] &&
		[ "$(same_body "$1" "$2")" = same ]; then
		echo same
	else
		echo different
	fi
}

# hold_charges / release_charges: a session that locks charges, so that a
# request which has claimed its key and called the card network waits at
# its INSERT, in progress, until the test has seen what it wants to see
hold_charges() {
	rm -f "$WORK/holder.in"
	mkfifo "$WORK/holder.in" || exit 1
	cluster_psql "$DB" -d payments -q <"$WORK/holder.in" >"$WORK/holder.log" 2>&1 &
	HOLDER_PID=$!
	exec 8>"$WORK/holder.in"
	echo "BEGIN; LOCK TABLE charges IN EXCLUSIVE MODE;" >&8
	wait_sql "SELECT count(*) FROM pg_locks WHERE relation = 'charges'::regclass AND mode = 'ExclusiveLock' AND granted" 1 ||
		not_ok "the test session could not lock charges"
}
release_charges() {
	echo "COMMIT;" >&8
	exec 8>&-
	wait "$HOLDER_PID"
	HOLDER_PID=""
}
# requests of the service blocked at their INSERT by hold_charges
BLOCKED_SQL="SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payments-work' AND wait_event_type = 'Lock'"
# duplicates waiting inside idem_claim for the request that holds their key
WAITING_SQL="SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payments-claims' AND state = 'active' AND query LIKE '%idem_claim%'"

B1='{"amount": 1999, "currency": "eur", "description": "order 42"}'
B1_REORDERED='{ "currency":"eur","description":"order 42",   "amount":1999 }'
B2='{"amount": 2999, "currency": "eur", "description": "order 42"}'

# ---------------------------------------------------------------- docs
echo "# retention and waiting are published in the documentation (draft: expiry policy)"
curl -sS -H 'Accept: application/json' -o "$R/doc.body" "$URL/docs/idempotency"
check "docs: key_retention_seconds" "$(json doc 'd["key_retention_seconds"]')" 7200
check "docs: concurrent_wait_seconds" "$(json doc 'd["concurrent_wait_seconds"]')" 60
curl -sS -o "$R/dochtml.body" "$URL/docs/idempotency"
check "docs (HTML): retention" \
	"$(grep -c 'kept for 2 hours .*<span id="retention-seconds">7200</span> seconds' "$R/dochtml.body")" 1

# ---------------------------------------------------------------- replay
echo "# first request, then a retry"
check "first request: status" "$(post first "$B1" -H 'Idempotency-Key: "k-1"')" 201
check "first request: not marked as a replay" "$(replayed first)" ""
check "first request: Location" "$(header first Location)" "/charges/$(json first 'd["id"][3:]')"
check "first request: Content-Type" "$(header first Content-Type)" application/json
check "retry (same JSON, other key order and spacing): status" \
	"$(post retry "$B1_REORDERED" -H 'Idempotency-Key: "k-1"')" 201
check "retry: Idempotent-Replayed" "$(replayed retry)" true
check "retry: status, Content-Type, Location and body bytes of the first" "$(same_reply first retry)" same
check "one charge for k-1" "$(charges_for k-1)" 1
check "one card network charge for k-1, the one the charge names" \
	"$(provider_for k-1)/$(sql "SELECT count(*) FROM charges c JOIN provider_charges p ON p.id = c.provider_charge_id WHERE c.idempotency_key = 'k-1'")" 1/1
check "GET the charge" "$(curl -sS -o "$R/get.body" -w '%{http_code}' "$URL$(header first Location)")" 200
check "GET the charge: same charge" "$(json get 'd["id"]')" "$(json first 'd["id"]')"
check "stored: the body's bytes" "$(lookup k-1 "encode(response_raw, 'hex')")" "$(body_hex first)"
check "stored: Location and Content-Type, nothing else" \
	"$(lookup k-1 "response_headers::text")" \
	"{\"Location\": \"$(header first Location)\", \"Content-Type\": \"application/json\"}"
check "stored: the request, kept for the recoverer" "$(lookup k-1 "request->>'amount'")" 1999

echo "# the key's lifetime is the published retention"
check "expires_at - claimed_at of k-1" \
	"$(lookup k-1 "extract(epoch FROM expires_at - claimed_at)::int")" 7200

echo "# only Content-Type, Location and ETag of a stored response are replayed"
sql "SET ROLE payments_app;
BEGIN;
SELECT status FROM idem_claim('k-hdr', '$B1', 'acct_default POST /charges', '2h');
SELECT idem_complete('k-hdr', 201, scope => 'acct_default POST /charges',
    response_headers => '{\"content-type\": \"text/plain\", \"Set-Cookie\": \"session=secret\",
                          \"ETag\": \"\\\"v1\\\"\", \"X-Debug\": \"x\", \"Location\": \"/charges/0\"}',
    response_raw => '\\x68656c6c6f0a');
COMMIT;" >/dev/null
check "stored by hand: replayed" "$(post hdr "$B1" -H 'Idempotency-Key: "k-hdr"')/$(replayed hdr)" 201/true
check "stored by hand: raw body" "$(cat "$R/hdr.body")" hello
check "stored by hand: Content-Type, ETag, Location" \
	"$(header hdr Content-Type) $(header hdr ETag) $(header hdr Location)" 'text/plain "v1" /charges/0'
check "stored by hand: no Set-Cookie, no X-Debug" \
	"$(grep -ciE '^(set-cookie|x-debug):' "$R/hdr.hdr")" 0

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
check "declined: same status, Content-Type and body" "$(same_reply decline decline2)" same
check "declined: no charge, one declined card network call" \
	"$(charges_for k-big)/$(sql "SELECT string_agg(outcome, ',') FROM provider_charges WHERE metadata->>'idempotency_key' = 'k-big'")" 0/declined

echo "# the card network charged nothing: the key is released"
check "card network down: status" \
	"$(post down "$B1" -H 'Idempotency-Key: "k-down"' -H 'Test-Fail: card-network-down')" 503
check "card network down: Retry-After" "$(header down Retry-After)" 1
check "card network down: key released, nothing charged" \
	"$(lookup k-down status)/$(charges_for k-down)/$(provider_for k-down)" released/0/0
check "retry: made now, not replayed" \
	"$(post down2 "$B1" -H 'Idempotency-Key: "k-down"')/$(replayed down2)" 201/
check "card network down then retry: one charge" "$(charges_for k-down)/$(provider_for k-down)" 1/1

# ---------------------------------------------------------------- waiting
echo "# a duplicate of a slow charge waits for its result"
# The first request is held at its INSERT, after its claim and the card
# network call, until the duplicate is seen waiting in idem_claim.
hold_charges
post slow "$B1" -H 'Idempotency-Key: "k-slow"' >"$R/slow.code" &
slow_pid=$!
wait_sql "$BLOCKED_SQL" 1 || not_ok "the first request did not reach its INSERT"
check "first request: the key is in progress" "$(lookup k-slow status)" in_progress
post dup "$B1" -H 'Idempotency-Key: "k-slow"' >"$R/dup.code" &
dup_pid=$!
wait_sql "$WAITING_SQL" 1 || not_ok "the duplicate did not wait in idem_claim"
release_charges
wait "$slow_pid" "$dup_pid"
check "first request: made the charge" "$(cat "$R/slow.code")/$(replayed slow)" 201/
check "duplicate: waited and got the replay, not 409" "$(cat "$R/dup.code")/$(replayed dup)" 201/true
check "duplicate: status, Content-Type, Location and body of the first" "$(same_reply slow dup)" same
check "k-slow: one charge, one card network charge" "$(charges_for k-slow)/$(provider_for k-slow)" 1/1

# parallel NAME KEY URL [CURL_ARG...]: 20 parallel curl requests with one
# key, in the background (pids in PAR_PIDS); codes go to $R/NAME-I.code
PAR_PIDS=()
parallel() {
	local name=$1 key=$2 url=$3 i
	shift 3
	PAR_PIDS=()
	for i in $(seq 1 20); do
		TARGET=$url post "$name-$i" "$B1" -H "Idempotency-Key: \"$key\"" "$@" \
			>"$R/$name-$i.code" 2>"$R/$name-$i.err" &
		PAR_PIDS+=($!)
	done
}
# summary NAME: how many of the 20 got which code, "r" for replayed
summary() {
	local i
	for i in $(seq 1 20); do
		echo "$(cat "$R/$1-$i.code") $(replayed "$1-$i")"
	done | sort | uniq -c | awk '{ printf "%s:%s%s ", $1, $2, ($3 ? "r" : "") }'
}
# answered NAME: how many of the 20 requests have their answer
answered() {
	local i n=0
	for i in $(seq 1 20); do
		[ -s "$R/$1-$i.code" ] && n=$((n + 1))
	done
	echo "$n"
}
# all_same_reply NAME: every 201 has the status, headers and body of the first
all_same_reply() {
	local i first=""
	for i in $(seq 1 20); do
		[ "$(cat "$R/$1-$i.code")" = 201 ] || continue
		[ -n "$first" ] || first=$1-$i
		if [ "$(same_reply "$first" "$1-$i")" != same ]; then
			echo "$1-$i differs from $first"
			return
		fi
	done
	echo same
}

echo "# 20 parallel requests with one fresh key: one charge, everyone gets it"
parallel par k-par "$URL" -H 'Test-Delay-Ms: 1000'
wait "${PAR_PIDS[@]}"
check "parallel: exactly one charge, one card network charge" "$(charges_for k-par)/$(provider_for k-par)" 1/1
check "parallel: one 201 made it, 19 waited and replayed it" "$(summary par)" "1:201 19:201r "
check "parallel: every answer has the same headers and body" "$(all_same_reply par)" same

echo "# --wait-timeout 0, the draft's 409: duplicates of a running charge get 409 at once"
hold_charges
parallel strict k-strict "$URL_STRICT"
wait_sql "$BLOCKED_SQL" 1 || not_ok "strict: no request reached its INSERT"
end=$((SECONDS + WAIT_SECONDS))
while [ "$(answered strict)" -lt 19 ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.05; done
check "strict: while the first is held, the 19 others are answered" "$(answered strict)" 19
release_charges
wait "${PAR_PIDS[@]}"
check "strict: one 201, 19 x 409" "$(summary strict)" "1:201 19:409 "
check "strict: exactly one charge" "$(charges_for k-strict)/$(provider_for k-strict)" 1/1
for i in $(seq 1 20); do
	if [ "$(cat "$R/strict-$i.code")" = 409 ]; then
		check "409: Retry-After" "$(header "strict-$i" Retry-After)" 1
		check "409: Link" "$(header "strict-$i" Link | grep -c 'rel="describedby"')" 1
		check "409: title" "$(json "strict-$i" 'd["title"]')" "A request is outstanding for this Idempotency-Key"
		break
	fi
done
check "strict: a retry afterwards replays" \
	"$(TARGET=$URL_STRICT post strict-after "$B1" -H 'Idempotency-Key: "k-strict"')/$(replayed strict-after)" 201/true

echo "# --wait-timeout 1s: 409 once the wait bound is reached"
hold_charges
TARGET=$URL_SHORT post short "$B1" -H 'Idempotency-Key: "k-short"' >"$R/short.code" &
short_pid=$!
wait_sql "$BLOCKED_SQL" 1 || not_ok "the first request did not reach its INSERT"
t0=$(date +%s.%N)
code=$(TARGET=$URL_SHORT post short-dup "$B1" -H 'Idempotency-Key: "k-short"')
t1=$(date +%s.%N)
check "duplicate: 409 after waiting at least the 1 s bound" \
	"$code $(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a >= 1.0 ? "waited" : "at once after " b - a " s") }')" \
	"409 waited"
check "409 after the wait: Retry-After" "$(header short-dup Retry-After)" 1
release_charges
wait "$short_pid"
check "first request: status" "$(cat "$R/short.code")" 201
check "a retry afterwards replays" \
	"$(TARGET=$URL_SHORT post short2 "$B1" -H 'Idempotency-Key: "k-short"')/$(replayed short2)/$(same_reply short short2)" 201/true/same

# ---------------------------------------------------------------- crashes
# The crash instance claims with a 2 s lease: what it leaves in progress
# becomes recoverable soon.
echo "# a failure after the card network charged: left for a retry after the lease"
check "failure after the INSERT: status" \
	"$(TARGET=$URL_CRASH post take "$B1" -H 'Idempotency-Key: "k-take"' -H 'Test-Fail: after-insert')" 500
check "failure: the INSERT rolled back" "$(charges_for k-take)" 0
check "failure: the card network charged once" "$(provider_for k-take)" 1
check "failure: the key stays in progress" "$(lookup k-take status)" in_progress
wait_sql "$(lapsed k-take)" t || not_ok "k-take: the lease did not lapse"
check "retry after the lease: takes over and makes the charge" \
	"$(TARGET=$URL_CRASH post take2 "$B1" -H 'Idempotency-Key: "k-take"')/$(replayed take2)" 201/
check "exactly once: one charge, one card network charge" "$(charges_for k-take)/$(provider_for k-take)" 1/1
check "another retry replays it" \
	"$(TARGET=$URL_CRASH post take3 "$B1" -H 'Idempotency-Key: "k-take"')/$(replayed take3)/$(same_reply take2 take3)" 201/true/same

echo "# ... or finished by recoverer.py --once"
check "failure after the INSERT: status" \
	"$(TARGET=$URL_CRASH post fail "$B1" -H 'Idempotency-Key: "k-fail"' -H 'Test-Fail: after-insert')" 500
check "failure: no charge, one card network charge, key in progress" \
	"$(charges_for k-fail)/$(provider_for k-fail)/$(lookup k-fail status)" 0/1/in_progress
wait_sql "$(lapsed k-fail)" t || not_ok "k-fail: the lease did not lapse"
recoverer "$WORK/recoverer-once.log" --once
check "recoverer --once: exit status" "$?" 0
check "recoverer --once: completed k-fail, nothing else" \
	"$(grep -c "completed key 'k-fail' of 'acct_default POST /charges' with 201" "$WORK/recoverer-once.log")/$(grep -c 'stopped: 1 completed, 0 failed' "$WORK/recoverer-once.log")" 1/1
check "exactly once: one charge, one card network charge" "$(charges_for k-fail)/$(provider_for k-fail)" 1/1
check "a retry replays the recovered charge" \
	"$(post fail2 "$B1" -H 'Idempotency-Key: "k-fail"')/$(replayed fail2)/$(header fail2 Location)" \
	"201/true//charges/$(sql "SELECT id FROM charges WHERE idempotency_key = 'k-fail'")"

echo "# a charge slower than its lease is taken over: its own completion is refused as stale"
# The first request is held at its INSERT past its lease; the recoverer
# takes the key over and is held at its INSERT too; then both go on.
hold_charges
TARGET=$URL_CRASH post stale "$B1" -H 'Idempotency-Key: "k-stale"' >"$R/stale.code" &
stale_pid=$!
wait_sql "$BLOCKED_SQL" 1 || not_ok "k-stale: the first request did not reach its INSERT"
wait_sql "$(lapsed k-stale)" t || not_ok "k-stale: the lease did not lapse"
RECOVERER_BG=1 recoverer "$WORK/recoverer-stale.log" --once
wait_sql "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payments-recoverer' AND wait_event_type = 'Lock'" 1 ||
	not_ok "k-stale: the recoverer did not reach its INSERT"
release_charges
wait "$RECOVERER_PID"
check "recoverer --once: completed k-stale" \
	"$?/$(grep -c "completed key 'k-stale' of 'acct_default POST /charges' with 201" "$WORK/recoverer-stale.log")" 0/1
RECOVERER_PID=""
wait "$stale_pid"
check "the first request: its completion refused, it answers with the recoverer's result" \
	"$(cat "$R/stale.code")/$(replayed stale)/$(grep -c "key 'k-stale' was taken over" "$WORK/server-crash.log")" 201/true/1
check "exactly once: one charge, one card network charge" "$(charges_for k-stale)/$(provider_for k-stale)" 1/1
check "the answer is the stored one" "$(body_hex stale)" "$(lookup k-stale "encode(response_raw, 'hex')")"

echo "# the server is SIGKILLed during the card network call; the recoverer finishes the charge"
TARGET=$URL_CRASH post kill "$B1" -H 'Idempotency-Key: "k-kill"' -H 'Test-Delay-Ms: 600000' \
	>"$R/kill.code" 2>/dev/null &
kill_pid=$!
# the card network has charged and the server waits for its answer
wait_sql "SELECT count(*) FROM provider_charges WHERE metadata->>'idempotency_key' = 'k-kill'" 1 ||
	not_ok "k-kill: the card network was not called"
check "k-kill: in progress during the call" "$(lookup k-kill status)" in_progress
kill -KILL "$CRASH_PID"
{ wait "$CRASH_PID"; } 2>/dev/null   # no "Killed" job notice
wait "$kill_pid"
check "the client got no answer" "$(cat "$R/kill.code")" 000
check "killed mid-call: no charge, key in progress with its request" \
	"$(charges_for k-kill)/$(lookup k-kill "status || ' ' || (request->>'amount')")" "0/in_progress 1999"
token_before=$(lookup k-kill token)
RECOVERER_BG=1 recoverer "$WORK/recoverer.log" --interval 0.1
wait_sql "SET ROLE payments_app; SELECT status FROM idem_lookup('k-kill', 'acct_default POST /charges')" completed ||
	not_ok "k-kill: the recoverer did not complete the key"
kill -TERM "$RECOVERER_PID"
wait "$RECOVERER_PID"
check "recoverer: exits 0 on SIGTERM" "$?" 0
RECOVERER_PID=""
check "recoverer: said it stopped" "$(grep -c 'stopped: 1 completed, 0 failed' "$WORK/recoverer.log")" 1
check "exactly once: one charge, one card network charge, linked" \
	"$(charges_for k-kill)/$(provider_for k-kill)/$(sql "SELECT count(*) FROM charges c JOIN provider_charges p ON p.id = c.provider_charge_id WHERE c.idempotency_key = 'k-kill' AND p.metadata->>'idempotency_key' = 'k-kill'")" 1/1/1
check "completed by the recoverer, with a newer token" \
	"$(lookup k-kill "response_code || ' ' || (token > $token_before)")" "201 true"
kill_id=$(sql "SELECT id FROM charges WHERE idempotency_key = 'k-kill'")
check "the client's retry (to another instance) replays 201" \
	"$(post kill2 "$B1" -H 'Idempotency-Key: "k-kill"')/$(replayed kill2)" 201/true
check "replay: Location and Content-Type" "$(header kill2 Location) $(header kill2 Content-Type)" \
	"/charges/$kill_id application/json"
check "replay: the stored body bytes" "$(body_hex kill2)" "$(lookup k-kill "encode(response_raw, 'hex')")"
check "replay: the charge" "$(json kill2 'd["id"] + " " + str(d["amount"])')" "ch_$kill_id 1999"
check "another retry: the same reply" \
	"$(post kill3 "$B1" -H 'Idempotency-Key: "k-kill"')/$(same_reply kill2 kill3)" 201/same
check "nothing is left for a recoverer" \
	"$(sql "SET ROLE payments_app; BEGIN; SELECT count(*) FROM idem_recover('1 second', NULL, 10); ROLLBACK")" 0

echo
if [ "$FAILS" -ne 0 ]; then
	echo "http test: $FAILS check(s) failed"
	exit 1
fi
echo "http test: all checks passed"
exit 0
