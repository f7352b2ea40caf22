#!/usr/bin/env bash
# Alternating A/B runs of `tidelog-bench e2e` between two builds, with the applier's CPU per
# committed transaction (the figure that stays steady on a noisy machine; kept-up and lag
# move much more between runs of one build).
#
#   bench/ab-e2e.sh BASE_DIR N [e2e options...]
#
# BASE_DIR holds the other build's `tidelog` and `tidelog-bench` (e.g. copied from
# target/release before a change); the new build is this checkout's target/release. Each of
# the N rounds runs the base build, then the new one, and prints each run's summary line
# followed by `applier µs/txn` (the run's `CPU app` ÷ the transactions it committed).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
base=$1 n=$2
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
for _ in $(seq 1 "$n"); do
  for b in "$base" "$here/target/release"; do
    out=$(cd "$here" && "$b/tidelog-bench" e2e "$@" 2>&1)
    sum=$(grep -E '^(fixed|max) ' <<<"$out" | head -1)
    committed=$(grep -oE '\(([0-9,]+) committed' <<<"$out" | head -1 | tr -dc 0-9)
    cpu=$(awk '{print $(NF-2)}' <<<"$sum" | tr -d s)
    us=$(awk -v c="$cpu" -v n="$committed" 'BEGIN { printf "%.1f", c * 1e6 / n }')
    echo "[$b] $sum | applier µs/txn $us"
  done
done
