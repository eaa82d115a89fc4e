#!/usr/bin/env bash
#
# bench/callgrind.sh -- CPU instructions per call, counted by Valgrind's
# callgrind, for the extension's calls and the plain SQL they replace.
#
#   bash bench/callgrind.sh                 # every workload, a table
#   WORKLOADS="claim_complete consume" bash bench/callgrind.sh
#   CALLS=200 bash bench/callgrind.sh       # fewer calls
#   BENCH_SMOKE=1 bash bench/callgrind.sh   # 20 calls: does the script still work?
#
# Each workload runs twice in a single-user server (postgres --single) under
# callgrind, once with CALLS statements and once with 2 x CALLS, each
# statement (or BEGIN ... COMMIT group) its own transaction; the difference
# of the two totals divided by CALLS is the cost of one call with its
# commit, the server's start and stop cancelling out.  Instructions, not
# seconds: the same binary on the same inputs gives the same count, however
# busy the machine is, so the figures can be compared across runs and
# against the committed ones (bench/results/callgrind.txt, checked by
# test/t/090_instructions.pl within a stated margin).
#
#   workload         one call is
#   consume          idem_consume_message() of a new id
#   consume_raw      INSERT ... ON CONFLICT DO NOTHING of a new id, plain table
#   batch            one new id of an idem_consume_messages() batch of 100
#                    (CALLS a multiple of 100)
#   claim_complete   BEGIN; idem_claim(); idem_complete(); COMMIT on a new key
#   claim_raw        BEGIN; INSERT; UPDATE; COMMIT on a plain table
#   replay           idem_claim() of a completed key
#   replay_raw       SELECT of a completed key's row, plain table
#
# and, named in WORKLOADS only (not run by default):
#
#   claim_2p         idem_claim(..., lease => '1 min') of a new key, then
#                    in a second transaction idem_complete(..., token); the
#                    token goes from one to the other through a setting
#                    (set_config), the same cost in every build
#   claim_2p_keep    the same with keep_request => true (0.4.0 and later)
#   claim_headers_raw as claim_complete, completed with response_headers
#                    and response_raw instead of a jsonb body (0.4.0 and later)
#   advance          idem_advance() of the next 100 offsets of a partition
#                    (0.4.0 and later)
#   batch_raw        one new id of a plain INSERT ... SELECT ... ON CONFLICT
#                    DO NOTHING RETURNING of 100 ids into the plain table
#                    (CALLS a multiple of 100): the batch's baseline
#   replay_ended     replay, while a partition of the key ledger has ended
#                    and is not dropped yet (the state between a
#                    partition's end and the maintenance run that drops it)
#   advance_raw      the hand-written offsets table's upsert of the same
#                    (INSERT ... ON CONFLICT DO UPDATE SET next_offset =
#                    greatest(...))
#   advance_prep, advance_raw_prep
#                    the statements of bench/streams.sh's advance_100 and
#                    offsets_100, prepared as pgbench -M prepared runs
#                    them: idem_advance() with the generation of an
#                    idem_assign() of the partition (made at set-up), and
#                    the upsert
#   batch1000, batch1000_raw
#                    batch and batch_raw with 1,000 ids per statement, the
#                    statements of bench/run.sh's idem_batch and
#                    plain_batch prepared (CALLS a multiple of 1000)
#   claim_complete_prep, replay_prep
#                    claim_complete and replay through prepared statements
#                    (PREPARE once per run, EXECUTE per call), as pgbench
#                    -M prepared and most drivers call: no parse analysis
#                    or planning of the call (the function's argument
#                    defaults are read from pg_proc and planned there)
#   claim_idem_prep  bench/run.sh's keys_idem as pgbench -M prepared runs
#                    it: the request and response bodies are constants of
#                    the prepared statements, as the raw SQL's body is in
#                    claim_raw_prep (claim_complete_prep passes them as
#                    parameters, each call parsing its jsonb)
#   publish_prep, publish_raw_prep
#                    one event published, prepared, its own transaction:
#                    idem_publish() of a jsonb payload with a key (64
#                    keys in turn), and the hand-written outbox's INSERT
#                    of the same into a table with a bigserial key
#                    (bench/outbox.sh's two sides, one event per statement)
#   claim_field_prep claim_idem_prep with the claim's status taken as a
#                    field of the call's result in the target list,
#                    SELECT (idem_claim(...)).status, instead of from a
#                    function scan, SELECT status FROM idem_claim(...)
#   consume_prep, consume_raw_prep, claim_raw_prep, replay_pl_prep
#                    the statements of bench/run.sh's variants idem_p2,
#                    plain_insert, keys_raw and replay_plpgsql, prepared as
#                    pgbench -M prepared runs them: the prepared pairs of
#                    the throughput bars (consume_prep / consume_raw_prep,
#                    claim_complete_prep / claim_raw_prep, replay_prep /
#                    replay_pl_prep)
#
# The clock and the locale are pinned, so that a count depends on the
# build and its inputs only: every single-user server of a run starts at the
# same instant, CALLGRIND_CLOCK (default 2030-01-16 12:00:00 UTC, a
# Wednesday noon, far from the midnight at which daily partitions end and
# begin), through test/lib/clockshift.c (an LD_PRELOAD library that moves
# the wall clock; the clock runs on from there), and the cluster is made
# with initdb --locale=C.UTF-8.  Unpinned, a
# run that crosses the end of a partition measures the calls of the state
# after it: until maintenance drops the ended partition, a call whose key
# the filters do not rule out probes it too (src/probe.c,
# IdemLockEndedPartition), about 11,000 instructions more per replay (up
# to 0.4.0, which asked the lock manager for a SHARE lock first: 22,000,
# see workload replay_ended); and the plain tables'
# text keys cost what the environment's locale makes them cost.
# CALLGRIND_CLOCK=real runs on the real clock (and then the run says so);
# building the library needs a C compiler.
#
# CALLGRIND_PRELOAD=1 runs the server with shared_preload_libraries =
# 'idempotency' (digest filters, statistics), as production servers run
# it; every run then starts with idem_maintain(), which builds the filters
# (shared memory starts empty in each single-user run), counted in both
# runs and so cancelled out.
#
# CALLGRIND_KEY_MEMORY=30d (a number of days) measures with
# idempotency.key_memory on and a full memory (issue 35): before the
# measured runs, on each of that many past days a single-user run claims
# and completes CALLGRIND_MEMORY_KEYS (default 2,000) keys of one scope
# and consumes as many message ids of one consumer, with a ttl of a day,
# and runs maintenance with the memory on, which drops the partitions
# that have ended into the memory (one piece per ended partition); the
# last maintenance runs at the pinned clock.  Every measured run starts
# with SET idempotency.key_memory.
# The keys and ids the workloads use are new: what is measured is the
# cost of a never-seen key or id with the memory on, against the same
# workloads run without this setting.  The run also prints the storage
# of the memory: bytes per remembered key and message id (the pieces'
# heap and index, pg_total_relation_size), and bytes per ledger row (the
# partitions' heap and indexes, just before they were dropped).
#
# CALLGRIND_KEEP=DIR keeps the callgrind output files there
# (<workload>-1.cg for CALLS calls, <workload>-2.cg for 2 x CALLS), for
# callgrind_annotate: where one build spends its instructions per call
# against another.
#
# Environment: PGBIN or PG_CONFIG (bench/lib.sh: PGBIN, else PG_CONFIG's
# bin dir, else /usr/lib/postgresql/15/bin), CALLS (default 1000, or 20
# with BENCH_SMOKE=1, the smallest run for the test suite), WORKLOADS, OUT
# (the results file, default callgrind-latest.txt in BENCH_RESULTS,
# bench/results or bench/results/smoke).  Needs valgrind; runs the server as
# the current user, or as "postgres" when run as root.  The extension must
# be installed for that server.

