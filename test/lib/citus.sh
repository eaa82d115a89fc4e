# shellcheck shell=bash
#
# test/lib/citus.sh -- Citus for the examples/citus test, built from its
# pinned upstream release (Debian does not package Citus).  Source it; it
# defines functions only.  Nothing of Citus is copied into this project:
# the sources are downloaded or read from a local copy outside the tree,
# the build is kept in a cache outside the tree.
#
#   citus_version        the Citus release for $PG_CONFIG's major: 13.2.2
#                        (PostgreSQL 15-17) for 15, 14.0.1 (16-18) for 16+
#   citus_ensure         (as root) build that release for $PG_CONFIG's server
#                        once, keep the build under $IDEM_CITUS_CACHE, and
#                        install it into the server's directories unless it
#                        is installed already.  Returns 0 when Citus is
#                        installed; 77 when it cannot be had here (no source
#                        reachable, or a fix the server needs is missing),
#                        with the reason in CITUS_UNAVAILABLE and on stderr;
#                        1 on an error (a checksum that does not match, a
#                        failed build)
#   citus_installed      true if citus is installed for $PG_CONFIG
#   citus_tree_sum DIR   the checksum of an unpacked source tree (below)
#
# Where the sources come from, in this order (each checked against the
# release's pinned checksum; one that does not match is an error, not a
# reason to try the next):
#   1. a release downloaded by an earlier run: $IDEM_CITUS_CACHE/sources;
#   2. the upstream release, downloaded from $IDEM_CITUS_URL (GitHub's
#      archive of the release tag); kept in 1. for the next run.  Without
#      network (no DNS, no route) this fails within seconds;
#   3. a local copy: citus-X.Y.Z.tar.gz in $IDEM_VENDOR_DIR.
# A build for this exact server in the cache needs no sources at all.  When
# there are none and nothing is cached, a Citus that is already installed
# for the server is used as it is.
#
# The checksum is of the unpacked tree, not of the archive: GitHub makes its
# archives on the fly, so their bytes (compression, times, modes) are not
# stable and cannot be computed offline, while the tree of a tag is.  It is
# the sha256 of the sorted list of every file's sha256 and path and every
# symbolic link's target (citus_tree_sum); modes, owners, times and empty
# directories do not count.  The pinned values were computed from
# `git archive --prefix=citus-X.Y.Z/ vX.Y.Z` of the release tags, which is
# what GitHub serves for a tag.
#
# Citus 13.2.2 does not build against PostgreSQL 15.20 and later minors as
# released: their commands/dbcommands.h declares have_createdb_privilege(),
# which Citus defines for servers before 16.  The fix (renaming Citus' copy)
# is not upstream; it is applied from citus-13.2.2-pg15.20.patch in
# $IDEM_VENDOR_DIR when that has it (checked against its pinned sha256),
# and without it Citus is unavailable for such a server (77, with that
# reason).
#
# Settings (environment):
#   IDEM_VENDOR_DIR      the local copy of the released sources and patches
#                        (default: ../shared/vendor beside the source tree,
#                        when it exists)
#   IDEM_CITUS_CACHE     default /var/cache/idempotency/citus
#   IDEM_CITUS_URL       where to download a release, @VERSION@ standing for
#                        its version (default GitHub's archive of the tag
#                        vX.Y.Z); empty: do not download
#   PG_CONFIG            the server to build for

IDEM_CITUS_CACHE=${IDEM_CITUS_CACHE:-/var/cache/idempotency/citus}
IDEM_CITUS_URL=${IDEM_CITUS_URL-https://github.com/citusdata/citus/archive/refs/tags/v@VERSION@.tar.gz}
CITUS_UNAVAILABLE=""
_CITUS_SRC=""

# the tree this file belongs to: its ../shared/vendor is the default copy
_CITUS_TREE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)

