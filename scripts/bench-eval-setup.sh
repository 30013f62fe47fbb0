# Sourced by scripts/bench-eval.sh and scripts/bench-eval-e2e.sh, from the
# repository's root: a work directory removed on exit (with the gradient up
# still running there interrupted first: its PID is in up_pid), and Nix
# set up for fresh stores without a network.
work=$(mktemp -d)
up_pid=
cleanup() {
  if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
    kill -INT "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export NIX_CONFIG=$'experimental-features = nix-command flakes\nsubstituters =\nflake-registry =\nsandbox = false\nbuild-users-group =\nsandbox-paths = /bin /lib /lib64 /usr'
mkdir -p "$work/etc" && export NIX_CONF_DIR=$work/etc NIX_USER_CONF_FILES=

# gradient_binary PATH sets $gradient to PATH, or, when PATH is empty, to
# ./cmd/gradient built into the work directory.
gradient_binary() {
  gradient=$1
  if [ -z "$gradient" ]; then
    go build -o "$work/gradient" ./cmd/gradient
    gradient=$work/gradient
  fi
}