set -euo pipefail

BENCH_NAME=callgrind.sh
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
PG_CONFIG=$(bench_pgbin)/pg_config
CALLS=${CALLS:-$(bench_size 1000 20)}
WORKLOADS=${WORKLOADS:-consume consume_raw claim_complete claim_raw replay replay_raw}
OUT=${OUT:-$(bench_resdir)/callgrind-latest.txt}
mkdir -p "$(dirname "$OUT")"

command -v valgrind >/dev/null || die "valgrind is not installed (apt install valgrind)"
BINDIR=$("$PG_CONFIG" --bindir)

AS_USER=()
PRELOAD_OPT=()
[ "${CALLGRIND_PRELOAD:-0}" != 1 ] || PRELOAD_OPT=(-c "shared_preload_libraries=idempotency")
[ "$(id -u)" -ne 0 ] || AS_USER=(runuser -u postgres --)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-callgrind.XXXXXX")
chmod 755 "$WORK"
[ "$(id -u)" -ne 0 ] || chown postgres "$WORK"
trap 'rm -rf "$WORK"' EXIT

# the pinned clock: every server below starts at CALLGRIND_CLOCK
CLOCK=${CALLGRIND_CLOCK:-2030-01-16 12:00:00 UTC}
FAKE_ENV=()
if [ "$CLOCK" != real ]; then
	clock_epoch=$(date -u -d "$CLOCK" +%s) || die "CALLGRIND_CLOCK is not a date: $CLOCK"
	# shellcheck source=test/lib/clockshift.sh
	. "$REPO/test/lib/clockshift.sh"
	clockshift=$(clockshift_build "$WORK/lib") ||
		die "could not build test/lib/clockshift.c (needs a C compiler), or set CALLGRIND_CLOCK=real"
