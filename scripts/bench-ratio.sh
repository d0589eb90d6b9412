#!/usr/bin/env bash
# The limiter's two pairs against governor, N criterion runs in a row, each run holding both
# sides:
#
#   scripts/bench-ratio.sh [ROUNDS]
#
# Prints, per round, criterion's median estimate for governor's `check()`, sluice's
# `try_acquire` (GCRA, quanta clock), the floor row (one quanta read and one compare-exchange)
# and the clock row (one quanta counter read, nothing else), uncontended and with 2 threads on
# one limiter; then the median ratio sluice / governor of each pair over the rounds, and of the
# clock read alone to governor's whole check. One run swings by a few percent on a noisy 2-core
# machine; the median over rounds is the figure to compare with the target (<= 1.0).
set -euo pipefail
ROUNDS=${1:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FILTER='try_acquire/(uncontended|2 threads, one limiter)/(governor|sluice try_acquire \(gcra, quanta|floor|clock)'
cd "$ROOT"
cargo bench -q -p sluice-benches --bench limiter --no-run 2>/dev/null
RATIOS=$(mktemp)
trap 'rm -f "$RATIOS"' EXIT
for round in $(seq "$ROUNDS"); do
  # The medians in bench order: governor, sluice, floor, clock (uncontended); governor, sluice (2 threads).
  read -r g s f c g2 s2 < <(cargo bench -q -p sluice-benches --bench limiter -- \
      --warm-up-time 1 --measurement-time 3 "$FILTER" 2>/dev/null |
    sed -nE 's/.*time: +\[[0-9.]+ [a-z]+ ([0-9.]+) ([a-z]+) .*/\1 \2/p' |
    awk '{v = $1; if ($2 == "ps") v /= 1000; if ($2 == "µs" || $2 == "us") v *= 1000; printf "%s ", v} END {print ""}')
  awk -v r="$round" -v g="$g" -v s="$s" -v f="$f" -v c="$c" -v g2="$g2" -v s2="$s2" 'BEGIN {
    printf "round %d: uncontended governor %.3f ns, sluice %.3f ns, floor %.3f ns, clock alone %.3f ns, ratio %.3f; 2 threads governor %.3f ns, sluice %.3f ns, ratio %.3f\n", r, g, s, f, c, s / g, g2, s2, s2 / g2 }'
  awk -v g="$g" -v s="$s" -v c="$c" -v g2="$g2" -v s2="$s2" 'BEGIN { printf "%.4f %.4f %.4f\n", s / g, s2 / g2, c / g }' >> "$RATIOS"
done
median() { sort -g | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median sluice / governor over $ROUNDS rounds: uncontended $(cut -d' ' -f1 "$RATIOS" | median), 2 threads $(cut -d' ' -f2 "$RATIOS" | median) (target <= 1.0 each)"
echo "median clock read alone / governor's whole check: $(cut -d' ' -f3 "$RATIOS" | median)"
