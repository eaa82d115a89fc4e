# shellcheck shell=bash
#
# test/lib/examples.sh -- what the scale-out examples' tests share
# (examples/plproxy/test.sh, examples/citus/test.sh).  Source it after
# test/lib/cluster.sh, and after defining say() and fail(); it defines
# functions only.
#
#   examples_python          set PYTHON to a python3 that has psycopg 3
#                            (Debian's first: another python3 on PATH, from
#                            pyenv or a venv, may lack it), or fail
#   examples_workdir NAME SERVER...
#                            make the scratch directory WORK, in which each
#                            SERVER is a cluster directory, and install the
#                            traps that stop every server on exit, pass or
#                            fail, show their logs' tails on failure, and
#                            remove WORK unless it failed or KEEP_WORKDIR=1
#   examples_amcheck DIR DB  amcheck over every ledger index of database DB
#                            of the cluster in DIR (test/lib/amcheck_ledger.sql:
#                            bt_index_check with heapallindexed, each
#                            partition locked first, so maintenance may go
#                            on); prints "N ledger indexes checked, M
#                            dropped meanwhile", fails (with psql's output)
#                            on an error or when no index was checked.
#                            The load tests run it at their end.

examples_python() {
	local py
	PYTHON=${PYTHON:-}
	if [ -z "$PYTHON" ]; then
		for py in /usr/bin/python3 python3; do
			if "$py" -c 'import psycopg' 2>/dev/null; then
				PYTHON=$py
				break
			fi
		done
	fi
	[ -n "$PYTHON" ] ||
		fail "psycopg 3 is not installed (apt-get install python3-psycopg)"
}

_EXAMPLES_SERVERS=()
_EXAMPLES_AMCHECK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/amcheck_ledger.sql"

examples_amcheck() {
	local dir="$1" db="$2" out summary
	out=$(CLUSTER_DB=$db cluster_psql "$dir" -q -f "$_EXAMPLES_AMCHECK" 2>&1) || {
		printf '%s\n' "$out"
		return 1
	}
	summary=$(sed -n 's/.*NOTICE: *amcheck: \(.*\)/\1/p' <<<"$out")
	case $summary in
	[1-9]*) printf '%s\n' "$summary" ;;
	*)
		printf 'no ledger index was checked: %s\n' "$out"
		return 1
		;;
	esac
}

_examples_cleanup() {
	local rc=$? s
	trap - EXIT INT TERM
	for s in "${_EXAMPLES_SERVERS[@]}"; do
		cluster_stop "$WORK/$s" || rc=1
	done
	cluster_stop_any_under "$WORK" || rc=1
	if [ "$rc" -ne 0 ]; then
		for s in "${_EXAMPLES_SERVERS[@]}"; do
			if [ -f "$WORK/$s/postgresql.log" ]; then
				echo "---- $s/postgresql.log (last 30 lines)"
				tail -n 30 "$WORK/$s/postgresql.log"
			fi
		done
	fi
	if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
		rm -rf "$WORK"
	else
		say "scratch directory kept: $WORK"
	fi
	exit "$rc"
}

examples_workdir() {
	local name="$1"
	shift
	_EXAMPLES_SERVERS=("$@")
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-$name.XXXXXX") || exit 1
	chmod 755 "$WORK"
	trap _examples_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}
