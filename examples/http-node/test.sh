#!/usr/bin/env bash
#
# examples/http-node/test.sh -- end-to-end test of the example payments API
# on pg-idempotency's Express 5 middleware (examples/http-node/server.js):
# starts a throwaway cluster, loads the extension and schema.sql, installs
# the example's locked packages (npm ci, pg-idempotency from clients/node)
# in the scratch directory, starts the server on 127.0.0.1 and drives it
# with curl.
#
#   bash examples/http-node/test.sh                    # by hand, as root or not
#   SUITES=examples bash test/run-all.sh               # with the other examples
#
# Checks: a retry replays the stored status, Content-Type, Location, ETag
# and body bytes with Idempotent-Replayed: true, and one payment is made; the key
# reused with another body is 422 (a problem document under the policy
# page); another account's reuse of a key is its own payment, and a
# request without an API key is 401; no key, a key over 255 bytes or two
# Idempotency-Key fields are 400 and write nothing (255 bytes is fine); a
# body refused before the claim leaves the key unused; a handler that throws
# after its INSERT answers 5xx, its INSERT rolled back and the key unused,
# and the retry runs again; a duplicate of a request in flight gets 409 with
# Retry-After; 20 parallel requests with one key make one payment, every
# other answer a replay of it or a 409; after the server is killed and
# started again, a retry replays the first response byte for byte.
#
# Needs Node.js 20 or later with npm (NODE, or node on PATH; skipped, exit
# 77, without them), the npm registry or an npm cache holding the locked
# packages, and curl.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG,
# EXAMPLES_PORT_BASE (default 54450; BASE is the cluster's socket, BASE+1 on
# 127.0.0.1 the server's port), NODE, WAIT_SECONDS (300), KEEP_WORKDIR=1.
# Exit status 0 = pass.  The cluster and the server are stopped on exit; the
# scratch directory is kept when the test fails.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/skip.sh
. "$SRC/test/lib/skip.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${EXAMPLES_PORT_BASE:-54450}
PORT=$((BASE + 1))
URL="http://127.0.0.1:$PORT"
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi
# how long a wait for a condition may take (a bound for a hung test, not
# for a slow machine)
WAIT_SECONDS=${WAIT_SECONDS:-300}

# ---------------------------------------------------------------- node, npm
node_ok() {
	local major
	major=$("$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null) || return 1
	[ "${major:-0}" -ge 20 ]
}
NODE_BIN=""
for n in ${NODE:-} node /usr/bin/node; do
	if command -v "$n" >/dev/null 2>&1 && node_ok "$n"; then
		NODE_BIN=$(command -v "$n")
		break
	fi
done
[ -n "$NODE_BIN" ] ||
	skip_unavailable "needs Node.js 20 or later with npm (found: $(node --version 2>/dev/null || echo none))"
PATH="$(dirname "$NODE_BIN"):$PATH"
export PATH
# npm trusts the certificate authorities this machine trusts (Node.js
# itself knows only its own list; a TLS proxy's authority is in the system's)
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -r /etc/ssl/certs/ca-certificates.crt ]; then
	export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
command -v npm >/dev/null 2>&1 || skip_unavailable "needs npm beside $NODE_BIN"
command -v curl >/dev/null 2>&1 || {
	echo "http-node test: curl is not installed" >&2
	exit 1
}
echo "node $("$NODE_BIN" --version), npm $(npm --version), $("$PG_CONFIG" --version)"

