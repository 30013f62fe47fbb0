#!/usr/bin/env bash
# Times plain Nix against `gradient up` on the same generated flake: 40
# derivations in 10 layers of 4, each reading its inputs, with a fresh
# salt per run so nothing is cached. Each side gets a fresh chroot store.
# Prints both wall times, their ratio, and the worker's per-build timings
# (from `gradient up --verbose` logs) as p50s.
#
# Usage: scripts/bench-up.sh [GRADIENT-BINARY]   (default: builds ./cmd/gradient)
# With BENCH_UP_LOG=FILE the gradient up log is kept there.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gradient=${1:-}
if [ -z "$gradient" ]; then
  go build -o "$work/gradient" ./cmd/gradient
  gradient=$work/gradient
fi
salt=$(date +%s%N)
system=$(uname -m)-linux

# The flake: layer L's derivation i reads every output of layer L-1.
flake=$work/flake
mkdir -p "$flake"
{
  echo '{ outputs = { self }: let'
  echo "  salt = \"$salt\"; sys = \"$system\";"
  echo '  mk = name: deps: builtins.derivation { inherit name salt deps; system = sys; builder = "/bin/sh";'
  echo '    args = [ "-c" "for d in $deps; do read -r x < $d; done; echo $name $salt > $out" ]; };'
  echo '  layer = l: prev: builtins.genList (i: mk "l${toString l}-${toString i}" prev) 4;'
  echo '  layers = builtins.foldl'"'"' (acc: l: acc ++ [ (layer l (if acc == [] then [] else builtins.elemAt acc (l - 1))) ]) [] (builtins.genList (x: x) 10);'
  echo '  all = builtins.concatLists layers;'
  echo '  in { packages.${sys} = builtins.listToAttrs (map (d: { name = d.name; value = d; }) all); }; }'
} > "$flake/flake.nix"
git -C "$flake" init -q
git -C "$flake" add flake.nix
git -C "$flake" -c user.name=bench -c user.email=bench@example.com commit -qm flake

export NIX_CONFIG=$'experimental-features = nix-command flakes\nsubstituters =\nflake-registry =\nsandbox = false\nbuild-users-group =\nsandbox-paths = /bin /lib /lib64 /usr'
mkdir -p "$work/etc" && export NIX_CONF_DIR=$work/etc NIX_USER_CONF_FILES=

now() { date +%s.%N; }

# Plain Nix: evaluate and build every package with two jobs.
t0=$(now)
nix build --store "$work/nix-store" --max-jobs 2 --no-link \
  "path:$flake#packages.$system.l9-0" "path:$flake#packages.$system.l9-1" \
  "path:$flake#packages.$system.l9-2" "path:$flake#packages.$system.l9-3"
t1=$(now)

# Gradient: server, two workers, the evaluation and 40 builds.
"$gradient" up --workers 2 --store "$work/gradient-store" --data-dir "$work/up" --verbose "$flake" \
  >"$work/up.out" 2>"$work/up.log" || { tail -20 "$work/up.log"; exit 1; }
t2=$(now)

if [ -n "${BENCH_UP_LOG:-}" ]; then cp "$work/up.log" "$BENCH_UP_LOG"; fi
nix_s=$(echo "$t1 - $t0" | bc -l)
up_s=$(echo "$t2 - $t1" | bc -l)
printf 'nix build --max-jobs 2:     %.2f s\n' "$nix_s"
printf 'gradient up --workers 2:    %.2f s\n' "$up_s"
printf 'ratio:                      %.1fx\n' "$(echo "$up_s / $nix_s" | bc -l)"

# Fixed cost around the builds, from the log's clock: the start (process
# start to the first job accepted: server and workers), the fetch and
# evaluation (to the first build job accepted) and the end (the last
# job's completion to the exit).
stamp() { date -d "$1" +%s.%N; }
# (awk, not grep -m1 in a pipe: an early exit would fail the pipe)
at() { awk -v re="$1" -v last="${2:-}" '$0 ~ re { t = substr($1, 6); if (!last) { print t; exit } } END { if (last && t) print t }' "$work/up.log"; }
first_job=$(at 'msg="accepted job"')
first_build=$(at 'msg="accepted job".*kind=build')
last_done=$(at 'msg="job completed"' last)
if [ -n "$first_build" ] && [ -n "$last_done" ]; then
  printf 'start to first job:         %.2f s\n' "$(echo "$(stamp "$first_job") - $t1" | bc -l)"
  printf 'first job to first build:   %.2f s\n' "$(echo "$(stamp "$first_build") - $(stamp "$first_job")" | bc -l)"
  printf 'last job to exit:           %.2f s\n' "$(echo "$t2 - $(stamp "$last_done")" | bc -l)"
fi

# The worker's own timings: its "built" line per build.
p50() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
for field in prepare_ms build_ms handover_ms upload_ms overhead_ms; do
  printf '%-14s p50 %s ms\n' "$field" "$(grep -o "$field=[0-9]*" "$work/up.log" | cut -d= -f2 | p50)"
done
