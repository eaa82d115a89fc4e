# shellcheck shell=bash
#
# test/lib/build.sh -- copy the source tree to a scratch directory, build it
# there as the unprivileged user and install it.  Needs test/lib/cluster.sh
# (for cluster_as_user) sourced first.  Shared by test/run-all.sh and
# examples/demo.sh.
#
#   idem_copy_tree SRC DEST   copy SRC (working tree, without .git and build
#                             or test output) to DEST, owned by CLUSTER_USER
#   idem_build DIR            make (warnings are errors), as CLUSTER_USER
#   idem_install DIR          make install: as root directly, otherwise
#                             directly if the PostgreSQL directories are
#                             writable, else through sudo
#
# PG_CONFIG must be set (an absolute path).

idem_copy_tree() {
	local src="$1" dest="$2"
	mkdir -p "$dest" || return 1
	tar -C "$src" \
		--exclude=./.git \
		--exclude='./tmp_check*' \
		--exclude=./results \
		--exclude=./output_iso \
		--exclude='./regression.*' \
		--exclude='*.o' --exclude='*.so' --exclude='*.bc' \
		-cf - . | tar -C "$dest" -xf - || return 1
	if [ "$(id -u)" -eq 0 ]; then
		chown -R "${CLUSTER_USER:-postgres}:" "$dest" || return 1
	fi
}

idem_build() {
	local dir="$1" jobs
	jobs=$(nproc 2>/dev/null || echo 2)
	# warning-free with the server's own flags, or the build fails
	(cd "$dir" && cluster_as_user make -j"$jobs" PG_CONFIG="$PG_CONFIG" COPT=-Werror)
}

idem_install() {
	local dir="$1" pkglibdir sharedir
	if [ "$(id -u)" -eq 0 ]; then
		(cd "$dir" && make install PG_CONFIG="$PG_CONFIG")
		return
	fi
	pkglibdir=$("$PG_CONFIG" --pkglibdir) || return 1
	sharedir=$("$PG_CONFIG" --sharedir) || return 1
	if [ -w "$pkglibdir" ] && [ -w "$sharedir/extension" ]; then
		(cd "$dir" && make install PG_CONFIG="$PG_CONFIG")
	elif command -v sudo >/dev/null 2>&1; then
		echo "installing with sudo (PostgreSQL directories are not writable)" >&2
		(cd "$dir" && sudo make install PG_CONFIG="$PG_CONFIG")
	else
		echo "make install needs write access to $pkglibdir: run as root" >&2
		return 1
	fi
}