# ---------------------------------------------------------------- cleanup
WORK=""
SERVER_PID=""
HOLDER_PID=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	exec 8>&- 2>/dev/null
	[ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null
	if [ -n "$SERVER_PID" ]; then
		kill "$SERVER_PID" 2>/dev/null
		wait "$SERVER_PID" 2>/dev/null
	fi
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
		if [ "$rc" -ne 0 ]; then
			for f in "$WORK"/*.log "$WORK/cluster/postgresql.log"; do
				[ -f "$f" ] && { echo "---- $f (last 30 lines)"; tail -n 30 "$f"; }
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

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-http-node.XXXXXX") || exit 1
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

# ---------------------------------------------------------------- the app
# A copy of the example beside a link to clients/node, so that its
# file:../../clients/node dependency resolves and the source tree is left
# as it is.
APP="$WORK/app/examples/http-node"
mkdir -p "$APP" "$WORK/app/clients" || exit 1
ln -s "$SRC/clients/node" "$WORK/app/clients/node" || exit 1
cp "$HERE/server.js" "$HERE/package.json" "$HERE/package-lock.json" "$APP/" || exit 1
# --install-links=false: pg-idempotency is a link, as the lockfile has it
# (npm 9, Debian 13's, would copy it, and then fail to place its peer pg)
(cd "$APP" && npm ci --no-audit --no-fund --install-links=false) >"$WORK/npm.log" 2>&1 || {
	cat "$WORK/npm.log"
	echo "http-node test: npm ci failed (needs the npm registry, or a cache with the locked packages)" >&2
	exit 1
}

# ---------------------------------------------------------------- database
DB="$WORK/cluster"
cluster_start "$DB" "$BASE" "fsync = off" "max_connections = 100" \
	"shared_preload_libraries = 'idempotency'" || exit 1
cluster_psql "$DB" -q -c "CREATE DATABASE payments" || exit 1
cluster_psql "$DB" -q -d payments <<EOF || exit 1
CREATE EXTENSION idempotency;
\i $HERE/schema.sql
-- the server runs as an ordinary role: EXECUTE on idem_* comes with the
-- extension, the rest is ours to grant
CREATE ROLE payments_app LOGIN;
GRANT SELECT, INSERT ON payments TO payments_app;
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
payments_for() { sql "SELECT count(*) FROM payments WHERE idempotency_key = '$1'"; }
# lookup KEY EXPR: EXPR over idem_lookup() of KEY, as the server's role (the
# middleware's scope is [caller, method, route]: acct_1's keys)
lookup() { sql "SET ROLE payments_app; SELECT $2 FROM idem_lookup('$1', '[\"acct_1\",\"POST\",\"/payments\"]')"; }
# the last id the payments' identity gave out (rolled back INSERTs too)
last_id() { sql "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('payments', 'id')), 0)"; }

# ---------------------------------------------------------------- server
# start_server: start server.js as payments_app and wait until it answers
start_server() {
	local end
	(cd "$APP" && exec env PGHOST="$DB/sock" PGPORT="$BASE" PGDATABASE=payments \
		PGUSER=payments_app PGAPPNAME=payments-node PORT="$PORT" PAYMENTS_TEST_HOOKS=1 \
		PAYMENTS_API_KEYS=sk_test_1:acct_1,sk_test_2:acct_2 \
		"$NODE_BIN" server.js) >>"$WORK/server.log" 2>&1 &
	SERVER_PID=$!
	end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		curl -sf -o /dev/null "$URL/docs/idempotency" && return 0
		if ! kill -0 "$SERVER_PID" 2>/dev/null; then
			echo "http-node test: server.js exited; log:" >&2
			cat "$WORK/server.log" >&2
			SERVER_PID=""
			return 1
		fi
		sleep 0.1
	done
	echo "http-node test: server.js did not answer on port $PORT" >&2
	return 1
}
start_server || exit 1

# post NAME BODY [CURL_ARG...]: POST /payments as the account of API_KEY
# (default sk_test_1, acct_1), save headers and body as $R/NAME.hdr /
# $R/NAME.body, print the status code
post() {
	local name=$1 body=$2
	shift 2
	curl -sS -o "$R/$name.body" -D "$R/$name.hdr" -w '%{http_code}' \
		-X POST -H 'Content-Type: application/json' --data-binary "$body" \
		-H "Authorization: Bearer ${API_KEY-sk_test_1}" "$@" "$URL/payments"
}
# header NAME FIELD: value of a response header (last one), CR stripped
header() {
	tr -d '\r' <"$R/$1.hdr" | awk -v f="$2" 'BEGIN { f = tolower(f) ":" }
		tolower($1) == f { sub(/^[^:]*:[ \t]*/, ""); v = $0 } END { print v }'
}
replayed() { header "$1" Idempotent-Replayed; }
# field NAME KEY: a top-level field of a JSON response body
field() { "$NODE_BIN" -p 'String(JSON.parse(require("fs").readFileSync(process.argv[1]))[process.argv[2]])' "$R/$1.body" "$2"; }
body_hex() { od -An -v -tx1 "$R/$1.body" | tr -d ' \n'; }
# same_reply NAME OTHER: status line, Content-Type, Location, ETag and body
# bytes equal
same_reply() {
	if [ "$(head -n 1 "$R/$1.hdr")" = "$(head -n 1 "$R/$2.hdr")" ] &&
		[ "$(header "$1" Content-Type)" = "$(header "$2" Content-Type)" ] &&
		[ "$(header "$1" Location)" = "$(header "$2" Location)" ] &&
		[ "$(header "$1" ETag)" = "$(header "$2" ETag)" ] &&
		cmp -s "$R/$1.body" "$R/$2.body"; then
		echo same
	else
		echo different
	fi
}

