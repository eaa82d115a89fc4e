#!/usr/bin/env bash
# bench/scale.sh -- the cost curve of the ledgers as they grow past memory.
#
#   bash bench/scale.sh                 # 1M, 10M and 50M live entries (~25 min)
#   SCALE_SIZES="1000000 5000000" SCALE_ROUNDS=3 bash bench/scale.sh
#   BENCH_SMOKE=1 bash bench/scale.sh   # seconds: does the script still work?
#
# One throwaway cluster with shared_buffers well below the data (256 MB),
# two databases side by side: "led" (the extension's ledgers, default
# settings: message ttl 7 days in 7 lanes, key ttl 1 day) and "plain" (what
# applications hand-roll: plain_messages (consumer, message_id) with its
# primary key, raw_keys (key) with its primary key).  Both are filled to
# each size in turn, the same number of live entries on both sides, by a
# bulk path (INSERT ... SELECT into the ledger's partitioned table, the
# digest index built after the load, the same for the plain tables' primary
# keys): ledger rows with the namespace prefix of the measured consumer or
# scope, random key bytes, expiries spread over the ttl, each in its lane;
# plain rows with ids of the very form the measured calls send ('k' and a
# random number, random UUID text), so that new ids land all over the
# existing index on both sides.
# Then, at each size, after reading the probed indexes of both sides into
# the OS page cache and an unmeasured run of each side, in interleaved rounds:
#
#   consume   idem_consume_message('scale', random UUID)  vs
#             INSERT INTO plain_messages ... ON CONFLICT DO NOTHING
#   claim     BEGIN; idem_claim(k); idem_complete(k); COMMIT  vs
#             BEGIN; INSERT INTO raw_keys ... ON CONFLICT DO NOTHING; UPDATE; COMMIT
#
# with pgbench (4 clients, prepared statements, synchronous_commit off), and
# reports tps, p99 latency (from pgbench's per-transaction log), bytes on
# disk per live entry (heap + indexes + TOAST) and shared-buffer hits and
# reads per transaction (pg_stat_database of each database), as a table in
# bench/results/scale-latest.txt and a plot in bench/results/scale-latest.png
# (gnuplot).  Ratios are medians of the per-round ratios.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SMOKE     1 = the smallest run that goes through every step, for
#                   the test suite; exit status 0 whatever the figures [0]
#   SCALE_SIZES     live entries per ledger, ascending   [1000000 10000000 50000000/2000]
#   SCALE_ROUNDS    interleaved rounds per workload       [5/1]
#   SCALE_SECONDS   seconds per pgbench run               [6/1]
#   SCALE_PORT      port (unix socket only)               [54471]
#   SCALE_FILTER_MB idempotency.filter_memory in MB  [6 bytes x the largest size, at least 64]
#   SCALE_BUILD     auto|1|0: make install first          [auto]
#   PGBIN           PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS   directory of the results files        [bench/results, bench/results/smoke]
#   SCALE_PLOT_ONLY 1: only draw the plot again from the last run's table
#
# Exit status (bench/lib.sh, bench_status): 0 all goals PASS; 3 some goal
# FAIL or SKIP; 1 the run failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # BENCH_NAME and BUILD are read by bench/lib.sh
BENCH_NAME=scale.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin)
export PG_CONFIG=$PGBIN/pg_config
SIZES=${SCALE_SIZES:-$(bench_size "1000000 10000000 50000000" 2000)}
ROUNDS=${SCALE_ROUNDS:-$(bench_size 5 1)}
SECS=${SCALE_SECONDS:-$(bench_size 6 1)}
PORT=${SCALE_PORT:-54471}
# shellcheck disable=SC2034
BUILD=${SCALE_BUILD:-auto}
CLIENTS=4
RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
OUT=$RESDIR/scale-latest.txt
DATA=$RESDIR/scale-latest.dat
PNG=$RESDIR/scale-latest.png
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

