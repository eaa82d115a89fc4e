#!/usr/bin/env bash
# bench/outbox.sh -- the outbox's bytes on disk under sustained publish and
# relay, beside a hand-written DELETE-based outbox (issue 34).
#
#   bash bench/outbox.sh                 # about 10 minutes; run it alone
#   BENCH_SMOKE=1 bash bench/outbox.sh   # seconds: does the script still work?
#
# Every round (ROUND seconds of clock time) publishes EVENTS events into
# each outbox in transactions of BATCH events, and relays both dry:
#
#   - ours: idem_publish() in the transaction; idem_outbox_next(relay,
#     topic, RELAY_BATCH) and idem_outbox_ack() until nothing is left;
#     idem_maintain() once per round (what the background worker does every
#     idempotency.naptime), which drops the segments relayed and kept for
#     idempotency.outbox_retention = RETENTION seconds;
#   - hand-written: INSERT into a table with a bigserial key, and a relay
#     that takes RELAY_BATCH rows with SELECT ... ORDER BY id LIMIT n FOR
#     UPDATE SKIP LOCKED and DELETEs them, with autovacuum at its defaults.
#
# Measured after each round: the bytes of each outbox (tables, TOAST and
# indexes: every segment of ours), and the time each round's publishing and
# relaying took.  The goals (issue 34): ours stays flat, its bytes in the
# last third of the run no more than 1.5 times those in the second third
# once the retention has passed (its segments come and go); publishing is
# no slower than the hand-written INSERT and relaying at least as fast as
# its SKIP LOCKED + DELETE relay: the hand-written side's time over ours
# in each round (the two sides take turns at going first), median of the
# rounds, >= 1.0.  The hand-written one's growth and the rates are info.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SMOKE        1 = the smallest run that goes through every step, for
#                      the test suite; exit status 0 whatever the figures [0]
#   OUTBOX_ROUNDS      rounds                                          [120/6]
#   OUTBOX_ROUND       seconds per round                               [5/1]
#   OUTBOX_EVENTS      events published per round into each outbox    [20000/200]
#   OUTBOX_BATCH       events per publishing transaction               [100/50]
#   OUTBOX_RELAY_BATCH events per relay batch                          [1000/100]
#   OUTBOX_RETENTION   idempotency.outbox_retention, seconds           [20/2]
#   OUTBOX_PORT        server port (unix socket only)                  [54481]
#   PGBIN              PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS      directory of the results files  [bench/results, bench/results/smoke]
#
# Uses the installed extension (it builds nothing).  Output: a summary on
# stdout, also written to outbox-<timestamp>.txt in BENCH_RESULTS with a
# line per round.  Exit status (bench/lib.sh, bench_status): 0 every goal
# PASS, 3 some goal FAIL or SKIP, 1 the run itself failed.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH_NAME=outbox.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin) || exit 1
export PG_CONFIG=$PGBIN/pg_config
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

ROUNDS=${OUTBOX_ROUNDS:-$(bench_size 120 6)}
ROUND=${OUTBOX_ROUND:-$(bench_size 5 1)}
EVENTS=${OUTBOX_EVENTS:-$(bench_size 20000 200)}
BATCH=${OUTBOX_BATCH:-$(bench_size 100 50)}
RELAY_BATCH=${OUTBOX_RELAY_BATCH:-$(bench_size 1000 100)}
RETENTION=${OUTBOX_RETENTION:-$(bench_size 20 2)}
PORT=${OUTBOX_PORT:-54481}
DB=outbox_bench

for v in ROUNDS ROUND EVENTS BATCH RELAY_BATCH RETENTION; do
    case ${!v} in ''|*[!0-9]*|0) echo "outbox.sh: OUTBOX_$v must be a positive integer" >&2; exit 1 ;; esac
done
[ "$ROUNDS" -ge 3 ] || { echo "outbox.sh: OUTBOX_ROUNDS must be at least 3" >&2; exit 1; }

RESDIR=$(bench_resdir)
mkdir -p "$RESDIR" || exit 1
TS=$(date +%Y%m%d-%H%M%S)
OUT=$RESDIR/outbox-$TS.txt
: >"$OUT" || exit 1