B1='{"amount": 1999, "currency": "eur"}'
B1_REORDERED='{ "currency":"eur",   "amount":1999 }'
B2='{"amount": 2500, "currency": "eur"}'

# ---------------------------------------------------------------- replay
echo "# first use of a key, then retries"
check "first request: status" "$(post first "$B1" -H 'Idempotency-Key: "k-1"')" 201
check "first request: not a replay" "$(replayed first)" ""
first_id=$(sql "SELECT id FROM payments WHERE idempotency_key = 'k-1'")
check "first request: Location and id of the payment" \
	"$(header first Location) $(field first id)" "/payments/$first_id pay_$first_id"
check "retry: 201, Idempotent-Replayed: true" "$(post retry "$B1" -H 'Idempotency-Key: "k-1"')/$(replayed retry)" 201/true
check "retry: status, Content-Type, Location, ETag and body bytes of the first" "$(same_reply first retry)" same
check "retry with the body's keys reordered: the same request, replayed" \
	"$(post reordered "$B1_REORDERED" -H 'Idempotency-Key: k-1')/$(replayed reordered)/$(same_reply first reordered)" 201/true/same
check "k-1: one payment" "$(payments_for k-1)" 1
check "the stored response is the bytes sent" "$(lookup k-1 "response_code || ' ' || encode(response_raw, 'hex')")" \
	"201 $(body_hex first)"

echo "# the key again with another body"
check "other body: 422" "$(post mismatch "$B2" -H 'Idempotency-Key: "k-1"')" 422
check "422: a problem document" "$(header mismatch Content-Type)" application/problem+json
check "422: its type, under the policy page" "$(field mismatch type)" /docs/idempotency#mismatch
check "k-1: still one payment, of the first amount" "$(sql "SELECT string_agg(amount::text, ',') FROM payments WHERE idempotency_key = 'k-1'")" 1999

# ---------------------------------------------------------------- accounts
echo "# keys are per account: another account's reuse of a key is its own payment"
check "acct_1, k-acct: 201" "$(post acct1 "$B1" -H 'Idempotency-Key: "k-acct"')" 201
check "acct_2, the same key and body: 201, not a replay of acct_1's" \
	"$(API_KEY=sk_test_2 post acct2 "$B1" -H 'Idempotency-Key: "k-acct"')/$(replayed acct2)/$(same_reply acct1 acct2)" 201//different
check "k-acct: two payments" "$(payments_for k-acct)" 2
check "no API key: 401, nothing written" \
	"$(API_KEY='' post noauth "$B1" -H 'Idempotency-Key: "k-noauth"')/$(payments_for k-noauth)" 401/0