# ---------------------------------------------------------------- plot
# the table in $DATA as three panels in $PNG; its first line names the server
plot_results() {
    local ver
    if ! command -v gnuplot >/dev/null 2>&1; then
        note "gnuplot is not installed: no plot (apt-get install gnuplot-nox)"
        return 0
    fi
    ver=$(sed -n 's/^# server: //p' "$DATA")
    gnuplot <<EOF || { note "gnuplot failed; no plot"; return 0; }
set terminal pngcairo size 1200,420 font ",10" noenhanced
set output "$PNG"
set multiplot layout 1,3 title "idempotency at scale: PostgreSQL $ver, shared_buffers 256MB, $CLIENTS clients, median of interleaved rounds (bench/scale.sh)"
set logscale x
set xrange [500000:100000000]
set format x "%.0s%c"
set xlabel "live entries per ledger"
set key bottom left
set grid
set ylabel "transactions per second"
set title "throughput"
set yrange [0:*]
plot "$DATA" using 1:3 with linespoints title "idem_consume_message", \
     "$DATA" using 1:4 with linespoints title "plain INSERT ON CONFLICT", \
     "$DATA" using 1:12 with linespoints title "idem_claim + idem_complete", \
     "$DATA" using 1:13 with linespoints title "raw INSERT + UPDATE"
set title "extension / raw SQL (higher is better)"
set ylabel "throughput ratio"
set yrange [0:1.5]
plot "$DATA" using 1:2 with linespoints title "consume", \
     "$DATA" using 1:11 with linespoints title "claim + complete", \
     1 with lines dashtype 2 title ""
set title "bytes on disk per live entry (heap + indexes)"
set ylabel "bytes"
set yrange [0:*]
plot "$DATA" using 1:20 with linespoints title "message ledger", \
     "$DATA" using 1:21 with linespoints title "plain (consumer, message_id) table", \
     "$DATA" using 1:22 with linespoints title "key ledger", \
     "$DATA" using 1:23 with linespoints title "raw_keys table"
unset multiplot
EOF
    [ -f "$PNG" ] && say "plot: $PNG"
}

if [ "${SCALE_PLOT_ONLY:-0}" = 1 ]; then
    OUT=/dev/null
    plot_results
    exit 0
fi
: >"$OUT"

T0=$(date +%s)

# ---------------------------------------------------------------- cluster
bench_build "$REPO"
# preloaded, as production runs it: the digest filters skip the partitions
# a new key cannot be in (sized for both ledgers at the largest size: a
# filter takes 1.25 to 2.5 bytes per row, its segments being power-of-two
# runs of pages, about 1.8 measured here; 3 bytes per row leaves room for
# the pool's alignment, where 2 left a partition of the 50M run without
# one); maintenance (which builds them after each bulk fill) runs when
# this script says so, not between rounds
MAXSIZE=0
for n in $SIZES; do [ "$n" -gt "$MAXSIZE" ] && MAXSIZE=$n; done
FILTER_MB=${SCALE_FILTER_MB:-$(( (MAXSIZE * 2 * 3 / 1048576) > 64 ? (MAXSIZE * 2 * 3 / 1048576) : 64 ))}
bench_cluster "$PORT" "shared_buffers = 256MB" "synchronous_commit = off" "fsync = off" \
    "full_page_writes = off" "wal_level = minimal" "max_wal_senders = 0" \
    "max_wal_size = 8GB" "checkpoint_timeout = 30min" "maintenance_work_mem = 1GB" \
    "autovacuum = off" "log_min_messages = warning" \
    "shared_preload_libraries = 'idempotency'" "idempotency.naptime = '1d'" \
    "idempotency.filter_memory = '${FILTER_MB}MB'"
PGVER=$(qval postgres "SHOW server_version")

