# shellcheck shell=bash
#
# test/lib/citus.sh -- Citus for the examples/citus test, built from the
# released sources in the vendor directory (Debian does not package Citus).
# Source it; it defines functions only.  Nothing of Citus is copied into
# this project: the sources stay in the vendor directory, the build in a
# cache outside the tree.
#
#   citus_version        the Citus release for $PG_CONFIG's major: 13.2.2
#                        (PostgreSQL 15-17) for 15, 14.0.1 (16-18) for 16+
#   citus_ensure         (as root) build that release for $PG_CONFIG's server
#                        once, keep the build under $IDEM_CITUS_CACHE, and
#                        install it into the server's directories unless it
#                        is installed already
#   citus_installed      true if citus is installed for $PG_CONFIG
#
# Settings (environment):
#   IDEM_VENDOR_DIR      the released sources: citus-X.Y.Z.tar.gz and
#                        patches (default: ../shared/vendor beside the tree)
#   IDEM_CITUS_CACHE     default /var/cache/idempotency/citus
#   PG_CONFIG            the server to build for

IDEM_CITUS_CACHE=${IDEM_CITUS_CACHE:-/var/cache/idempotency/citus}

_citus_major() {
	"$PG_CONFIG" --version | sed -n 's/^PostgreSQL \([0-9][0-9]*\).*/\1/p'
}

citus_version() {
	if [ "$(_citus_major)" -le 15 ]; then
		echo 13.2.2
	else
		echo 14.0.1
	fi
}

citus_installed() {
	[ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ] &&
		[ -f "$("$PG_CONFIG" --sharedir)/extension/citus.control" ]
}

# The build of this Citus release for this exact server (its version string
# names the minor release and the Debian revision).
_citus_build_dir() {
	local pgver
	pgver=$("$PG_CONFIG" --version | tr -c 'A-Za-z0-9.\n' '_')
	printf '%s/citus-%s-%s-%s\n' "$IDEM_CITUS_CACHE" "$(citus_version)" \
		"$pgver" "$(uname -m)"
}

citus_ensure() {
	local ver vendor build stage tarball src rc
	ver=$(citus_version)
	vendor=${IDEM_VENDOR_DIR:-}
	build=$(_citus_build_dir)
	stage="$build/stage"

	if [ ! -f "$build/done" ]; then
		tarball="$vendor/citus-$ver.tar.gz"
		if [ -z "$vendor" ] || [ ! -f "$tarball" ]; then
			echo "citus: the released sources citus-$ver.tar.gz are not in '${vendor:-(IDEM_VENDOR_DIR unset)}'" >&2
			return 1
		fi
		if [ "$(id -u)" -ne 0 ]; then
			echo "citus: building and installing Citus needs root" >&2
			return 1
		fi
		echo "citus: building Citus $ver for $("$PG_CONFIG" --version) in $build" >&2
		rm -rf "$build"
		mkdir -p "$build" || return 1
		tar -C "$build" -xzf "$tarball" || return 1
		src="$build/citus-$ver"
		# PostgreSQL 15.20 declares have_createdb_privilege(), which Citus
		# 13.2.2 defines for servers before 16 (see the vendor README)
		if [ "$ver" = 13.2.2 ] &&
			grep -q have_createdb_privilege \
				"$("$PG_CONFIG" --includedir-server)/commands/dbcommands.h"; then
			patch -d "$src" -p1 <"$vendor/citus-13.2.2-pg15.20.patch" >&2 || return 1
		fi
		(
			cd "$src" &&
				./configure PG_CONFIG="$PG_CONFIG" >"$build/configure.log" 2>&1 &&
				make -j"$(nproc)" >"$build/make.log" 2>&1 &&
				make install DESTDIR="$stage" >"$build/install.log" 2>&1
		)
		rc=$?
		if [ "$rc" -ne 0 ]; then
			echo "citus: the build failed; last lines of its logs:" >&2
			tail -n 20 "$build"/*.log >&2
			return 1
		fi
		rm -rf "$src"
		touch "$build/done"
	fi

	if citus_installed &&
		cmp -s "$stage$("$PG_CONFIG" --pkglibdir)/citus.so" \
			"$("$PG_CONFIG" --pkglibdir)/citus.so"; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "citus: installing Citus needs root" >&2
		return 1
	fi
	echo "citus: installing Citus $ver from $build" >&2
	# existing directories keep their owners and modes
	tar -C "$stage" -cf - . | tar -C / -xf - --no-overwrite-dir || return 1
}