# ---------------------------------------------------------------- 400
echo "# missing or bad keys: 400, nothing written"
before="$(sql "SELECT count(*) FROM payments")/$(last_id)"
check "no Idempotency-Key: 400" "$(post nokey "$B1")/$(field nokey title)" "400/Idempotency-Key is missing"
long=$(printf 'k%.0s' $(seq 1 256))
check "256-byte key: 400" "$(post long "$B1" -H "Idempotency-Key: \"$long\"")/$(field long title)" \
	"400/Idempotency-Key is too long"
check "256-byte bare key: 400" "$(post longbare "$B1" -H "Idempotency-Key: $long")" 400
check "two Idempotency-Key fields: 400" \
	"$(post two "$B1" -H 'Idempotency-Key: "k-2"' -H 'Idempotency-Key: "k-3"')/$(field two title)" \
	"400/More than one Idempotency-Key"
check "nothing written by a 400 (no payment, no INSERT tried)" \
	"$(sql "SELECT count(*) FROM payments")/$(last_id)" "$before"
check "no key of theirs was claimed" "$(lookup k-2 status)$(lookup k-3 status)" ""
check "255-byte key: 201" "$(post long255 "$B1" -H "Idempotency-Key: \"${long:1}\"")" 201
check "255-byte key: one payment" "$(payments_for "${long:1}")" 1
check "invalid body: 400 before the claim" "$(post badbody '{"amount": -1}' -H 'Idempotency-Key: "k-body"')" 400
check "... so the fixed body may use the key" \
	"$(post goodbody "$B1" -H 'Idempotency-Key: "k-body"')/$(replayed goodbody)/$(payments_for k-body)" 201//1

# ---------------------------------------------------------------- 5xx
echo "# the handler throws after its INSERT: rolled back, the retry runs again"
id_before=$(last_id)
code=$(post fail "$B1" -H 'Idempotency-Key: "k-fail"' -H 'Test-Fail: after-insert')
check "throw after the INSERT: 5xx" "${code:0:1}" 5
check "the INSERT ran (an id was taken) and was rolled back" \
	"$(($(last_id) - id_before))/$(payments_for k-fail)" 1/0
check "the key is unused (no claim kept)" "$(lookup k-fail status)" ""
check "retry with the same key: runs again, 201, not a replay" \
	"$(post fail2 "$B1" -H 'Idempotency-Key: "k-fail"')/$(replayed fail2)" 201/
check "k-fail: one payment" "$(payments_for k-fail)" 1
check "another retry replays it" \
	"$(post fail3 "$B1" -H 'Idempotency-Key: "k-fail"')/$(replayed fail3)/$(same_reply fail2 fail3)" 201/true/same

# ---------------------------------------------------------------- 409
# hold_payments / release_payments: a session that locks payments, so that
# a request which has claimed its key waits at its INSERT, in flight
hold_payments() {
	rm -f "$WORK/holder.in"
	mkfifo "$WORK/holder.in" || exit 1
	cluster_psql "$DB" -d payments -q <"$WORK/holder.in" >"$WORK/holder.log" 2>&1 &
	HOLDER_PID=$!
	exec 8>"$WORK/holder.in"
	echo "BEGIN; LOCK TABLE payments IN EXCLUSIVE MODE;" >&8
	wait_sql "SELECT count(*) FROM pg_locks WHERE relation = 'payments'::regclass AND mode = 'ExclusiveLock' AND granted" 1 ||
		not_ok "the test session could not lock payments"
}
release_payments() {
	echo "COMMIT;" >&8
	exec 8>&-
	wait "$HOLDER_PID"
	HOLDER_PID=""
}
BLOCKED_SQL="SELECT count(*) FROM pg_stat_activity WHERE application_name = 'payments-node' AND wait_event_type = 'Lock'"

