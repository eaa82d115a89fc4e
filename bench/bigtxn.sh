#!/usr/bin/env bash
# bench/bigtxn.sh -- big transactions: does a call cost the same at the end
# of a transaction that made hundreds of thousands of calls as at its start?
#
#   bash bench/bigtxn.sh                       # about 2 minutes
#   BIGTXN_KEYS=100000 BIGTXN_MESSAGES=200000 bash bench/bigtxn.sh
#   BENCH_SMOKE=1 bash bench/bigtxn.sh         # seconds: does the script still work?
#
# On a throwaway cluster (shared_buffers 1GB, so that the ledgers stay in
# memory and the curve shows CPU, not I/O), three transactions, each one
# PL/pgSQL DO block, timed in ten slices of equal numbers of calls:
#
#   keys       BIGTXN_KEYS same-transaction claims of new keys (500,000),
#              then BIGTXN_KEYS completions of the same keys, in the same
#              transaction; then BIGTXN_SAVEPOINTS savepoints (1,000), each
#              claiming one more key and rolled back, while the 500,000
#              claims are still held
#   savepoints the same savepoints in a transaction that holds no claim
#   messages   BIGTXN_MESSAGES consumes of new message ids (1,000,000)
#   baseline   as many INSERT ... ON CONFLICT DO NOTHING into a plain
#              (consumer, message_id) table, for comparison
#
# It prints each phase's per-call cost in the first and the last slice and
# their ratio (goal: last / first <= 1.2), the cost of a savepoint with and
# without the 500,000 claims held (goal: <= 1.2), and the backend's memory
# at the end of each phase (pg_backend_memory_contexts, total bytes), per
# claim held.  Results: bigtxn-latest.txt in BENCH_RESULTS (bench/results).
#
# Environment: BIGTXN_KEYS, BIGTXN_MESSAGES, BIGTXN_SAVEPOINTS (with
# BENCH_SMOKE=1, the smallest run that goes through every step, for the test
# suite: 1000, 2000 and 20, and exit status 0 whatever the figures),
# BIGTXN_PORT [54481], BENCH_BUILD auto|1|0 (make install first when the
# library directory is writable), PGBIN [PG_CONFIG's bin dir, else
# /usr/lib/postgresql/15/bin], BENCH_RESULTS [bench/results, or
# bench/results/smoke].
# Exit status (bench/lib.sh, bench_status): 0 every goal PASS, 3 some goal
# FAIL or SKIP, 1 the run failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # BENCH_NAME and BUILD are read by bench/lib.sh
BENCH_NAME=bigtxn.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin)
export PG_CONFIG=$PGBIN/pg_config
KEYS=${BIGTXN_KEYS:-$(bench_size 500000 1000)}
MESSAGES=${BIGTXN_MESSAGES:-$(bench_size 1000000 2000)}
SAVEPOINTS=${BIGTXN_SAVEPOINTS:-$(bench_size 1000 20)}
PORT=${BIGTXN_PORT:-54481}
# shellcheck disable=SC2034
BUILD=${BENCH_BUILD:-auto}
RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
OUT=$RESDIR/bigtxn-latest.txt
: >"$OUT"
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

T0=$(date +%s)
bench_build "$REPO"
bench_cluster "$PORT" "shared_buffers = 1GB" "synchronous_commit = off" "fsync = off" \
    "max_wal_size = 8GB" "checkpoint_timeout = 30min" "autovacuum = off" \
    "log_min_messages = warning"
PGVER=$(q postgres -At -c "SHOW server_version")

