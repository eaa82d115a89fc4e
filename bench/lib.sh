# shellcheck shell=bash
#
# bench/lib.sh -- output and timing helpers shared by bench/drop.sh and
# bench/soak.sh.  Source it after setting BENCH_NAME (the script's name, for
# messages) and OUT (the results file); it defines functions only.
#
#   say TEXT       print and append to $OUT
#   raw TEXT       append to $OUT only
#   note TEXT      print to stderr
#   die TEXT       note, record the failure in $OUT, exit 1
#   now            the clock, seconds since the epoch with nanoseconds
#   plus A B       A + B, 6 decimals
#   sleep_until T  wait until clock time T (measurement windows and samples
#                  are defined by time; there is no condition to poll for)

say()  { printf '%s\n' "$*" | tee -a "$OUT"; }
raw()  { printf '%s\n' "$*" >>"$OUT"; }
note() { printf '%s\n' "$*" >&2; }
die()  { note "$BENCH_NAME: $*"; raw "run failed: $*"; exit 1; }
now()  { date +%s.%N; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a + b}'; }
sleep_until() {
    local d
    d=$(awk -v t="$1" -v n="$(now)" 'BEGIN{ d = t - n; printf "%.3f", (d > 0 ? d : 0) }')
    sleep "$d"
}