# citus_tree_sum of each release's tree
declare -A _CITUS_TREE_SUM=(
	[13.2.2]=64519bfa06dd6bac3e873b98f61e4f75cfd1ec10acb9de5df50039f9b9c910cf
	[14.0.1]=cad9a568d8498d97ac0e854df2a22d191e58c3a3c17f5838bad32b07921fa3b6
)
# sha256 of the PostgreSQL 15.20 fix for 13.2.2 (a local file, not upstream)
_CITUS_PG1520_PATCH=citus-13.2.2-pg15.20.patch
_CITUS_PG1520_PATCH_SUM=36fc14b184d48fc85530b4c213a4dcb3bc698520b8ebcc0304de1df1bea9a82a

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

_citus_vendor_dir() {
	if [ -n "${IDEM_VENDOR_DIR:-}" ]; then
		printf '%s\n' "$IDEM_VENDOR_DIR"
	else
		printf '%s\n' "$_CITUS_TREE/../shared/vendor"
	fi
}

# The build of this Citus release for this exact server (its version string
# names the minor release and the Debian revision).
_citus_build_dir() {
	local pgver
	pgver=$("$PG_CONFIG" --version | tr -c 'A-Za-z0-9.\n' '_')
	printf '%s/citus-%s-%s-%s\n' "$IDEM_CITUS_CACHE" "$(citus_version)" \
		"$pgver" "$(uname -m)"
}

citus_tree_sum() {
	(
		cd "$1" || exit 1
		{
			find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum --
			# symbolic links by their targets; anything else (a device, a
			# fifo) changes the sum too
			find . ! -type f ! -type d -print0 | LC_ALL=C sort -z |
				while IFS= read -r -d '' f; do
					if [ -L "$f" ]; then
						printf 'link %s -> %s\n' "$f" "$(readlink "$f")"
					else
						printf 'other %s\n' "$f"
					fi
				done
		} | sha256sum | cut -d ' ' -f 1
	)
}

# _citus_unpack TARBALL DEST ORIGIN: unpack the release TARBALL into the
# empty directory DEST and check its tree; sets _CITUS_SRC to the unpacked
# top directory.  Fails (1) if it is not one directory with the pinned sum.
_citus_unpack() {
	local tarball="$1" dest="$2" origin="$3" ver top sum
	ver=$(citus_version)
	mkdir -p "$dest" || return 1
	if ! tar -C "$dest" --no-same-owner -xzf "$tarball"; then
		echo "citus: $origin is not a readable tar.gz archive" >&2
		return 1
	fi
	top=$(find "$dest" -mindepth 1 -maxdepth 1)
	if [ "$(printf '%s\n' "$top" | wc -l)" -ne 1 ] || [ ! -d "$top" ] || [ -L "$top" ]; then
		echo "citus: $origin does not unpack to one directory" >&2
		return 1
	fi
	sum=$(citus_tree_sum "$top") || return 1
	if [ "$sum" != "${_CITUS_TREE_SUM[$ver]}" ]; then
		echo "citus: the sources in $origin are not those of Citus $ver:" >&2
		echo "citus: tree checksum $sum, pinned ${_CITUS_TREE_SUM[$ver]}" >&2
		return 1
	fi
	echo "citus: $origin: the sources of Citus $ver (tree checksum verified)" >&2
	_CITUS_SRC=$top
}