echo "# a duplicate of a request in flight: 409 with Retry-After"
hold_payments
post held "$B1" -H 'Idempotency-Key: "k-held"' >"$R/held.code" &
held_pid=$!
wait_sql "$BLOCKED_SQL" 1 || not_ok "the first request did not reach its INSERT"
# the duplicate must be answered while the first is held; should it block
# too (a second session waiting for the lock), the test goes on and fails
post dup "$B1" -H 'Idempotency-Key: "k-held"' >"$R/dup.code" &
dup_pid=$!
end=$((SECONDS + WAIT_SECONDS))
while [ ! -s "$R/dup.code" ] && [ "$(sql "$BLOCKED_SQL")" -lt 2 ] && [ "$SECONDS" -lt "$end" ]; do
	sleep 0.05
done
check "duplicate answered while the first is in flight" "$([ -s "$R/dup.code" ] && echo answered)" answered
release_payments
wait "$held_pid" "$dup_pid"
check "duplicate: 409" "$(cat "$R/dup.code")" 409
check "409: Retry-After" "$(header dup Retry-After)" 1
check "409: title" "$(field dup title)" "A request is outstanding for this Idempotency-Key"
check "the first request: 201" "$(cat "$R/held.code")/$(replayed held)" 201/
check "a retry afterwards replays it" \
	"$(post held2 "$B1" -H 'Idempotency-Key: "k-held"')/$(replayed held2)/$(same_reply held held2)" 201/true/same
check "k-held: one payment" "$(payments_for k-held)" 1

echo "# 20 parallel requests with one key: one payment"
pids=()
for i in $(seq 1 20); do
	post "par-$i" "$B1" -H 'Idempotency-Key: "k-par"' \
		>"$R/par-$i.code" 2>"$R/par-$i.err" &
	pids+=($!)
done
wait "${pids[@]}"
check "parallel: exactly one payment" "$(payments_for k-par)" 1
made="" n201=0 nreplay=0 n409=0 bad=""
for i in $(seq 1 20); do
	code=$(cat "$R/par-$i.code")
	if [ "$code" = 201 ] && [ -z "$(replayed "par-$i")" ]; then
		n201=$((n201 + 1))
		made=par-$i
	elif [ "$code" = 201 ] && [ "$(replayed "par-$i")" = true ]; then
		nreplay=$((nreplay + 1))
	elif [ "$code" = 409 ] && [ "$(header "par-$i" Retry-After)" = 1 ]; then
		n409=$((n409 + 1))
	else
		bad+=" par-$i:$code"
	fi
done
echo "  ($n201 made it, $nreplay replays, $n409 x 409)"
check "parallel: one 201 made the payment" "$n201" 1
check "parallel: every other answer a replay or 409 with Retry-After" "${bad:-none}" none
for i in $(seq 1 20); do
	if [ "$(replayed "par-$i")" = true ] && [ "$(same_reply "$made" "par-$i")" != same ]; then
		not_ok "parallel: par-$i's replay differs from $made's answer"
	fi
done
check "parallel: a retry afterwards replays the one that made it" \
	"$(post par-after "$B1" -H 'Idempotency-Key: "k-par"')/$(replayed par-after)/$(same_reply "$made" par-after)" 201/true/same

# ---------------------------------------------------------------- restart
echo "# the server is killed and started again: the stored response is replayed"
kill -KILL "$SERVER_PID"
{ wait "$SERVER_PID"; } 2>/dev/null   # no "Killed" job notice
SERVER_PID=""
check "the server is gone" "$(curl -s -o /dev/null -w '%{http_code}' "$URL/docs/idempotency")" 000
start_server || exit 1
check "after the restart: 201, replayed" "$(post restarted "$B1" -H 'Idempotency-Key: "k-1"')/$(replayed restarted)" 201/true
check "after the restart: status, Content-Type, Location, ETag and body bytes of the first response" \
	"$(same_reply first restarted)" same
check "after the restart: the body byte for byte" "$(body_hex restarted)" "$(body_hex first)"
check "k-1: still one payment" "$(payments_for k-1)" 1

echo
if [ "$FAILS" -ne 0 ]; then
	echo "http-node test: $FAILS check(s) failed"
	exit 1
fi
echo "http-node test: all checks passed"
exit 0