qval postgres "CREATE DATABASE led" >/dev/null
qval postgres "CREATE DATABASE plain" >/dev/null
q led >/dev/null <<'EOF'
CREATE EXTENSION idempotency;
CREATE EXTENSION pg_prewarm;
SELECT idem_maintain();
SELECT idem_consume_message('probe', 'probe');
BEGIN; SELECT idem_claim('probe'); SELECT idem_complete('probe', 200); COMMIT;
-- a digest of namespace 'scale' (src/keyhash.c: 4 bytes of SHA-256 of the
-- namespace, then 12 bytes of hash of the id): the id bytes here are taken
-- from md5 of a counter, which is far cheaper than SHA-256 or
-- gen_random_uuid() and as uniform for the index
CREATE FUNCTION scale_digest(n bigint) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
  SELECT (encode(substring(sha256(int4send(5) || 'scale'::bytea) FROM 1 FOR 4), 'hex')
          || substr(md5(n::text), 1, 24))::uuid $$;
-- the lane value of a current partition for a digest under "lanes" lanes
CREATE FUNCTION scale_lane(d uuid, lanes int) RETURNS int2 LANGUAGE sql AS $$
  SELECT (-32768 + lanes * 256 +
          (get_byte(uuid_send(d), 12)::bigint + get_byte(uuid_send(d), 13)::bigint * 256 +
           get_byte(uuid_send(d), 14)::bigint * 65536 +
           get_byte(uuid_send(d), 15)::bigint * 16777216) % lanes)::int2 $$;
