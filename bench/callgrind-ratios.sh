#!/usr/bin/env bash
#
# bench/callgrind-ratios.sh -- the extension's instructions per call over
# those of the plain SQL that does the same job, both counted in the same
# run, on the same server and CPU (bench/callgrind.sh, pinned clock and
# locale).
#
#   bash bench/callgrind-ratios.sh                  # a table of ratios
#   OUT=bench/results/callgrind-ratios-pg15.txt bash bench/callgrind-ratios.sh
#   BENCH_SMOKE=1 bash bench/callgrind-ratios.sh    # 100 calls: does it run?
#
# Pairs (extension / baseline), each workload of bench/callgrind.sh:
#
#   not preloaded, the simple protocol
#     consume/consume_raw, claim_complete/claim_raw, replay/replay_raw,
#     batch/batch_raw, advance/advance_raw, replay_ended/replay_raw (a
#     replay while a partition has ended and is not dropped yet)
#   preloaded (the digest filters), prepared as pgbench -M prepared runs them
#     consume_prep/consume_raw_prep, claim_complete_prep/claim_raw_prep,
#     replay_prep/replay_pl_prep, batch/batch_raw,
#     advance_prep/advance_raw_prep
#
# A ratio is what test/t/090_instructions.pl guards: an absolute count moves
# with the CPU (glibc and OpenSSL choose their code by what the CPU has),
# the server's build and the environment; the extension's count over the
# baseline's, taken side by side, moves with what the extension does.
#
# Output (OUT, default callgrind-ratios-latest.txt in the results
# directory): a header, then one line per pair
#
#   PRELOAD  EXTENSION/BASELINE  RATIO  EXTENSION_COUNT  BASELINE_COUNT
#
# Environment: PGBIN or PG_CONFIG, CALLS (default 1000; 100 with
# BENCH_SMOKE=1), OUT, and bench/callgrind.sh's CALLGRIND_CLOCK.  Needs
# valgrind and a C compiler; runs the server as the current user, or as
# "postgres" when run as root.

set -euo pipefail

BENCH_NAME=callgrind-ratios.sh
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"
PG_CONFIG=$(bench_pgbin)/pg_config
export PG_CONFIG
CALLS=${CALLS:-$(bench_size 1000 100)}
OUT=${OUT:-$(bench_resdir)/callgrind-ratios-latest.txt}
mkdir -p "$(dirname "$OUT")"

PAIRS_PLAIN="consume/consume_raw claim_complete/claim_raw replay/replay_raw batch/batch_raw advance/advance_raw replay_ended/replay_raw"
PAIRS_PRELOAD="consume_prep/consume_raw_prep claim_complete_prep/claim_raw_prep replay_prep/replay_pl_prep batch/batch_raw advance_prep/advance_raw_prep"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/idem-ratios.XXXXXX")
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT

: >"$OUT"
say "# instructions per call, extension / baseline, counted side by side (bench/callgrind-ratios.sh)"
say "# $("$PG_CONFIG" --version), $CALLS calls per run"
say "# preload  pair  ratio  extension  baseline"
for preload in 0 1; do
	if [ "$preload" = 1 ]; then pairs=$PAIRS_PRELOAD; else pairs=$PAIRS_PLAIN; fi
	workloads=$(tr ' /' '\n\n' <<<"$pairs" | awk '!seen[$0]++' | paste -sd' ' -)
	CALLGRIND_PRELOAD=$preload CALLS=$CALLS WORKLOADS="$workloads" OUT="$TMP/counts-$preload.txt" \
		bash "$REPO/bench/callgrind.sh" >"$TMP/log-$preload.txt" 2>&1 ||
		{ tail -n 30 "$TMP/log-$preload.txt" >&2; die "bench/callgrind.sh failed (preload $preload)"; }
	grep '^# clock' "$TMP/counts-$preload.txt" | sed "s/^# /# preload $preload: /" | tee -a "$OUT"
	for pair in $pairs; do
		ext=${pair%/*}
		base=${pair#*/}
		e=$(awk -v w="$ext" '$1 == w { print $2 }' "$TMP/counts-$preload.txt")
		b=$(awk -v w="$base" '$1 == w { print $2 }' "$TMP/counts-$preload.txt")
		[ -n "$e" ] && [ -n "$b" ] && [ "$b" -gt 0 ] || die "no count for $pair (preload $preload)"
		say "$(awk -v p="$preload" -v pair="$pair" -v e="$e" -v b="$b" \
			'BEGIN { printf "%s  %-36s %.3f  %d  %d", p, pair, e / b, e, b }')"
	done
done
