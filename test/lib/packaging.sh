# shellcheck shell=bash
#
# test/lib/packaging.sh -- shared by the packaging tests (test/packaging/*.sh,
# run as root by test/run-suites.sh with SRC, PG_CONFIG and CLUSTER_USER
# set).  Source it after test/lib/cluster.sh; it defines functions and
# variables only.
#
#   PKG_MAJOR, PKG_VERSION   PG_CONFIG's major; the control file's
#                            default_version
#   pkg_say TEXT...          a progress line
#   pkg_fail TEXT...         report a failed check (the test fails at the end)
#   pkg_check DESC CMD...    run CMD; report DESC as ok or failed
#   pkg_same_lists DESC A B  compare two sorted file lists (files A and B),
#                            printing the difference; fails if they differ
#   pkg_self_test_lists      check that pkg_same_lists can fail
#   pkg_restore_install      "make install" from SRC again (the state the
#                            suites before and after this one expect)
#   pkg_port N               a private port: IDEM_PACKAGING_PORT_BASE (default
#                            54470) + N
#   pkg_result               print the verdict; return 1 if a check failed
#
# Every test ends with the extension installed as "make install" left it:
# packages and pgxn install the same files into the same places, so each
# test puts SRC's build back when it is done, pass or fail.

PKG_FAILED=0
# shellcheck disable=SC2034 # used by the tests that source this file
PKG_MAJOR=$("$PG_CONFIG" --version | sed -n 's/^PostgreSQL \([0-9][0-9]*\).*/\1/p')
# shellcheck disable=SC2034
PKG_VERSION=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" \
	"$SRC/idempotency.control")

pkg_say() {
	printf -- '-- %s\n' "$*"
}

pkg_fail() {
	printf 'not ok: %s\n' "$*"
	PKG_FAILED=1
}

pkg_check() {
	local desc="$1"
	shift
	if "$@"; then
		printf 'ok: %s\n' "$desc"
	else
		pkg_fail "$desc"
		return 1
	fi
}

pkg_same_lists() {
	local desc="$1" a="$2" b="$3" diff
	diff=$(diff "$a" "$b")
	if [ -z "$diff" ] && [ -s "$a" ]; then
		printf 'ok: %s (%s files)\n' "$desc" "$(wc -l <"$a")"
		return 0
	fi
	pkg_fail "$desc"
	if [ ! -s "$a" ]; then
		echo "   (the first list is empty)"
	fi
	printf '%s\n' "$diff" | sed 's/^/   /'
	return 1
}

# The comparison must notice a missing file: drop one line from a copy of a
# list and expect pkg_same_lists to refuse it (quietly).
pkg_self_test_lists() {
	local list="$1" tmp rc
	tmp=$(mktemp) || return 1
	sed 1d "$list" >"$tmp"
	rc=0
	if (PKG_FAILED=0 && pkg_same_lists "self-test" "$list" "$tmp" >/dev/null); then
		rc=1
	fi
	rm -f "$tmp"
	pkg_check "the file-list comparison fails when a file is missing" test "$rc" -eq 0
}

pkg_restore_install() {
	pkg_say "restoring the make install state from $SRC"
	if (cd "$SRC" && make -s install PG_CONFIG="$PG_CONFIG") >/dev/null &&
		[ -f "$("$PG_CONFIG" --pkglibdir)/idempotency.so" ] &&
		[ -f "$("$PG_CONFIG" --sharedir)/extension/idempotency.control" ]; then
		return 0
	fi
	echo "packaging: could not restore the make install state" >&2
	return 1
}

pkg_port() {
	echo $((${IDEM_PACKAGING_PORT_BASE:-54470} + $1))
}

pkg_result() {
	if [ "$PKG_FAILED" -ne 0 ]; then
		echo "FAILED"
		return 1
	fi
	echo "all checks passed"
}
