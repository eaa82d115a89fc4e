#!/bin/bash
# examples/citus/distributed-ledger/callgrind.sh -- instructions per request
# of create_payment() on a worker, with idempotency.citus_ledgers off (the
# worker's own ledger, as before 0.5.0) and on (the tenant's ledger shard).
#
# Run after run.sh, as the same user, on the worker it leaves stopped:
#   PG_CONFIG=... WORK=/tmp/dl bash callgrind.sh
# Each setting runs 200 and then 400 calls with new keys for the tenants
# whose shards are on w1, in single-user mode under callgrind; the
# difference of the two totals divided by 200 is the cost of one request
# (claim, the payment's INSERT, complete).  Counts do not depend on the
# machine's load.
set -eu
PG_CONFIG=${PG_CONFIG:?set PG_CONFIG}
BIN=$("$PG_CONFIG" --bindir)
WORK=${WORK:-/tmp/idem-citus-dl}
OUT=${OUT:-$WORK/callgrind}
DATA=$WORK/w1
mkdir -p "$OUT"
run=$(date +%s)

single() { "$BIN/postgres" --single -D "$DATA" "$@" postgres; }

# the example's tenants whose payments shard is on w1
tenants=$(echo "SELECT string_agg(t, ',') FROM (SELECT 'acme' UNION ALL SELECT format('t%s', lpad(i::text, 2, '0')) FROM generate_series(0, 23) i) s(t) WHERE EXISTS (SELECT FROM pg_dist_placement p JOIN pg_dist_local_group l USING (groupid) WHERE p.shardid = get_shard_id_for_distribution_column('payments', t))" |
	single 2>/dev/null | sed -n 's/.*string_agg = "\([^"]*\)".*/\1/p')
[ -n "$tenants" ] || { echo "no tenant on w1 found in $DATA" >&2; exit 1; }
IFS=, read -r -a ts <<<"$tenants"

declare -A total
for cfg in off on; do
	for n in 200 400; do
		sql=$OUT/$cfg-$n.sql
		for ((i = 0; i < n; i++)); do
			echo "SELECT * FROM create_payment('${ts[i % ${#ts[@]}]}', 'cg-$run-$cfg-$n-$i', 5);"
		done >"$sql"
		valgrind --tool=callgrind --callgrind-out-file="$OUT/$cfg-$n.out" \
			"$BIN/postgres" --single -D "$DATA" -c idempotency.citus_ledgers=$cfg postgres \
			<"$sql" >"$OUT/$cfg-$n.log" 2>&1
		created=$(grep -c 'status = "created"' "$OUT/$cfg-$n.log" || true)
		[ "$created" = "$n" ] || { echo "$cfg $n: $created of $n created (see $OUT/$cfg-$n.log)" >&2; exit 1; }
		total[$cfg-$n]=$(sed -n 's/^summary: //p' "$OUT/$cfg-$n.out")
	done
	echo "$cfg: $(((total[$cfg-400] - total[$cfg-200]) / 200)) instructions per request"
done
echo "ratio on/off: $(awk -v a=$((total[on-400] - total[on-200])) -v b=$((total[off-400] - total[off-200])) 'BEGIN { printf "%.3f", a / b }')"