fi
# fake_clock EPOCH: FAKE_ENV for servers whose clock starts at EPOCH, and
# runs on from there
fake_clock() {
	[ "$CLOCK" != real ] || return 0
	FAKE_ENV=(env LD_PRELOAD="$clockshift" IDEM_CLOCK_START="$1" TZ=UTC)
}
fake_clock "${clock_epoch:-0}"

"${AS_USER[@]}" "$BINDIR/initdb" -D "$WORK/data" -A trust -U postgres \
	--locale=C.UTF-8 --encoding=UTF8 >/dev/null || die "initdb failed"

# one single-user server run of a script; prints its total instruction count
# ($3 = a name for the output file) or nothing when not under callgrind
single() {
	local script="$1" tool="$2" name="$3" out
	out="$WORK/$name.out"
	if [ "$tool" = callgrind ]; then
		"${AS_USER[@]}" "${FAKE_ENV[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.cg" \
			"$BINDIR/postgres" --single -D "$WORK/data" -c fsync=off \
			-c synchronous_commit=off "${PRELOAD_OPT[@]}" postgres <"$script" >"$out" 2>&1 ||
			{ tail -n 20 "$out" >&2; die "the single-user server failed ($name)"; }
		grep -E '^(summary|totals):' "$WORK/$name.cg" | head -n 1 | awk '{print $2}'
	else
		"${AS_USER[@]}" "${FAKE_ENV[@]}" "$BINDIR/postgres" --single -D "$WORK/data" -c fsync=off \
			"${PRELOAD_OPT[@]}" postgres <"$script" >"$out" 2>&1 ||
			{ tail -n 20 "$out" >&2; die "the single-user server failed ($name)"; }
	fi
	if grep -q 'ERROR' "$out"; then
		grep -m 3 'ERROR' "$out" >&2
		die "a statement failed ($name)"
	fi
}

