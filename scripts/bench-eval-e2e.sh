#!/usr/bin/env bash
# End to end: an evaluation of N independent derivations plus their builds,
# from the evaluation's queueing until every build is done, with builds
# streaming while Nix evaluates (gradient up's default) against evaluation
# then build (`gradient up --hold-builds`: no build before the flake job's
# JobCompleted), and mode "nonice": streaming with `--eval-build-nice 0`
# (the builds that start while the worker evaluates run at the worker's
# priority instead of gradient up's default 10 nicer). The modes run one after the other in one run, on the same
# flake with a fresh chroot store and a fresh salt each, `gradient up
# --workers 1` (one worker: it evaluates and has one build slot).
# Each build writes its output file (and sleeps BENCH_EVAL_E2E_SLEEP
# seconds, default 0).
# Prints one line per N and mode, from the components' own log times:
#   discovered_s  queued → the flake job's JobCompleted (every .drv found,
#                 uploaded and recorded): held against streaming splits
#                 the builds' contention from the walk's own cost;
#   its_eval_s    gradient's own Nix evaluation (nix: evaluating → evaluated);
#   1st_build_s   queued → the first build's assignment;
#   overlap       builds completed before the flake job's JobCompleted;
#   overlap_s     the first build's assignment → the flake job's
#                 JobCompleted: how long builds ran beside the evaluation
#                 (0 when held): streaming should finish at least this
#                 much sooner than held;
#   builds_s      the flake job's JobCompleted → the evaluation's end;
#   total_s       queued → the evaluation's end (every build done);
#   cpu_s         user+system CPU of gradient up and every process it
#                 started (Nix evaluation, daemon children, builders).
#
# Run the modes as "stream hold hold stream" to cancel a drift of the
# machine across the runs (each later run of a series came out a few
# seconds slower on a quiet machine).
#
# Usage: scripts/bench-eval-e2e.sh [GRADIENT-BINARY] [N...]   (default: builds ./cmd/gradient; N = 2000)
# BENCH_EVAL_E2E_MODES="stream hold" (default; "nonice" too) picks the modes and their order;
# BENCH_EVAL_UP_ARGS adds options to gradient up; BENCH_EVAL_KEEP=PREFIX
# keeps each run's log as PREFIX-N-MODE.log.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-eval-setup.sh
gradient_binary "${1:-}"
[ $# -gt 0 ] && shift
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(2000)
system=$(uname -m)-linux
sleep_s=${BENCH_EVAL_E2E_SLEEP:-0}
modes=(${BENCH_EVAL_E2E_MODES:-stream hold})


printf '%7s %6s %12s %10s %11s %8s %9s %9s %9s %7s\n' N mode discovered_s its_eval_s 1st_build_s overlap overlap_s builds_s total_s cpu_s
for n in "${sizes[@]}"; do
for mode in "${modes[@]}"; do
  salt=$(date +%s%N)
  flake=$work/flake-$n
  rm -rf "$flake"
  mkdir -p "$flake"
  cat >"$flake/flake.nix" <<EOF
{ outputs = { self }: let
    sys = "$system";
    mk = i: builtins.derivation { name = "d\${toString i}"; salt = "$salt"; system = sys; builder = "/bin/sh";
      args = [ "-c" "echo \${toString i} > \$out; [ $sleep_s = 0 ] || /bin/sleep $sleep_s" ]; };
  in { packages.\${sys} = builtins.listToAttrs (builtins.genList (i: { name = "d\${toString i}"; value = mk i; }) $n); }; }
EOF
  git -C "$flake" init -q
  git -C "$flake" add flake.nix
  git -C "$flake" -c user.name=bench -c user.email=bench@example.com commit -qm flake

  mode_args=
  [ "$mode" = hold ] && mode_args=--hold-builds
  [ "$mode" = nonice ] && mode_args="--eval-build-nice 0"
  log=$work/up-$n-$mode.log
  # shellcheck disable=SC2086
  /usr/bin/time -f 'cpu %U %S' -o "$work/time-$n-$mode" \
    "$gradient" up --workers 1 --store "$work/gradient-store-$n" --data-dir "$work/up-$n" --verbose \
    --timeout 60m $mode_args ${BENCH_EVAL_UP_ARGS:-} "$flake" >/dev/null 2>"$log" &
  up_pid=$!
  wait "$up_pid" || { tail -20 "$log" >&2; exit 1; }
  up_pid=
  discovered=$(grep -m1 -o '[0-9]* derivations discovered' "$log" | cut -d' ' -f1) || { tail -20 "$log" >&2; exit 1; }
  [ "$discovered" -eq "$n" ] || { echo "gradient discovered $discovered, want $n" >&2; exit 1; }
  at() { date -d "$(grep -m1 "$1" "$log" | grep -o 'time=[^ ]*' | cut -d= -f2)" +%s.%N; }
  queued=$(at 'msg="evaluation queued"')
  evaluating=$(at 'msg="nix: evaluating"')
  evaluated=$(at 'msg="nix: evaluated"')
  completed=$(at 'msg="job completed" component=scheduler job=[^ ]* what=[^ ]*@')
  first_at=$(at 'msg="assigned job".*kind=build')
  finished=$(at 'msg="evaluation finished"')
  # Builds the scheduler saw complete before the flake job did.
  overlap=$(awk '/msg="job completed" component=scheduler/ { if ($0 ~ /what=[^ ]*@/) exit; n++ } END { print n + 0 }' "$log")
  built=$(grep -c 'msg="job completed" component=scheduler job=[^ ]* what=packages' "$log" || true)
  [ "$built" -eq "$n" ] || { echo "$built builds completed, want $n" >&2; exit 1; }
  cpu_s=$(awk '/^cpu/ { printf "%.1f", $2 + $3 }' "$work/time-$n-$mode")
  overlap_s=$(echo "$completed - $first_at" | bc -l)
  [ "$(echo "$overlap_s < 0" | bc -l)" -eq 0 ] || overlap_s=0
  printf '%7d %6s %12.2f %10.2f %11.2f %8d %9.2f %9.2f %9.2f %7s\n' "$n" "$mode" \
    "$(echo "$completed - $queued" | bc -l)" "$(echo "$evaluated - $evaluating" | bc -l)" \
    "$(echo "$first_at - $queued" | bc -l)" "$overlap" "$overlap_s" \
    "$(echo "$finished - $completed" | bc -l)" "$(echo "$finished - $queued" | bc -l)" "$cpu_s"
  [ -z "${BENCH_EVAL_KEEP:-}" ] || cp "$log" "${BENCH_EVAL_KEEP}-$n-$mode.log"
  chmod -R u+w "$work/gradient-store-$n" 2>/dev/null || true
  rm -rf "$work/gradient-store-$n" "$work/up-$n"
done
done
