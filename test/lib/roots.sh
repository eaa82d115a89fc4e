# shellcheck shell=bash
#
# test/lib/roots.sh -- Debian root file systems for the PostgreSQL majors
# this machine's own Debian does not carry.  Source it; it defines
# functions only.
#
# A root is a minimal Debian of the suite that packages the major
# (root_suite), made with mmdebstrap and kept under /var/cache so that the
# next run reuses it.  Its packages are installed from the Debian archive as
# users install them; the host's apt is never touched.  Tests run inside it
# with chroot, as its unprivileged "postgres" user, with /proc and /dev
# mounted while they run and unmounted after, pass or fail.
#
#   root_suite MAJOR       the Debian suite for MAJOR (17: trixie, 18: sid)
#   root_dir MAJOR         where its root lives ($IDEM_ROOTS_DIR/pgMAJOR)
#   root_ensure MAJOR      make the root if it is missing (as root)
#   root_mount DIR         mount /proc and /dev into the root DIR
#   root_umount DIR        unmount everything below DIR; fails if it cannot
#   root_umount_all        unmount every root this shell mounted (for traps)
#   root_remove DIR        unmount, then delete DIR (one file system only)
#   root_run DIR CMD...    run CMD inside DIR (chroot), with a clean
#                          environment plus the IDEM_*, PG_*, BENCH_* and SUITES
#                          variables of the caller
#
# Settings (environment):
#   IDEM_ROOTS_DIR         default /var/cache/idempotency/roots
#   IDEM_DEBIAN_MIRROR     default http://deb.debian.org/debian
#   IDEM_ROOTS_REFRESH=1   make the roots again even if they exist

IDEM_ROOTS_DIR=${IDEM_ROOTS_DIR:-/var/cache/idempotency/roots}
IDEM_DEBIAN_MIRROR=${IDEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
_ROOTS_MOUNTED=()

root_suite() {
	case "$1" in
	17) echo trixie ;;
	18) echo sid ;;
	*)
		echo "roots: no Debian suite known for PostgreSQL $1" >&2
		return 1
		;;
	esac
}

root_dir() {
	printf '%s/pg%s\n' "$IDEM_ROOTS_DIR" "$1"
}

# Mount points below DIR (deepest first), one per line.
_root_mounts_below() {
	local dir="$1"
	findmnt -rn -o TARGET 2>/dev/null |
		awk -v d="$dir/" 'index($0, d) == 1' | sort -r
}

root_mount() {
	local dir="$1"
	_ROOTS_MOUNTED+=("$dir")
	if ! mountpoint -q "$dir/proc"; then
		mount -t proc proc "$dir/proc" || return 1
	fi
	if ! mountpoint -q "$dir/dev"; then
		# rslave: nothing mounted or unmounted inside goes back to the host
		mount --rbind /dev "$dir/dev" || return 1
		mount --make-rslave "$dir/dev" || return 1
	fi
	# The root reaches the network through this machine, so it trusts what
	# this machine trusts: a TLS proxy's certificate authority added here
	# (update-ca-certificates) is not in the root's own bundle, and npm in
	# the root (the Node.js tests) would refuse the registry.  Node.js reads
	# extra authorities from NODE_EXTRA_CA_CERTS, which root_run sets.
	if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
		cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/idempotency-host-ca.crt" &&
			chmod 644 "$dir/etc/idempotency-host-ca.crt" || return 1
	fi
}

root_umount() {
	local dir="$1" m proc left
	[ -d "$dir" ] || return 0
	# processes still running in the root (a server a test left behind)
	for proc in /proc/[0-9]*; do
		if [ "$(readlink "$proc/root" 2>/dev/null)" = "$dir" ]; then
			kill -KILL "${proc#/proc/}" 2>/dev/null
		fi
	done
	while IFS= read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done < <(_root_mounts_below "$dir")
	left=$(_root_mounts_below "$dir")
	if [ -n "$left" ]; then
		echo "roots: could not unmount below $dir: $left" >&2
		return 1
	fi
}

root_umount_all() {
	local dir rc=0
	for dir in "${_ROOTS_MOUNTED[@]}"; do
		root_umount "$dir" || rc=1
	done
	_ROOTS_MOUNTED=()
	return $rc
}

# Never "rm -rf" a root with mounts in it: a bind of /dev would take the
# host's devices with it.  --one-file-system is the second guard.
root_remove() {
	local dir="$1"
	[ -e "$dir" ] || return 0
	root_umount "$dir" || return 1
	rm -rf --one-file-system "$dir"
}

# The packages a root for MAJOR starts with: those the tests need
# (deps_packages) and, for the newest major, the previous one's server and
# headers, for the pg_upgrade test.
_root_packages() {
	local major="$1"
	deps_packages "$major"
	if [ "$major" = 18 ]; then
		printf '%s\n' postgresql-17 postgresql-server-dev-17
	fi
}

root_ensure() {
	local major="$1" suite dir tmp aptopts=() mirrors=() include
	suite=$(root_suite "$major") || return 1
	dir=$(root_dir "$major")
	if [ -f "$dir/etc/idempotency-root" ] && [ "${IDEM_ROOTS_REFRESH:-0}" != 1 ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "roots: making the PostgreSQL $major root needs root (or run PG_VERSIONS=15)" >&2
		return 1
	fi
	command -v mmdebstrap >/dev/null 2>&1 || {
		echo "roots: mmdebstrap is missing" >&2
		return 1
	}
	mkdir -p "$IDEM_ROOTS_DIR" || return 1
	tmp="$dir.new"
	root_remove "$tmp" || return 1

	mirrors=("deb $IDEM_DEBIAN_MIRROR $suite main")
	if [ "$suite" = sid ]; then
		# the mirror's sid Release is past its Valid-Until date; trixie
		# brings PostgreSQL 17 for the pg_upgrade test
		aptopts=(--aptopt='Acquire::Check-Valid-Until "false"')
		mirrors+=("deb $IDEM_DEBIAN_MIRROR trixie main")
	fi
	include=$(_root_packages "$major" | paste -sd, -)
	echo "roots: making the PostgreSQL $major root ($suite) in $dir" >&2
	if ! mmdebstrap --variant=apt --quiet "${aptopts[@]}" \
		--include="$include" "$suite" "$tmp" "${mirrors[@]}" >&2; then
		echo "roots: mmdebstrap failed for $suite" >&2
		root_remove "$tmp"
		return 1
	fi
	printf 'suite=%s\nmajor=%s\nmade=%s\n' "$suite" "$major" "$(date -u +%FT%TZ)" \
		>"$tmp/etc/idempotency-root" || return 1
	root_remove "$dir" || return 1
	mv "$tmp" "$dir"
}

root_run() {
	local dir="$1" envs=() v
	shift
	while IFS= read -r v; do
		envs+=("$v=${!v}")
	done < <(compgen -e | grep -E '^(IDEM_|PG_|BENCH_|STREAMS_|OUTBOX_|SUITES$|SUITE_TIMEOUT$|KEEP_WORKDIR$|CI$)')
	[ -r "$dir/etc/idempotency-host-ca.crt" ] &&
		envs+=(NODE_EXTRA_CA_CERTS=/etc/idempotency-host-ca.crt)
	chroot "$dir" /usr/bin/env -i \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LANG=C.UTF-8 TERM=dumb TMPDIR=/tmp \
		"${envs[@]}" "$@"
}
