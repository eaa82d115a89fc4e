# shellcheck shell=bash
#
# test/lib/cluster.sh -- throwaway PostgreSQL clusters for scripts (tests,
# demo, benchmarks).  Source it; it defines functions only and changes no
# shell options.
#
# A cluster lives entirely in one directory DIR:
#   DIR/data             data directory (initdb'd on first start)
#   DIR/sock             unix socket directory (the only way in by default)
#   DIR/postgresql.log   server log
#   DIR/port             the port it was started on
#
# Functions:
#   cluster_start DIR PORT [CONF_LINE...]
#       initdb (if DIR/data does not exist yet) and start.  The defaults
#       written to postgresql.conf are listen_addresses = '' (unix socket
#       only, so PORT only names the socket), port, unix_socket_directories;
#       each CONF_LINE is appended after them, so a later line wins, e.g.
#       "listen_addresses = '127.0.0.1'" or "shared_preload_libraries = 'x'".
#       Fails (non-zero) and prints the server log if the server won't start.
#   cluster_stop DIR          stop it (fast, then immediate); no-op if down
#   cluster_stop_all          stop every cluster this shell started (for traps)
#   cluster_stop_any_under D  stop every server whose data directory is below D
#                             (also ones started by pg_regress or TAP tests)
#   cluster_psql DIR [ARG...] psql -X -v ON_ERROR_STOP=1 against it
#                             (database $CLUSTER_DB, default postgres; -d wins)
#   cluster_run DIR CMD...    run CMD as the cluster user with PGHOST, PGPORT,
#                             PGDATABASE set and the server's bin dir first in
#                             PATH (pg_prove, pgbench, make pgtap, ...)
#   cluster_env DIR           print "export PGHOST=... PGPORT=..." lines
#   cluster_as_user CMD...    run CMD as CLUSTER_USER when this shell is root
#                             (initdb refuses root), else run it directly; in
#                             the current directory, or in / if the user may
#                             not enter it
#
# Settings (environment):
#   PG_CONFIG      pg_config to take the bin dir from
#                  (default /usr/lib/postgresql/15/bin/pg_config)
#   CLUSTER_USER   unprivileged user that owns and runs the servers when the
#                  caller is root (default postgres); DIR is created/chowned
#                  for it, and its parent directories must be searchable by it
#   CLUSTER_DB     default database for cluster_psql / cluster_run (postgres)

_CLUSTER_STARTED=()

_cluster_bindir() {
	local pgc="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
	local dir
	if dir=$("$pgc" --bindir 2>/dev/null) && [ -n "$dir" ]; then
		printf '%s\n' "$dir"
	else
		printf '%s\n' "$(dirname "$pgc")"
	fi
}

cluster_as_user() {
	local user="${CLUSTER_USER:-postgres}"
	if [ "$(id -u)" -ne 0 ]; then
		"$@"
	elif runuser -u "$user" -- test -x "$PWD" 2>/dev/null; then
		runuser -u "$user" -- "$@"
	else
		# the caller's cwd (say /root/...) is closed to the user
		(cd / && runuser -u "$user" -- "$@")
	fi
}

# Absolute path of DIR (which must exist).
_cluster_abs() {
	(cd "$1" && pwd -P)
}

