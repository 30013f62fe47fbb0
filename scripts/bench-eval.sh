#!/usr/bin/env bash
# Times a large evaluation: plain `nix eval` of every drvPath of a generated
# flake of N independent trivial derivations against `gradient up` on the same
# flake, up to "N derivations discovered" (the evaluation job's JobCompleted:
# every .drv uploaded, stored and recorded). Each side gets a fresh chroot
# store and a fresh salt, so nothing is cached. gradient up is interrupted
# once the evaluation is done: the builds are not what this measures.
# Prints one line per N: plain nix eval; gradient from the evaluation's
# queueing to its flake job's JobCompleted (start-up of the server and the
# worker left out); the ratio; and gradient's split: its own nix evaluation
# of the attributes (drvPaths, written through the store's daemon) and the
# rest (closure walk, every .drv uploaded, stored and recorded); and the
# gradient process's own CPU time (server and worker, not Nix) until then;
# and the time to the first build's assignment (from the evaluation's
# queueing; "-" when none within 30 s of the evaluation's end), whether
# it came before the evaluation ended, and how long after the worker's
# first batch of found derivations (its first "uploading paths" once Nix
# evaluates: the walker hands a batch on at 50 found or 100 ms without a
# new one) it was assigned.
# Each N runs two flakes: "indep" (independent trivial derivations) and
# "shared" (every derivation uses one expensive let-bound value, a
# builtins.foldl' over BENCH_EVAL_SHARED_LEN, default 3,000,000, integers:
# evaluating it once per shard must not make sharding slower).
#
# Usage: scripts/bench-eval.sh [GRADIENT-BINARY] [N...]   (default: builds ./cmd/gradient; N = 400 2000 20000)
# BENCH_EVAL_KINDS="indep shared" picks the flakes; BENCH_EVAL_UP_ARGS adds
# options to gradient up.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-eval-setup.sh
gradient_binary "${1:-}"
[ $# -gt 0 ] && shift
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(400 2000 20000)
system=$(uname -m)-linux

now() { date +%s.%N; }

kinds=(${BENCH_EVAL_KINDS:-indep shared})
shared_len=${BENCH_EVAL_SHARED_LEN:-3000000}
printf '%7s %6s %10s %12s %7s %10s %10s %8s %9s %6s %9s\n' N flake nix_eval_s gradient_s ratio its_eval_s walk_s cpu_s 1st_build early 1st_found
for n in "${sizes[@]}"; do
for kind in "${kinds[@]}"; do
  salt=$(date +%s%N)
  flake=$work/flake-$n
  rm -rf "$flake"
  mkdir -p "$flake"
  shared='""'
  [ "$kind" = shared ] && shared="toString (builtins.foldl' (a: b: a + b) 0 (builtins.genList (x: x) $shared_len))"
  cat >"$flake/flake.nix" <<EOF
{ outputs = { self }: let
    sys = "$system";
    shared = $shared;
    mk = i: builtins.derivation { name = "d\${toString i}"; salt = "$salt"; inherit shared; system = sys; builder = "/bin/sh";
      args = [ "-c" "echo \${toString i} > \$out" ]; };
  in { packages.\${sys} = builtins.listToAttrs (builtins.genList (i: { name = "d\${toString i}"; value = mk i; }) $n); }; }
EOF
  git -C "$flake" init -q
  git -C "$flake" add flake.nix
  git -C "$flake" -c user.name=bench -c user.email=bench@example.com commit -qm flake

  # Plain Nix: every drvPath, which writes every .drv into a fresh store.
  t0=$(now)
  nix eval --store "$work/nix-store-$n" --raw "path:$flake#packages.$system" \
    --apply 'ps: builtins.concatStringsSep "\n" (map (p: p.drvPath) (builtins.attrValues ps))' >"$work/drvs-$n"
  t1=$(now)
  got=$(wc -l <"$work/drvs-$n"); got=$((got + 1))
  [ "$got" -eq "$n" ] || { echo "nix eval listed $got drvPaths, want $n" >&2; exit 1; }

  # Gradient: until the evaluation line says the derivations are discovered.
  log=$work/up-$n.log
  # shellcheck disable=SC2086
  "$gradient" up --workers 1 --store "$work/gradient-store-$n" --data-dir "$work/up-$n" --verbose \
    --timeout 30m ${BENCH_EVAL_UP_ARGS:-} "$flake" >/dev/null 2>"$log" &
  up_pid=$!
  while ! grep -q "derivations discovered\|evaluation failed\|gradient up: " "$log" 2>/dev/null; do
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.2
  done
  # The gradient process's own CPU (server and worker; not its Nix
  # children) up to here: user + system ticks of /proc/PID/stat.
  cpu_s=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$up_pid/stat" 2>/dev/null || echo nan)
  # The first build's assignment, if it has not come yet (it comes after
  # the evaluation's end without streaming).
  for _ in $(seq 150); do
    grep -q 'msg="assigned job".*kind=build' "$log" && break
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -INT "$up_pid" 2>/dev/null || true
  wait "$up_pid" 2>/dev/null || true
  up_pid=
  discovered=$(grep -m1 -o '[0-9]* derivations discovered' "$log" | cut -d' ' -f1) || { tail -20 "$log" >&2; exit 1; }
  [ "$discovered" -eq "$n" ] || { echo "gradient discovered $discovered, want $n" >&2; exit 1; }
  # The components' own log times (slog's time=): the scheduler queues the
  # evaluation, the worker evaluates and walks, the scheduler records the
  # flake job's JobCompleted (every EvalResult recorded before it).
  at() { date -d "$(grep -m1 "$1" "$log" | grep -o 'time=[^ ]*' | cut -d= -f2)" +%s.%N; }
  queued=$(at 'msg="evaluation queued"')
  evaluating=$(at 'msg="nix: evaluating"')
  evaluated=$(at 'msg="nix: evaluated"')
  completed=$(at 'msg="job completed" component=scheduler job=[^ ]* what=[^ ]*@')
  nix_s=$(echo "$t1 - $t0" | bc -l)
  up_s=$(echo "$completed - $queued" | bc -l)
  ev_s=$(echo "$evaluated - $evaluating" | bc -l)
  walk_s=$(echo "$completed - $evaluated" | bc -l)
  first=- early=- after_found=-
  if grep -q 'msg="assigned job".*kind=build' "$log"; then
    first_at=$(at 'msg="assigned job".*kind=build')
    first=$(printf '%.2f' "$(echo "$first_at - $queued" | bc -l)")
    early=no
    [ "$(echo "$first_at < $evaluated" | bc -l)" -eq 1 ] && early=yes
    found_line=$(awk '/msg="nix: evaluating"/ { on = 1 } on && /msg="uploading paths"/ { print; exit }' "$log")
    if [ -n "$found_line" ]; then
      found_at=$(date -d "$(echo "$found_line" | grep -o 'time=[^ ]*' | cut -d= -f2)" +%s.%N)
      after_found=$(printf '%.2f' "$(echo "$first_at - $found_at" | bc -l)")
    fi
  fi
  printf '%7d %6s %10.2f %12.2f %6.1fx %10.2f %10.2f %8s %9s %6s %9s\n' "$n" "$kind" "$nix_s" "$up_s" "$(echo "$up_s / $nix_s" | bc -l)" "$ev_s" "$walk_s" "$cpu_s" "$first" "$early" "$after_found"
  [ -z "${BENCH_EVAL_KEEP:-}" ] || cp "$log" "${BENCH_EVAL_KEEP}-$n-$kind.log"
  chmod -R u+w "$work/nix-store-$n" "$work/gradient-store-$n" 2>/dev/null || true
  rm -rf "$work/nix-store-$n" "$work/gradient-store-$n" "$work/up-$n"
done
done