T0=$(date +%s)
note "starting a cluster ..."
bench_cluster "$PORT" \
    "log_min_messages = warning" \
    "idempotency.outbox_retention = '${RETENTION}s'"
qval postgres "CREATE DATABASE $DB" >/dev/null || die "CREATE DATABASE failed"
q "$DB" -c "CREATE EXTENSION idempotency" >/dev/null || die "CREATE EXTENSION failed"
# the events table exists from the first event on
q "$DB" -c "SELECT idem_publish('orders')" >/dev/null || die "first publish failed"
q "$DB" >/dev/null <<'SQL' || die "set-up failed"
CREATE TABLE handmade_outbox (
    id           bigserial PRIMARY KEY,
    topic        text NOT NULL,
    key          text,
    payload      jsonb,
    published_at timestamptz NOT NULL DEFAULT now()
);
-- what a round does, one function per side, each batch its own transaction
CREATE PROCEDURE publish_ours(n int, batch int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. n / batch LOOP
    PERFORM idem_publish('orders', jsonb_build_object('order', i, 'total', 99.5), 'k' || (i % 64))
       FROM generate_series(1, batch);
    COMMIT;
  END LOOP;
END $$;
CREATE PROCEDURE publish_handmade(n int, batch int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. n / batch LOOP
    INSERT INTO handmade_outbox (topic, key, payload)
    SELECT 'orders', 'k' || (i % 64), jsonb_build_object('order', i, 'total', 99.5)
      FROM generate_series(1, batch);
    COMMIT;
  END LOOP;
END $$;
CREATE PROCEDURE relay_ours(batch int, INOUT relayed bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE b bigint; k int;
BEGIN
  relayed := 0;
  LOOP
    SELECT max(n.batch), count(*) INTO b, k FROM idem_outbox_next('bench', 'orders', batch) AS n;
    EXIT WHEN k = 0;
    PERFORM idem_outbox_ack('bench', 'orders', b);
    relayed := relayed + k;
    COMMIT;
  END LOOP;
END $$;
CREATE PROCEDURE relay_handmade(batch int, INOUT relayed bigint DEFAULT 0) LANGUAGE plpgsql AS $$
DECLARE k int;
BEGIN
  relayed := 0;
  LOOP
    WITH b AS (SELECT id FROM handmade_outbox ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED)
    DELETE FROM handmade_outbox h USING b WHERE h.id = b.id;
    GET DIAGNOSTICS k = ROW_COUNT;
    EXIT WHEN k = 0;
    relayed := relayed + k;
    COMMIT;
  END LOOP;
END $$;
CREATE FUNCTION ours_bytes() RETURNS bigint LANGUAGE sql AS $$
  SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint
    FROM pg_inherits AS i WHERE i.inhparent = 'idempotency.outbox'::regclass
$$;
SQL

PGVER=$(qval postgres "SHOW server_version")
EXTVER=$(qval "$DB" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
GITREV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')
say "== idempotency bench outbox.sh: PostgreSQL $PGVER, extension $EXTVER ($GITREV)"
say "rounds=$ROUNDS round=${ROUND}s events/round=$EVENTS batch=$BATCH relay_batch=$RELAY_BATCH retention=${RETENTION}s smoke=${BENCH_SMOKE:-0}"

# ms of one psql call
timed() {
    local t0 t1
    t0=$(now)
    q "$DB" -c "$1" >/dev/null || return 1
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", (b - a) * 1000}'
}

declare -a OURS HAND PUB REL
pub_ours_ms=0 pub_hand_ms=0 rel_ours_ms=0 rel_hand_ms=0
next_round=$(now)
for r in $(seq 1 "$ROUNDS"); do
    next_round=$(plus "$next_round" "$ROUND")
    # the two sides take turns at going first, so neither always runs on
    # the other's warm caches or behind its checkpoint
    if [ $((r % 2)) = 1 ]; then
        a=$(timed "CALL publish_ours($EVENTS, $BATCH)") || die "round $r: publishing (ours) failed"
        b=$(timed "CALL publish_handmade($EVENTS, $BATCH)") || die "round $r: publishing (hand-written) failed"
        c=$(timed "CALL relay_ours($RELAY_BATCH)") || die "round $r: relaying (ours) failed"
        d=$(timed "CALL relay_handmade($RELAY_BATCH)") || die "round $r: relaying (hand-written) failed"
    else
        b=$(timed "CALL publish_handmade($EVENTS, $BATCH)") || die "round $r: publishing (hand-written) failed"
        a=$(timed "CALL publish_ours($EVENTS, $BATCH)") || die "round $r: publishing (ours) failed"
        d=$(timed "CALL relay_handmade($RELAY_BATCH)") || die "round $r: relaying (hand-written) failed"
        c=$(timed "CALL relay_ours($RELAY_BATCH)") || die "round $r: relaying (ours) failed"
    fi
    PUB[r]=$(div "$b" "$a")
    REL[r]=$(div "$d" "$c")
    q "$DB" -c "SELECT idem_maintain()" >/dev/null || die "round $r: idem_maintain() failed"
    lag=$(qval "$DB" "SELECT lag_events FROM idem_outbox_relays() WHERE relay = 'bench'")
    left=$(qval "$DB" "SELECT count(*) FROM handmade_outbox")
    OURS[r]=$(qval "$DB" "SELECT ours_bytes()")
    HAND[r]=$(qval "$DB" "SELECT pg_total_relation_size('handmade_outbox')")
    segs=$(qval "$DB" "SELECT count(*) FROM idempotency.outbox_segments")
    raw "raw round=$r ours_bytes=${OURS[r]} handmade_bytes=${HAND[r]} segments=$segs ours_lag=$lag handmade_left=$left publish_ms=$a/$b relay_ms=$c/$d publish_ratio=${PUB[r]} relay_ratio=${REL[r]}"
    pub_ours_ms=$(plus "$pub_ours_ms" "$a"); pub_hand_ms=$(plus "$pub_hand_ms" "$b")
    rel_ours_ms=$(plus "$rel_ours_ms" "$c"); rel_hand_ms=$(plus "$rel_hand_ms" "$d")
    [ "$lag" = 0 ] || die "round $r: the relay left $lag events behind"
    [ "$left" = 0 ] || die "round $r: the hand-written relay left $left rows behind"
    sleep_until "$next_round"
done

# thirds of the run: the first third after the retention's first drops
third=$((ROUNDS / 3))
early=$(median "${OURS[@]:$((third)):$((third))}")
late=$(median "${OURS[@]:$((ROUNDS - third)):$((third))}")
hearly=$(median "${HAND[@]:$((third)):$((third))}")
hlate=$(median "${HAND[@]:$((ROUNDS - third)):$((third))}")
total=$((ROUNDS * EVENTS))
say ""
info "ours: bytes, median of the second third of the rounds" "$early"
info "ours: bytes, median of the last third" "$late"
check "ours: last third / second third (flat)" "$(div "$late" "$early")" "<=" 1.5
info "hand-written DELETE outbox: bytes, second third" "$hearly"
info "hand-written DELETE outbox: bytes, last third" "$hlate"
info "hand-written: last third / second third" "$(div "$hlate" "$hearly")"
# publish cost and relay throughput, side by side in each round: the
# hand-written side's time over ours (above 1: ours is faster), median of
# the rounds
check "publish: hand-written INSERT time / ours, median of rounds (no slower)" "$(median "${PUB[@]}")" ">=" 1.0
check "relay, batches of $RELAY_BATCH: SKIP LOCKED + DELETE time / ours (at least as fast)" "$(median "${REL[@]}")" ">=" 1.0
info "publish, events/s: ours" "$(div "$total" "$(awk -v m="$pub_ours_ms" 'BEGIN{print m / 1000}')")"
info "publish, events/s: hand-written INSERT" "$(div "$total" "$(awk -v m="$pub_hand_ms" 'BEGIN{print m / 1000}')")"
info "relay, events/s: ours (next + ack)" "$(div "$total" "$(awk -v m="$rel_ours_ms" 'BEGIN{print m / 1000}')")"
info "relay, events/s: hand-written (SKIP LOCKED + DELETE)" "$(div "$total" "$(awk -v m="$rel_hand_ms" 'BEGIN{print m / 1000}')")"
say "elapsed: $(( $(date +%s) - T0 )) s"
exit "$(bench_status)"
