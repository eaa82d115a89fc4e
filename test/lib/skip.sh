# shellcheck shell=bash
#
# test/lib/skip.sh -- how a test of the examples or packaging suites says it
# was skipped (test/run-suites.sh runs them: exit 77 counts as skipped, and
# the reason goes into the summary).  Source it; it defines functions only.
#
#   skip_test REASON...         the test does not apply here (say, to
#                               this major): print "SKIPPED: REASON",
#                               exit 77
#   skip_unavailable REASON...  the test cannot run because something it
#                               needs cannot be had on this machine (say, the
#                               sources of Citus without network or a local
#                               copy): the same, unless IDEM_NO_SKIP=1, which
#                               makes it a failure (exit 1), so that CI
#                               cannot pass without running the test
#
# Settings (environment):
#   IDEM_SKIP_FILE   where run-suites.sh wants the reason (one line)
#   IDEM_NO_SKIP=1   skip_unavailable fails instead of skipping

skip_test() {
	printf 'SKIPPED: %s\n' "$*"
	if [ -n "${IDEM_SKIP_FILE:-}" ]; then
		printf '%s\n' "$*" >"$IDEM_SKIP_FILE" 2>/dev/null || true
	fi
	exit 77
}

skip_unavailable() {
	if [ "${IDEM_NO_SKIP:-0}" = 1 ]; then
		printf 'FAILED (IDEM_NO_SKIP=1, so not skipped): %s\n' "$*"
		exit 1
	fi
	skip_test "$@"
}