cluster_start() {
	if [ $# -lt 2 ]; then
		echo "usage: cluster_start DIR PORT [CONF_LINE...]" >&2
		return 2
	fi
	local dir="$1" port="$2" bindir line
	shift 2
	bindir=$(_cluster_bindir)

	mkdir -p "$dir" || return 1
	dir=$(_cluster_abs "$dir") || return 1
	if [ "$(id -u)" -eq 0 ]; then
		chown "${CLUSTER_USER:-postgres}:" "$dir" || return 1
	fi

	if [ ! -f "$dir/data/PG_VERSION" ]; then
		# run from DIR: the caller's cwd may not be readable by CLUSTER_USER
		(cd "$dir" && cluster_as_user mkdir -p "$dir/sock" &&
			cluster_as_user "$bindir/initdb" -D "$dir/data" -A trust \
				-E UTF8 --locale=C --no-sync --no-instructions \
				>"$dir/initdb.log" 2>&1) || {
			echo "cluster_start: initdb failed in $dir/data:" >&2
			cat "$dir/initdb.log" >&2
			return 1
		}
		{
			echo ""
			echo "# added by test/lib/cluster.sh"
			echo "listen_addresses = ''"
			echo "port = $port"
			echo "unix_socket_directories = '$dir/sock'"
			for line in "$@"; do
				printf '%s\n' "$line"
			done
		} | cluster_as_user tee -a "$dir/data/postgresql.conf" >/dev/null || return 1
	fi
	echo "$port" | cluster_as_user tee "$dir/port" >/dev/null || return 1

	_CLUSTER_STARTED+=("$dir")
	if ! (cd "$dir" && cluster_as_user "$bindir/pg_ctl" -D "$dir/data" \
		-l "$dir/postgresql.log" -w -t 120 -s start); then
		echo "cluster_start: server in $dir failed to start; log:" >&2
		tail -n 50 "$dir/postgresql.log" >&2
		return 1
	fi
}

cluster_stop() {
	local dir="$1" bindir
	bindir=$(_cluster_bindir)
	[ -d "$dir" ] || return 0
	dir=$(_cluster_abs "$dir") || return 0
	[ -f "$dir/data/postmaster.pid" ] || return 0
	(cd "$dir" && cluster_as_user "$bindir/pg_ctl" -D "$dir/data" -m fast \
		-w -t 60 -s stop) >/dev/null 2>&1 ||
		(cd "$dir" && cluster_as_user "$bindir/pg_ctl" -D "$dir/data" \
			-m immediate -w -t 60 -s stop) >/dev/null 2>&1 || true
	if [ -f "$dir/data/postmaster.pid" ] &&
		(cd "$dir" && cluster_as_user "$bindir/pg_ctl" -D "$dir/data" status) >/dev/null 2>&1; then
		echo "cluster_stop: could not stop the server in $dir" >&2
		return 1
	fi
	return 0
}

cluster_stop_all() {
	local dir rc=0
	for dir in "${_CLUSTER_STARTED[@]}"; do
		cluster_stop "$dir" || rc=1
	done
	_CLUSTER_STARTED=()
	return $rc
}

cluster_stop_any_under() {
	local top="$1" pidfile data bindir rc=0
	bindir=$(_cluster_bindir)
	[ -d "$top" ] || return 0
	while IFS= read -r -d '' pidfile; do
		data=$(dirname "$pidfile")
		if (cd "$data" && cluster_as_user "$bindir/pg_ctl" -D "$data" status) >/dev/null 2>&1; then
			echo "stopping leftover server in $data" >&2
			(cd "$data" && cluster_as_user "$bindir/pg_ctl" -D "$data" \
				-m immediate -w -t 60 -s stop) >/dev/null 2>&1 || rc=1
		fi
	done < <(find "$top" -name postmaster.pid -type f -print0 2>/dev/null)
	return $rc
}

cluster_env() {
	local dir
	dir=$(_cluster_abs "$1") || return 1
	printf 'export PGHOST=%q\n' "$dir/sock"
	printf 'export PGPORT=%q\n' "$(cat "$dir/port")"
}

cluster_run() {
	local dir port bindir
	dir=$(_cluster_abs "$1") || return 1
	shift
	port=$(cat "$dir/port") || return 1
	bindir=$(_cluster_bindir)
	cluster_as_user env PATH="$bindir:$PATH" PGHOST="$dir/sock" PGPORT="$port" \
		PGDATABASE="${CLUSTER_DB:-postgres}" "$@"
}

cluster_psql() {
	local dir="$1"
	shift
	cluster_run "$dir" psql -X -v ON_ERROR_STOP=1 "$@"
}
