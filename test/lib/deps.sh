# shellcheck shell=bash
#
# test/lib/deps.sh -- system dependencies and the unprivileged test user,
# shared by test/run-all.sh and examples/demo.sh.  Source it; it defines
# functions and variables only.
#
#   deps_ensure      install the missing Debian packages of IDEM_DEB_PACKAGES
#                    with apt (as root; "apt-get update" runs once, and only
#                    when something is missing).  As non-root it only checks
#                    and fails with the apt-get command to run.
#   deps_test_user   print the unprivileged user to build and test as: when
#                    root, $IDEM_TEST_USER or "postgres" (created as a system
#                    user if absent); when not root, the current user.

# Everything "make", "make installcheck" (pg_regress, pg_isolation_regress,
# prove with PostgreSQL::Test::Cluster), "make pgtap" (pg_prove) and the
# examples' tests (python3-psycopg, curl, pgbouncer, plproxy) need.
# The Perl modules PostgreSQL::Test::* use beyond IPC::Run and Test::More are
# core modules from the perl package.
IDEM_DEB_PACKAGES=(
	postgresql-15
	postgresql-client-15
	postgresql-server-dev-15
	postgresql-15-pgtap
	libtap-parser-sourcehandler-pgtap-perl
	postgresql-15-cron
	postgresql-15-plproxy
	pgbouncer
	libipc-run-perl
	libtest-simple-perl
	python3
	python3-psycopg
	curl
	perl
	make
	gcc
)

_deps_missing() {
	local pkg
	for pkg in "${IDEM_DEB_PACKAGES[@]}"; do
		if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
			printf '%s\n' "$pkg"
		fi
	done
}

deps_ensure() {
	local missing=()
	if ! command -v dpkg-query >/dev/null 2>&1; then
		echo "deps: not a Debian system; assuming the dependencies are installed" >&2
		return 0
	fi
	mapfile -t missing < <(_deps_missing)
	if [ ${#missing[@]} -eq 0 ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing packages: ${missing[*]}" >&2
		echo "deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
		return 1
	fi
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q || return 1
	apt-get install -q -y --no-install-recommends -o Dpkg::Use-Pty=0 \
		"${missing[@]}" || return 1
}

deps_test_user() {
	local user
	if [ "$(id -u)" -ne 0 ]; then
		id -un
		return 0
	fi
	user="${IDEM_TEST_USER:-postgres}"
	if ! id -u "$user" >/dev/null 2>&1; then
		echo "deps: creating unprivileged user $user" >&2
		useradd --system --user-group --create-home --shell /bin/bash "$user" >&2 || return 1
	fi
	if [ "$(id -u "$user")" -eq 0 ]; then
		echo "deps: test user $user must not be root" >&2
		return 1
	fi
	printf '%s\n' "$user"
}
