# Shared by the scripts that build programs tabby's tests and lab run from
# the Go module proxy (test/controlplane, test/runtime, test/upstream,
# test/cnpconformance) and the qemu test's kernel (test/qemutest).
# Source it; it defines:
#
#   cache_root             the build cache: $TABBY_CACHE_DIR, else
#                          ${XDG_CACHE_HOME:-$HOME/.cache}/tabby. Outside the
#                          checkout, so every clone and worktree shares it.
#   content_key FILE...    a key of the files' contents and the Go version,
#                          never of their paths: the same sources give the
#                          same key in any checkout.
#   cache_lock DIR         waits for, then holds until the script exits, an
#                          exclusive lock on DIR.lock (test packages run
#                          build scripts at the same time).
#   cache_claim DIR        with the script's `complete` function saying
#                          whether DIR holds the build: when it does, prints
#                          DIR and ends the script; else takes DIR's lock,
#                          looks again (another run may have built it
#                          meanwhile), and leaves an empty DIR.tmp to build
#                          into (then moved to DIR).
#   step NAME CMD...       runs CMD, with "[elapsed] NAME" on stderr first.

cache_root() {
  echo "${TABBY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tabby}"
}

content_key() {
  { for f in "$@"; do sha256sum <"$f"; done; go env GOVERSION GOARCH GOOS; } | sha256sum | cut -c1-16
}

cache_lock() {
  mkdir -p "$(dirname "$1")"
  exec {__lock_fd}>"$1.lock"
  if ! flock -n "$__lock_fd"; then
    echo "waiting for another build into $1" >&2
    flock "$__lock_fd"
  fi
}

cache_claim() {
  if complete; then echo "$1"; exit 0; fi
  cache_lock "$1"
  if complete; then echo "$1"; exit 0; fi
  rm -rf "$1.tmp"
  mkdir -p "$1.tmp"
}

__build_start=$SECONDS
step() {
  local name=$1
  shift
  printf '[%3ds] %s\n' $((SECONDS - __build_start)) "$name" >&2
  "$@"
}