q postgres -o /dev/null <<'EOF'
CREATE EXTENSION idempotency;
SELECT idem_maintain();
CREATE TABLE slices (phase text, slice int, calls int, seconds float8);
-- the baseline: what applications hand-roll (bench/sql/setup_plain.sql)
CREATE TABLE plain_messages (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE TABLE memory (phase text, bytes bigint);
-- times ten slices of n calls of "body" ($1 is the call's number), in the
-- caller's transaction
CREATE FUNCTION timed(phase text, n int, body text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    s  int;
    i  int;
BEGIN
    FOR s IN 0 .. 9 LOOP
        t0 := clock_timestamp();
        FOR i IN s * (n / 10) + 1 .. (s + 1) * (n / 10) LOOP
            EXECUTE body USING i;
        END LOOP;
        INSERT INTO slices
        VALUES (phase, s, n / 10, extract(epoch FROM clock_timestamp() - t0));
    END LOOP;
    INSERT INTO memory
    SELECT phase, sum(total_bytes) FROM pg_backend_memory_contexts;
END
$$;
-- n savepoints, each claiming one key and rolled back
CREATE FUNCTION savepoints(phase text, n int) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    i  int;
BEGIN
    FOR i IN 1 .. n LOOP
        BEGIN
            PERFORM idem_claim(phase || '-sp-' || i);
            RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'roll back';
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END LOOP;
    INSERT INTO slices
    VALUES (phase, 0, n, extract(epoch FROM clock_timestamp() - t0));
END
$$;
EOF

say "bench/bigtxn.sh: PostgreSQL $PGVER, $KEYS keys, $MESSAGES message ids, $SAVEPOINTS savepoints per transaction"
note "keys: $KEYS claims, then $KEYS completions, then $SAVEPOINTS savepoints, in one transaction ..."
q postgres -o /dev/null <<EOF
BEGIN;
SELECT timed('claim', $KEYS, \$\$SELECT idem_claim('big-' || \$1)\$\$);
SELECT timed('complete', $KEYS, \$\$SELECT idem_complete('big-' || \$1, 201, '{"ok": true}')\$\$);
SELECT savepoints('savepoint, $KEYS claims held', $SAVEPOINTS);
COMMIT;
EOF
note "savepoints without claims held ..."
q postgres -o /dev/null <<EOF
BEGIN;
SELECT savepoints('savepoint, no claim held', $SAVEPOINTS);
COMMIT;
EOF
note "messages: $MESSAGES consumes in one transaction ..."
q postgres -o /dev/null <<EOF
BEGIN;
SELECT timed('consume', $MESSAGES, \$\$SELECT idem_consume_message('big', \$1::text)\$\$);
COMMIT;
EOF
note "baseline: $MESSAGES plain INSERT ... ON CONFLICT DO NOTHING in one transaction ..."
q postgres -o /dev/null <<EOF
BEGIN;
SELECT timed('plain insert', $MESSAGES, \$\$INSERT INTO plain_messages (consumer, message_id) VALUES ('big', \$1::text) ON CONFLICT DO NOTHING\$\$);
COMMIT;
EOF
q postgres -At -c "SELECT count(*) FROM idempotency.keys WHERE state = 'c'" | {
    read -r n
    [ "$n" = "$KEYS" ] || die "expected $KEYS completed keys, found $n"
}

say ""
say "per-call cost (µs) in each tenth of the transaction:"
q postgres -At -F '|' -c "SELECT phase, string_agg(round((seconds / calls * 1e6)::numeric, 1)::text, ' ' ORDER BY slice)
                   FROM slices WHERE phase IN ('claim', 'complete', 'consume', 'plain insert') GROUP BY phase ORDER BY phase" |
    while IFS='|' read -r phase rest; do say "  $(printf '%-12s' "$phase") $rest"; done
say ""
for phase in claim complete consume; do
    r=$(q postgres -At -c "SELECT round((max(seconds) FILTER (WHERE slice = 9) /
                               max(seconds) FILTER (WHERE slice = 0))::numeric, 3)
                    FROM slices WHERE phase = '$phase'")
    check "$phase: last tenth / first tenth" "$r" "<=" 1.2
done
r=$(q postgres -At -c "SELECT round((max(seconds) FILTER (WHERE phase LIKE '%claims held') /
                           max(seconds) FILTER (WHERE phase LIKE '%no claim held'))::numeric, 3)
                FROM slices WHERE phase LIKE 'savepoint%'")
check "savepoint rollback with $KEYS claims held / with none" "$r" "<=" 1.2
r=$(q postgres -At -c "SELECT round((max(seconds) FILTER (WHERE slice = 9) /
                           max(seconds) FILTER (WHERE slice = 0))::numeric, 3)
                FROM slices WHERE phase = 'plain insert'")
info "plain INSERT ON CONFLICT: last tenth / first tenth" "$r" "baseline, for comparison"
say ""
say "backend memory at the end of each phase (pg_backend_memory_contexts):"
q postgres -At -F ' ' -c "SELECT phase, pg_size_pretty(bytes),
                        CASE WHEN phase IN ('claim', 'complete')
                             THEN round(bytes::numeric / $KEYS) || ' bytes per claim held' END
                   FROM memory ORDER BY phase" |
    while read -r line; do say "  $line"; done
say ""
say "command: BIGTXN_KEYS=$KEYS BIGTXN_MESSAGES=$MESSAGES BIGTXN_SAVEPOINTS=$SAVEPOINTS bash bench/bigtxn.sh"
say "elapsed: $(( $(date +%s) - T0 )) s"
exit "$(bench_status)"