EOF
q plain >/dev/null <<'EOF'
CREATE EXTENSION pg_prewarm;
CREATE TABLE plain_messages (consumer text NOT NULL, message_id text NOT NULL,
                             consumed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE raw_keys (key text NOT NULL, status text NOT NULL, response_code int,
                       response_body jsonb, created_at timestamptz NOT NULL DEFAULT now());
EOF

cat >"$WORK/consume_idem.sql" <<'EOF'
SELECT idem_consume_message('scale', gen_random_uuid()::text);
EOF
cat >"$WORK/consume_plain.sql" <<'EOF'
INSERT INTO plain_messages (consumer, message_id) VALUES ('scale', gen_random_uuid()::text) ON CONFLICT DO NOTHING;
EOF
cat >"$WORK/claim_idem.sql" <<'EOF'
\set r random(1, 9223372036854775806)
BEGIN;
SELECT status FROM idem_claim('k' || :r, '{"amount": 100}', scope => 'scale');
SELECT idem_complete('k' || :r, 201, '{"charge": 1}', scope => 'scale');
COMMIT;
EOF
cat >"$WORK/claim_plain.sql" <<'EOF'
\set r random(1, 9223372036854775806)
BEGIN;
INSERT INTO raw_keys (key, status) VALUES ('k' || :r, 'in_progress') ON CONFLICT DO NOTHING;
UPDATE raw_keys SET status = 'completed', response_code = 201, response_body = '{"charge": 1}' WHERE key = 'k' || :r;
COMMIT;
EOF
chmod 644 "$WORK"/*.sql

# ---------------------------------------------------------------- fill
# adds rows so that each side holds $1 live entries per ledger
FILLED=0
fill_to() {
    local n=$1 add=$(( $1 - FILLED )) t
    [ "$add" -gt 0 ] || return 0
    t=$(now)
    note "filling to $n entries per ledger (+$add) ..."
    # drop the indexes, load, build them again: the bulk path
    q led >/dev/null <<EOF
-- the partitions' digest indexes belong to the parents' partitioned ones
-- (the recovery index too: made again after the digest index, it stays
-- the second of each key partition's indexes, as a fresh ledger has them)
DROP INDEX idempotency.messages_role_digest_idx;
DROP INDEX idempotency.keys_role_digest_idx;
DROP INDEX idempotency.keys_recover_idx;
INSERT INTO idempotency.messages
SELECT e, d, to_regrole(current_user), scale_lane(d, 7)
  FROM (SELECT scale_digest(g) AS d,
               now() + interval '1 minute' + random() * interval '6 days 23 hours' AS e
          FROM generate_series($FILLED + 1, $n) g) s;
INSERT INTO idempotency.keys (expires_at, digest, role, lane, state, token, claimed_at,
                              fingerprint, response_code, response_body)
SELECT e, d, to_regrole(current_user), scale_lane(d, 1), 'c', 1, e - interval '1 day',
       sha256(convert_to('{"amount": 100}', 'UTF8')), 201, '{"charge": 1}'
  FROM (SELECT scale_digest(-g) AS d,
               now() + interval '1 minute' + random() * interval '23 hours' AS e
          FROM generate_series($FILLED + 1, $n) g) s;
CREATE INDEX messages_role_digest_idx ON idempotency.messages (role, digest) WITH (deduplicate_items = off);
CREATE INDEX keys_role_digest_idx ON idempotency.keys (role, digest) WITH (deduplicate_items = off);
CREATE INDEX keys_recover_idx ON idempotency.keys (role, recover_at) WHERE recover_at IS NOT NULL;
VACUUM ANALYZE;
-- the bulk load made the digest filters unusable: build them from the rows
SELECT idem_maintain();
EOF
    q plain >/dev/null <<EOF
SET client_min_messages = warning;
ALTER TABLE plain_messages DROP CONSTRAINT IF EXISTS plain_messages_pkey;
ALTER TABLE raw_keys DROP CONSTRAINT IF EXISTS raw_keys_pkey;
INSERT INTO plain_messages (consumer, message_id)
SELECT 'scale', md5(g::text)::uuid::text FROM generate_series($FILLED + 1, $n) g;
INSERT INTO raw_keys (key, status, response_code, response_body)
SELECT 'k' || (hashint8extended(g, 0) & 9223372036854775807), 'completed', 201, '{"charge": 1}'
  FROM generate_series($FILLED + 1, $n) g;
ALTER TABLE plain_messages ADD PRIMARY KEY (consumer, message_id);
ALTER TABLE raw_keys ADD PRIMARY KEY (key);
VACUUM ANALYZE;
EOF
    qval postgres "CHECKPOINT" >/dev/null
    FILLED=$n
    note "  filled in $(awk -v a="$t" -v b="$(now)" 'BEGIN{printf "%.0f", b - a}') s"
}

# sanity: the bulk-loaded rows are what the extension finds
check_fill() {
    local ok
    ok=$(qval led "SELECT count(*) FROM idempotency.messages m
                    WHERE m.lane <> scale_lane(m.digest, 7)") || die "fill check failed"
    [ "$ok" = 0 ] || die "$ok bulk-loaded message rows are not in their lane"
    # every live partition has a usable digest filter (else calls probe it)
    ok=$(qval led "SELECT count(*) FROM idempotency.partitions p
                    WHERE NOT p.expired AND NOT EXISTS (
                          SELECT FROM idempotency.filter_info() f
                           WHERE f.partition = p.partition AND f.state = 'ready')") ||
        die "filter check failed"
    FILTERS_MISSING=$ok
    [ "$ok" = 0 ] || note "!!! $ok live partitions have no usable digest filter (idempotency.filter_memory too small?)"
}

# ---------------------------------------------------------------- measure
# run_one db script tag -> "tps p99_ms hits_per_txn reads_per_txn"
run_one() {
    local db=$1 script=$2 tag=$3 out tps p99 before after
    before=$(qval postgres "SELECT blks_hit || ' ' || blks_read FROM pg_stat_database WHERE datname = '$db'")
    rm -f "$WORK"/pgbench_log.*
    out=$(cd "$WORK" && cluster_run "$C" pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" \
              -l --sampling-rate=0.2 -f "$WORK/$script" "$db" 2>&1) \
        || { printf '%s\n' "$out" >&2; die "pgbench failed: $tag"; }
    # (a here-string, not a pipe: under pipefail, grep -q leaving at its
    # match could fail the printf writing into the pipe, a false alarm)
    grep -q 'number of failed transactions: 0 ' <<<"$out" \
        || { printf '%s\n' "$out" >&2; die "pgbench had failed transactions: $tag"; }
    tps=$(printf '%s\n' "$out" | awk '/^tps = /{print $3; exit}')
    # latencies in the log are in microseconds
    p99=$(cat "$WORK"/pgbench_log.* | awk '{print $3}' | pct 0.99 |
          awk '{ if ($1 == "NA") print "NA"; else printf "%.3f", $1 / 1000 }')
    qval "$db" "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1 || true
    after=$(qval postgres "SELECT blks_hit || ' ' || blks_read FROM pg_stat_database WHERE datname = '$db'")
    awk -v t="$tps" -v p="$p99" -v b="$before" -v a="$after" -v s="$SECS" 'BEGIN{
        split(b, x, " "); split(a, y, " "); n = t * s;
        printf "%s %s %.1f %.2f\n", t, p, (y[1] - x[1]) / n, (y[2] - x[2]) / n }'
}

# Before a workload's rounds at each size: read the indexes it probes into
# the OS page cache on both sides (pg_prewarm 'read': not into shared
# buffers, which stay at 256 MB) and run it once, unmeasured, on each side.
# Without this the rounds would start from whatever the fill left in the
# page cache: the side filled first is evicted by the other side's load,
# and its first rounds measure the disk (see bench/README.md).
warm() {   # workload
    local w=$1 rel
    if [ "$w" = consume ]; then rel=messages; else rel=keys; fi
    qval led "SELECT sum(pg_prewarm(i.indexrelid, 'read'))
                FROM pg_index i JOIN idempotency.partitions p ON p.partition = i.indrelid
               WHERE p.table_name = '$rel'" >/dev/null
    if [ "$w" = consume ]; then rel=plain_messages_pkey; else rel=raw_keys_pkey; fi
    qval plain "SELECT pg_prewarm('$rel', 'read')" >/dev/null
    run_one led "${w}_idem.sql" "$w idem warm-up" >/dev/null
    run_one plain "${w}_plain.sql" "$w plain warm-up" >/dev/null
}

bytes_per_entry() {   # db -> bytes per live entry of each ledger "messages keys"
    # divided by the rows there are (the fill plus what earlier rounds
    # inserted), not by the size filled to
    if [ "$1" = led ]; then
        qval led "SELECT round(sum(bytes) FILTER (WHERE table_name = 'messages') /
                               (SELECT count(*) FROM idempotency.messages), 1) || ' ' ||
                         round(sum(bytes) FILTER (WHERE table_name = 'keys') /
                               (SELECT count(*) FROM idempotency.keys), 1)
                    FROM idempotency.partitions"
    else
        qval plain "SELECT round(pg_total_relation_size('plain_messages') /
                                 (SELECT count(*) FROM plain_messages)::numeric, 1) || ' ' ||
                           round(pg_total_relation_size('raw_keys') /
                                 (SELECT count(*) FROM raw_keys)::numeric, 1)"
    fi
}

say "bench/scale.sh: PostgreSQL $PGVER, shared_buffers 256MB, $CLIENTS clients, ${SECS}s runs, $ROUNDS interleaved rounds"
say "sizes: $SIZES"
printf '# server: %s\n' "$PGVER" >"$DATA"
printf '# size  c_ratio c_tps_e c_tps_p c_p99_e c_p99_p c_hit_e c_read_e c_hit_p c_read_p  k_ratio k_tps_e k_tps_p k_p99_e k_p99_p k_hit_e k_read_e k_hit_p k_read_p  b_msg_e b_msg_p b_key_e b_key_p\n' >>"$DATA"

declare -A RATIO=()
for n in $SIZES; do
    fill_to "$n"
    check_fill
    say "$n: digest filters: $(qval led "SELECT count(*) FILTER (WHERE state = 'ready') || ' ready of ' || count(*) || ', ' || coalesce(sum(digests), 0) || ' digests, ' || pg_size_pretty(coalesce(sum(bytes), 0)) FROM idempotency.filter_info()") (live partitions without one: $FILTERS_MISSING)"
    read -r bme bke <<<"$(bytes_per_entry led)"
    read -r bmp bkp <<<"$(bytes_per_entry plain)"
    row="$n"
    for w in consume claim; do
        warm "$w"
        ratios=(); te=(); tp=(); pe=(); pp=(); he=(); re=(); hp=(); rp=()
        for r in $(seq 1 "$ROUNDS"); do
            # alternate which side goes first
            if [ $((r % 2)) = 1 ]; then
                read -r a1 a2 a3 a4 <<<"$(run_one led "${w}_idem.sql" "$n $w idem r$r")"
                read -r b1 b2 b3 b4 <<<"$(run_one plain "${w}_plain.sql" "$n $w plain r$r")"
            else
                read -r b1 b2 b3 b4 <<<"$(run_one plain "${w}_plain.sql" "$n $w plain r$r")"
                read -r a1 a2 a3 a4 <<<"$(run_one led "${w}_idem.sql" "$n $w idem r$r")"
            fi
            raw "  $n $w round $r: idem tps $a1 p99 ${a2}ms hit/txn $a3 read/txn $a4 | plain tps $b1 p99 ${b2}ms hit/txn $b3 read/txn $b4 | ratio $(div "$a1" "$b1")"
            ratios+=("$(div "$a1" "$b1")"); te+=("$a1"); tp+=("$b1"); pe+=("$a2"); pp+=("$b2")
            he+=("$a3"); re+=("$a4"); hp+=("$b3"); rp+=("$b4")
        done
        RATIO[$w.$n]=$(median "${ratios[@]}")
        row="$row  ${RATIO[$w.$n]} $(median "${te[@]}") $(median "${tp[@]}") $(median "${pe[@]}") $(median "${pp[@]}") $(median "${he[@]}") $(median "${re[@]}") $(median "${hp[@]}") $(median "${rp[@]}")"
    done
    row="$row  $bme $bmp $bke $bkp"
    echo "$row" >>"$DATA"
    say ""
    say "== $n live entries per ledger"
    awk -v r="$row" 'BEGIN{ split(r, f, " ");
        printf "consume: idem/raw %s  tps %s vs %s  p99 %s vs %s ms  buffers/txn hit %s read %s vs hit %s read %s\n", f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10];
        printf "claim+complete: idem/raw %s  tps %s vs %s  p99 %s vs %s ms  buffers/txn hit %s read %s vs hit %s read %s\n", f[11], f[12], f[13], f[14], f[15], f[16], f[17], f[18], f[19];
        printf "bytes per live entry: messages %s vs %s (%.2fx), keys %s vs %s (%.2fx)\n", f[20], f[21], f[20]/f[21], f[22], f[23], f[22]/f[23] }' | tee -a "$OUT"
done

# ---------------------------------------------------------------- goals
first=$(echo "$SIZES" | awk '{print $1}')
last=$(echo "$SIZES" | awk '{print $NF}')
say ""
say "== goals"
check "consume idem/raw at $last vs at $first (ratio of ratios)" \
    "$(div "${RATIO[consume.$last]}" "${RATIO[consume.$first]}")" ">=" 1.00
check "claim+complete idem/raw at $last vs at $first (ratio of ratios)" \
    "$(div "${RATIO[claim.$last]}" "${RATIO[claim.$first]}")" ">=" 1.00
while read -r line; do
    case $line in \#*) continue ;; esac
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- $line
    check "bytes per live message id vs plain UUID table at $1" "$(div "${20}" "${21}")" "<=" 0.60
done <"$DATA"
b_first=$(awk -v s="$first" '$1 == s {print $20}' "$DATA")
b_last=$(awk -v s="$last" '$1 == s {print $20}' "$DATA")
check "bytes per live message id at $last vs at $first" "$(div "$b_last" "$b_first")" "<=" 1.00

# ---------------------------------------------------------------- plot
plot_results
say ""
say "command: SCALE_SIZES='$SIZES' SCALE_ROUNDS=$ROUNDS SCALE_SECONDS=$SECS bash bench/scale.sh"
say "elapsed: $(( $(date +%s) - T0 )) s"
exit "$(bench_status)"
