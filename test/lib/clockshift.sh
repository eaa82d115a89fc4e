# shellcheck shell=bash
#
# test/lib/clockshift.sh -- build test/lib/clockshift.c, the LD_PRELOAD
# library that moves the wall clock by an offset (IDEM_CLOCK_OFFSET) or
# starts it at an instant (IDEM_CLOCK_START); see the top of that file, and
# why it is not libfaketime.  Source it; it defines one function.
#
#   clockshift_build DIR   compile it into DIR/clockshift.so (readable by
#                          everyone: servers run as another user load it)
#                          and print that path; fails without a C compiler

clockshift_build() {
	local dir="$1" src cc
	src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/clockshift.c"
	cc=${CC:-cc}
	command -v "$cc" >/dev/null 2>&1 || cc=gcc
	mkdir -p "$dir" || return 1
	"$cc" -shared -fPIC -O2 -Wall -o "$dir/clockshift.so" "$src" -ldl >&2 || return 1
	chmod 755 "$dir/clockshift.so" || return 1
	printf '%s\n' "$dir/clockshift.so"
}