# the statements of workload $1 for calls $2 .. $3 (new ids/keys each run)
statements() {
	local w="$1" from="$2" to="$3" i
	for ((i = from; i <= to; i++)); do
		case $w in
		consume) echo "SELECT idem_consume_message('c', 'm$i')" ;;
		consume_raw) echo "INSERT INTO plain_msg VALUES ('c', 'm$i', now() + interval '7 days') ON CONFLICT DO NOTHING" ;;
		batch)
			# one id of a batch of 100: a statement per 100 calls
			if (((i - from) % 100 == 0)); then
				echo "SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'b' || g FROM generate_series($i, $((i + 99))) g))"
			fi
			;;
		batch1000)
			[ "$i" != "$from" ] || echo "PREPARE batch1000(int) AS SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'k' || g FROM generate_series(\$1, \$1 + 999) g))"
			if (((i - from) % 1000 == 0)); then echo "EXECUTE batch1000($i)"; fi
			;;
		batch1000_raw)
			[ "$i" != "$from" ] || echo "PREPARE batch1000_raw(int) AS WITH t AS (INSERT INTO plain_msg SELECT 'c', 'k' || g, now() + interval '7 days' FROM generate_series(\$1, \$1 + 999) g ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) FROM t"
			if (((i - from) % 1000 == 0)); then echo "EXECUTE batch1000_raw($i)"; fi
			;;
		batch_raw)
			if (((i - from) % 100 == 0)); then
				echo "WITH t AS (INSERT INTO plain_msg SELECT 'c', 'b' || g, now() + interval '7 days' FROM generate_series($i, $((i + 99))) g ON CONFLICT DO NOTHING RETURNING id) SELECT count(*) FROM t"
			fi
			;;
		claim_complete)
			echo "BEGIN"
			echo "SELECT status FROM idem_claim('k$i', '{\"amount\": $i}')"
			echo "SELECT idem_complete('k$i', 201, '{\"charge\": $i}')"
			echo "COMMIT"
			;;
		claim_raw)
			echo "BEGIN"
			echo "INSERT INTO plain_keys (key, fingerprint, expires_at) VALUES ('k$i', sha256('{\"amount\": $i}'), now() + interval '1 day')"
			echo "UPDATE plain_keys SET status = 'completed', code = 201, body = '{\"charge\": $i}' WHERE key = 'k$i'"
			echo "COMMIT"
			;;
		claim_2p | claim_2p_keep)
			echo "SELECT set_config('bench.token', token::text, false) FROM idem_claim('k$i', '{\"amount\": $i}', lease => '1 min'$([ "$w" = claim_2p ] || echo ", keep_request => true"))"
			echo "SELECT idem_complete('k$i', 201, '{\"charge\": $i}', token => current_setting('bench.token')::bigint)"
			;;
		claim_headers_raw)
			echo "BEGIN"
			echo "SELECT status FROM idem_claim('k$i', '{\"amount\": $i}')"
			echo "SELECT idem_complete('k$i', 201, response_headers => '{\"Location\": \"/charges/$i\", \"Content-Type\": \"text/csv\"}', response_raw => convert_to('charge,$i', 'UTF8'))"
			echo "COMMIT"
			;;
		claim_complete_prep)
			if [ "$i" = "$from" ]; then
				echo "PREPARE claim(text, jsonb) AS SELECT status FROM idem_claim(\$1, \$2)"
				echo "PREPARE complete(text, jsonb) AS SELECT idem_complete(\$1, 201, \$2)"
			fi
			echo "BEGIN"
			echo "EXECUTE claim('k$i', '{\"amount\": $i}')"
			echo "EXECUTE complete('k$i', '{\"charge\": $i}')"
			echo "COMMIT"
			;;
		replay_prep)
			if [ "$i" = "$from" ]; then
				echo "PREPARE replay(text, jsonb) AS SELECT status, response_code, response_body FROM idem_claim(\$1, \$2)"
			fi
			echo "EXECUTE replay('done$(((i - 1) % 500 + 1))', '{\"amount\": 1}')"
			;;
		consume_prep)
			[ "$i" != "$from" ] || echo "PREPARE consume(text) AS SELECT idem_consume_message('c', \$1)"
			echo "EXECUTE consume('p$i')"
			;;
		consume_raw_prep)
			[ "$i" != "$from" ] || echo "PREPARE consume_raw(text) AS INSERT INTO plain_messages (consumer, message_id) VALUES ('c', \$1) ON CONFLICT DO NOTHING"
			echo "EXECUTE consume_raw('p$i')"
			;;
		claim_idem_prep | claim_field_prep)
			# the claim's status from a function scan, or as a field of the call
			c=c claim="status FROM idem_claim(\$1, '{\"amount\": 100, \"currency\": \"eur\"}')"
			[ "$w" = claim_idem_prep ] || c=f claim="(idem_claim(\$1, '{\"amount\": 100, \"currency\": \"eur\"}')).status"
			if [ "$i" = "$from" ]; then
				echo "PREPARE claim_$c(text) AS SELECT $claim"
				echo "PREPARE complete_$c(text) AS SELECT idem_complete(\$1, 201, '{\"charge\": 1}')"
			fi
			echo "BEGIN"
			echo "EXECUTE claim_$c('k$i')"
			echo "EXECUTE complete_$c('k$i')"
			echo "COMMIT"
			;;
		claim_raw_prep)
			if [ "$i" = "$from" ]; then
				echo "PREPARE raw_claim(text) AS INSERT INTO raw_keys (key, status) VALUES (\$1, 'in_progress') ON CONFLICT DO NOTHING"
				echo "PREPARE raw_complete(text) AS UPDATE raw_keys SET status = 'completed', response_code = 201, response_body = '{\"charge\": 1}' WHERE key = \$1"
			fi
			echo "BEGIN"
			echo "EXECUTE raw_claim('k$i')"
			echo "EXECUTE raw_complete('k$i')"
			echo "COMMIT"
			;;
		replay_pl_prep)
			[ "$i" != "$from" ] || echo "PREPARE pl_replay(text, jsonb) AS SELECT status, response_code, response_body FROM pl_claim(\$1, \$2)"
			echo "EXECUTE pl_replay('done$(((i - 1) % 500 + 1))', '{\"amount\": 1}')"
			;;
		publish_prep)
			[ "$i" != "$from" ] || echo "PREPARE pub(int) AS SELECT idem_publish('orders', jsonb_build_object('order', \$1, 'total', 99.5), 'k' || (\$1 % 64))"
			echo "EXECUTE pub($i)"
			;;
		publish_raw_prep)
			[ "$i" != "$from" ] || echo "PREPARE pub_raw(int) AS INSERT INTO plain_outbox (topic, key, payload) VALUES ('orders', 'k' || (\$1 % 64), jsonb_build_object('order', \$1, 'total', 99.5))"
			echo "EXECUTE pub_raw($i)"
			;;
		advance) echo "SELECT count(*) FROM idem_advance('c', 's', 0, $((i * 100)), $((i * 100 + 99)))" ;;
		advance_prep)
			[ "$i" != "$from" ] || echo "PREPARE adv(int, bigint, bigint) AS SELECT first_offset, last_offset FROM idem_advance('c', 's', \$1, \$2, \$3, 1)"
			echo "EXECUTE adv(1, $((i * 100)), $((i * 100 + 99)))"
			;;
		advance_raw_prep)
			[ "$i" != "$from" ] || echo "PREPARE offs(int, bigint) AS INSERT INTO plain_offsets (consumer, stream, part, next_offset) VALUES ('c', 's', \$1, \$2) ON CONFLICT (consumer, stream, part) DO UPDATE SET next_offset = greatest(plain_offsets.next_offset, EXCLUDED.next_offset)"
			echo "EXECUTE offs(1, $((i * 100 + 100)))"
			;;
		advance_raw) echo "INSERT INTO plain_offsets VALUES ('c', 's', 0, $((i * 100 + 100))) ON CONFLICT (consumer, stream, part) DO UPDATE SET next_offset = greatest(plain_offsets.next_offset, EXCLUDED.next_offset)" ;;
		replay | replay_ended) echo "SELECT status, response_code, response_body FROM idem_claim('done$(((i - 1) % 500 + 1))', '{\"amount\": 1}')" ;;
		replay_raw) echo "SELECT status, code, body FROM plain_keys WHERE key = 'done$(((i - 1) % 500 + 1))' AND expires_at > now()" ;;
		*) die "unknown workload $w" ;;
		esac
	done
}

