# shellcheck shell=bash
# install_lib.sh: what the tests of tests/install share. Set name=NAME, source this file, call
# inst_setup: $tmp is a fresh directory ${TMPDIR:-/tmp}/dgshim-NAME.XXXXXX, removed on exit
# after every background process whose pid the script added to pids is killed and reaped;
# fail MESSAGE and say MESSAGE print lines prefixed with NAME (fail exits 1).

: "${name:?set name=NAME before sourcing install_lib.sh}"
pids=()
fail() { echo "$name: FAIL: $*"; exit 1; }
say() { echo "$name: $*"; }

inst_setup() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/dgshim-$name.XXXXXX")
	trap inst_cleanup EXIT
}

inst_cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