# _citus_sources DEST: unpack the verified sources of citus_version into
# DEST (see the header for where from), and set _CITUS_SRC to their top
# directory.  Returns 77 with CITUS_UNAVAILABLE set if there are none, 1 on
# an error.
_citus_sources() {
	local dest="$1" ver vendor cached url tmp tried
	ver=$(citus_version)
	vendor=$(_citus_vendor_dir)
	cached="$IDEM_CITUS_CACHE/sources/citus-$ver.tar.gz"

	if [ -f "$cached" ]; then
		_citus_unpack "$cached" "$dest" "$cached"
		return
	fi
	if [ -n "$IDEM_CITUS_URL" ]; then
		url=${IDEM_CITUS_URL//@VERSION@/$ver}
		echo "citus: downloading $url" >&2
		mkdir -p "$IDEM_CITUS_CACHE/sources" || return 1
		tmp=$(mktemp "$IDEM_CITUS_CACHE/sources/.citus-$ver.XXXXXX") || return 1
		# without network this fails at once (DNS) or at the connect
		# timeout; the download itself (about 8 MB) may take its time
		if curl -fsSL --proto '=https' --connect-timeout 15 --max-time 600 \
			-o "$tmp" "$url"; then
			if _citus_unpack "$tmp" "$dest" "$url"; then
				mv "$tmp" "$cached"
				return 0
			fi
			rm -f "$tmp"
			return 1
		fi
		rm -f "$tmp"
		tried="could not download $url"
	else
		tried="no download (IDEM_CITUS_URL is empty)"
	fi
	if [ -f "$vendor/citus-$ver.tar.gz" ]; then
		_citus_unpack "$vendor/citus-$ver.tar.gz" "$dest" "$vendor/citus-$ver.tar.gz"
		return
	fi
	CITUS_UNAVAILABLE="no source of Citus $ver is reachable ($tried; no local copy: no citus-$ver.tar.gz in '$vendor', see IDEM_VENDOR_DIR)"
	return 77
}

# _citus_patch SRC: apply the fixes this server needs to the Citus sources
# in SRC.  Returns 77 with CITUS_UNAVAILABLE set if a fix is not at hand.
_citus_patch() {
	local src="$1" ver vendor patch sum
	ver=$(citus_version)
	vendor=$(_citus_vendor_dir)
	# PostgreSQL 15.20 declares have_createdb_privilege(), which Citus
	# 13.2.2 defines for servers before 16
	if [ "$ver" = 13.2.2 ] &&
		grep -q have_createdb_privilege \
			"$("$PG_CONFIG" --includedir-server)/commands/dbcommands.h"; then
		patch="$vendor/$_CITUS_PG1520_PATCH"
		if [ ! -f "$patch" ]; then
			CITUS_UNAVAILABLE="Citus $ver does not build against $("$PG_CONFIG" --version) as released (both define have_createdb_privilege()), and its fix $_CITUS_PG1520_PATCH, which is not upstream, is not in the local copy '$vendor' (IDEM_VENDOR_DIR)"
			return 77
		fi
		sum=$(sha256sum <"$patch" | cut -d ' ' -f 1)
		if [ "$sum" != "$_CITUS_PG1520_PATCH_SUM" ]; then
			echo "citus: $patch has sha256 $sum, pinned $_CITUS_PG1520_PATCH_SUM" >&2
			return 1
		fi
		echo "citus: applying $patch" >&2
		patch -d "$src" -p1 <"$patch" >&2 || return 1
	fi
	return 0
}

citus_ensure() {
	local ver build stage src rc
	ver=$(citus_version)
	build=$(_citus_build_dir)
	stage="$build/stage"
	CITUS_UNAVAILABLE=""

	if [ ! -f "$build/done" ]; then
		if [ "$(id -u)" -ne 0 ]; then
			echo "citus: building and installing Citus needs root" >&2
			return 1
		fi
		rm -rf "$build"
		mkdir -p "$build" || return 1
		_citus_sources "$build/src" && src=$_CITUS_SRC && _citus_patch "$src"
		rc=$?
		if [ "$rc" -ne 0 ]; then
			rm -rf "$build"
			if [ "$rc" -eq 77 ] && citus_installed; then
				echo "citus: $CITUS_UNAVAILABLE" >&2
				echo "citus: using the Citus already installed for $("$PG_CONFIG" --version), as it is" >&2
				CITUS_UNAVAILABLE=""
				return 0
			fi
			[ "$rc" -eq 77 ] && echo "citus: $CITUS_UNAVAILABLE" >&2
			return "$rc"
		fi
		echo "citus: building Citus $ver for $("$PG_CONFIG" --version) in $build" >&2
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
		rm -rf "$build/src"
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