# setup, outside callgrind: the extension, its ledgers and partitions, the
# plain tables, and 500 completed keys for the replays
{
	echo "CREATE EXTENSION idempotency"
	echo "SELECT idem_maintain()"
	echo "CREATE TABLE plain_msg (consumer text, id text, expires_at timestamptz, PRIMARY KEY (consumer, id))"
	echo "CREATE TABLE plain_keys (key text PRIMARY KEY, fingerprint bytea, status text DEFAULT 'in_progress', code int, body jsonb, expires_at timestamptz)"
	echo "CREATE TABLE plain_outbox (id bigserial PRIMARY KEY, topic text NOT NULL, key text, payload jsonb, published_at timestamptz NOT NULL DEFAULT now())"
	# the outbox's events table is made by the first event (0.5.0 and later)
	case " $WORKLOADS " in *" publish_prep "*) echo "SELECT idem_publish('orders')" ;; esac
	echo "CREATE TABLE plain_offsets (consumer text, stream text, part int, next_offset bigint, PRIMARY KEY (consumer, stream, part))"
	# partition 1 of stream s, assigned with generation 1 (advance_prep,
	# 0.4.0 and later)
	case " $WORKLOADS " in *" advance_prep "*) echo "SELECT count(*) FROM idem_assign('c', 's', ARRAY[1], 1)" ;; esac
	# bench/run.sh's baselines, one statement per line as the single-user
	# server reads them
	awk '/^--/ { next }
	     { line = line $0 " "; if (gsub(/[$][$]/, "&") % 2 == 1) inq = !inq
	       if (!inq && $0 ~ /;[ \t]*$/) { print line; line = "" } }' \
		"$REPO/bench/sql/setup_plain.sql" "$REPO/bench/sql/setup_keys_plain.sql"
	for ((i = 1; i <= 500; i++)); do
		echo "BEGIN"
		echo "SELECT status FROM idem_claim('done$i', '{\"amount\": 1}')"
		echo "SELECT idem_complete('done$i', 200, '{\"charge\": 1}')"
		echo "COMMIT"
		echo "INSERT INTO plain_keys VALUES ('done$i', sha256('{\"amount\": 1}'), 'completed', 200, '{\"charge\": 1}', now() + interval '1 day')"
		echo "SELECT pl_claim('done$i', '{\"amount\": 1}')"
		echo "SELECT pl_complete('done$i', 200, '{\"charge\": 1}')"
	done
	# a first call of each kind, so that both measured runs find warm catalogs
	statements consume 0 0
	statements claim_complete 0 0
} >"$WORK/setup.sql"
single "$WORK/setup.sql" none setup

# CALLGRIND_KEY_MEMORY: a memory of that many days (see the top)
MEMORY_SET=""
if [ -n "${CALLGRIND_KEY_MEMORY:-}" ]; then
	[ "$CLOCK" != real ] || die "CALLGRIND_KEY_MEMORY needs the pinned clock"
	days=${CALLGRIND_KEY_MEMORY%d}
	[[ "$days" =~ ^[0-9]+$ ]] && [ "$days" -gt 1 ] || die "CALLGRIND_KEY_MEMORY is a number of days, such as 30d"
	MEMORY_SET="SET idempotency.key_memory = '${days}d'"
	per_day=${CALLGRIND_MEMORY_KEYS:-2000}
	for ((d = days; d >= 2; d--)); do
		fake_clock $((clock_epoch - d * 86400))
		{ echo "$MEMORY_SET"
		  echo "SELECT idem_maintain()"
		  echo "BEGIN"
		  echo "SELECT count(*) FROM (SELECT idem_claim('old$d-' || g, '{}', ttl => '1 day'), idem_complete('old$d-' || g, 200, '{}') FROM generate_series(1, $per_day) g) s"
		  echo "COMMIT"
		  echo "SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'old$d-' || g FROM generate_series(1, $per_day) g), ttl => '1 day')"
		} >"$WORK/old$d.sql"
		single "$WORK/old$d.sql" none "old$d"
	done
	fake_clock "$clock_epoch"
	# the ledger rows' bytes, the drop into the memory, then its bytes
	{ echo "SELECT 'ledger ' || p.table_name || ' ' || sum(pg_total_relation_size(p.partition)) || ' ' || sum(CASE p.table_name WHEN 'keys' THEN (SELECT count(*) FROM idempotency.keys k WHERE k.tableoid = p.partition) ELSE (SELECT count(*) FROM idempotency.messages m WHERE m.tableoid = p.partition) END) AS r FROM idempotency.partitions p WHERE p.upper_bound <= now() GROUP BY p.table_name"
	  echo "$MEMORY_SET"
	  echo "SELECT idem_maintain()"
	  echo "SELECT 'memory keys ' || (SELECT sum(pg_total_relation_size(i.inhrelid)) FROM pg_inherits i WHERE i.inhparent = 'idempotency.keys_memory'::regclass) || ' ' || (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = 'idempotency.keys_memory'::regclass) || ' ' || (SELECT sum((length(digests) - 1 - get_byte(digests, 0)) / (16 - get_byte(digests, 0))) FROM idempotency.keys_memory) AS r"
	  echo "SELECT 'memory messages ' || (SELECT sum(pg_total_relation_size(i.inhrelid)) FROM pg_inherits i WHERE i.inhparent = 'idempotency.messages_memory'::regclass) || ' ' || (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = 'idempotency.messages_memory'::regclass) || ' ' || (SELECT sum((length(digests) - 1 - get_byte(digests, 0)) / (16 - get_byte(digests, 0))) FROM idempotency.messages_memory) AS r"
	} >"$WORK/remember.sql"
	single "$WORK/remember.sql" none remember
	# "ledger keys BYTES ROWS" (the partitions the last run drops) and
	# "memory keys BYTES PIECES REMEMBERED" in its output
	sizes=$(grep -oE '"(ledger|memory) [a-z]+ [0-9]+ [0-9]+( [0-9]+)?"' "$WORK/remember.out" | tr -d '"')
	[ -n "$sizes" ] || die "no sizes from the memory's setup"
	MEMORY_SIZES=$(awk '
		$1 == "ledger" { lb[$2] = $3; lr[$2] = $4 }
		$1 == "memory" { mb[$2] = $3; mp[$2] = $4; mn[$2] = $5 }
		END { for (t in mb) { if (mn[t] == 0 || lr[t] == 0) continue
		      printf "# key memory, %s: %d remembered in %d pieces, %.1f bytes each; a ledger row: %.1f bytes\n",
		             t, mn[t], mp[t], mb[t] / mn[t], lb[t] / lr[t] } }' <<<"$sizes")
fi

: >"$OUT"
say "# instructions per call (callgrind), $("$PG_CONFIG" --version), $CALLS calls per run"
if [ "$CLOCK" = real ]; then
	say "# clock: real (counts move when a run crosses the end of a partition), locale C.UTF-8"
else
	say "# clock: pinned at $(date -u -d "@$clock_epoch" '+%Y-%m-%d %H:%M:%S') UTC at each server start, locale C.UTF-8"
fi
if [ -n "$MEMORY_SET" ]; then
	say "# with idempotency.key_memory = '${days}d' and a full memory"
	say "$MEMORY_SIZES"
fi
say "# workload  instructions_per_call"
base=1
for w in $WORKLOADS; do
	{ [ -z "$MEMORY_SET" ] || echo "$MEMORY_SET"
	  [ "${CALLGRIND_PRELOAD:-0}" != 1 ] || echo "SELECT idem_maintain()"
	  statements "$w" "$base" $((base + CALLS - 1)); } >"$WORK/$w-1.sql"
	{ [ -z "$MEMORY_SET" ] || echo "$MEMORY_SET"
	  [ "${CALLGRIND_PRELOAD:-0}" != 1 ] || echo "SELECT idem_maintain()"
	  statements "$w" $((base + CALLS)) $((base + 3 * CALLS - 1)); } >"$WORK/$w-2.sql"
	base=$((base + 3 * CALLS))
	if [ "$w" = replay_ended ]; then
		# a key ledger partition that ends a day before the clock: a
		# key claimed two days earlier with a ttl of a day (nothing runs
		# maintenance in between: the runs below find it ended)
		[ "${CALLGRIND_PRELOAD:-0}" != 1 ] ||
			die "replay_ended is measured without preloading (the runs start with idem_maintain(), which drops the ended partition)"
		[ "$CLOCK" != real ] || die "replay_ended needs the pinned clock"
		fake_clock $((clock_epoch - 2 * 86400))
		{ echo "BEGIN"
		  echo "SELECT status FROM idem_claim('aged', '{}', ttl => '1 day')"
		  echo "SELECT idem_complete('aged', 200, '{}')"
		  echo "COMMIT"; } >"$WORK/aged.sql"
		single "$WORK/aged.sql" none aged
		fake_clock "$clock_epoch"
	fi
	one=$(single "$WORK/$w-1.sql" callgrind "$w-1")
	two=$(single "$WORK/$w-2.sql" callgrind "$w-2")
	if [ -z "$one" ] || [ -z "$two" ]; then die "no instruction count for $w"; fi
	if [ "$w" = replay_ended ]; then
		# maintenance drops the ended partition: the workloads after
		# this one are measured without it
		echo "SELECT idem_maintain()" >"$WORK/drop-ended.sql"
		single "$WORK/drop-ended.sql" none drop-ended
	fi
	if [ -n "${CALLGRIND_KEEP:-}" ]; then
		mkdir -p "$CALLGRIND_KEEP"
		cp "$WORK/$w-1.cg" "$WORK/$w-2.cg" "$CALLGRIND_KEEP/"
	fi
	say "$(awk -v w="$w" -v a="$one" -v b="$two" -v n="$CALLS" 'BEGIN{printf "%-15s %d", w, (b - a) / n}')"
done
