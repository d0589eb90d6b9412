#!/usr/bin/env bash
# The limiter bench of an earlier commit and of the working tree, run in turns, so that a
# change is judged against its base on the same machine in the same minutes:
#
#   scripts/bench-ab.sh BASE [ROUNDS]      # e.g. scripts/bench-ab.sh b8e958e 5
#
# Builds `benches/benches/limiter.rs` at BASE in a worktree under target/bench-ab/ (its own
# target directory, kept for the next run), then runs base and current ROUNDS times each,
# alternating, over the four pairs: uncontended `try_acquire` vs governor's `check()`, the
# same with 2 threads on one limiter, a pool slot vs tokio's `Semaphore`, and the keyed
# limiter over 1,000,000 keys vs governor's. Prints each run's ratios (sluice / peer) and the
# median ratio of each pair for base and current, with the range over the rounds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${1:?usage: scripts/bench-ab.sh BASE [ROUNDS]}
ROUNDS=${2:-5}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive whole number, got \`$ROUNDS\`" >&2; exit 2; }
cd "$ROOT"
base=$(git rev-parse --verify --short=12 "$BASE^{commit}") || { echo "no commit \`$BASE\`" >&2; exit 2; }
FILTER='try_acquire/(uncontended|2 threads, one limiter)/(governor|sluice try_acquire \(gcra, quanta)|pool|keyed'

# The path of the limiter bench's executable, built by `cargo bench --no-run` in $1.
bench_binary() {
  (cd "$1" && cargo bench -q -p sluice-benches --bench limiter --no-run --message-format=json 2>/dev/null) |
    grep '"kind":\["bench"\],"crate_types":\["bin"\],"name":"limiter"' |
    sed -nE 's/.*"executable":"([^"]+)".*/\1/p' | tail -1
}

tree="$ROOT/target/bench-ab/$base"
if [ ! -d "$tree" ]; then
  git worktree add --detach -f "$tree" "$base" >/dev/null
fi
echo "building the base ($base) and the working tree"
old=$(CARGO_TARGET_DIR="$ROOT/target/bench-ab/target" bench_binary "$tree")
new=$(bench_binary "$ROOT")
[ -x "$old" ] && [ -x "$new" ] || { echo "a bench failed to build (base: '$old', current: '$new')" >&2; exit 1; }

# One run: criterion's median estimates in bench order, as ns, then the four ratios.
run() {
  "$1" --bench --warm-up-time 1 --measurement-time 3 "$FILTER" 2>/dev/null |
    sed -nE 's/.*time: +\[[0-9.]+ [a-zµ]+ ([0-9.]+) ([a-zµ]+) .*/\1 \2/p' |
    awk '{v = $1; if ($2 == "ps") v /= 1000; if ($2 == "µs" || $2 == "us") v *= 1000; t[NR] = v}
         END { if (NR != 8) { print "expected 8 rows, got " NR > "/dev/stderr"; exit 1 }
               printf "%.4f %.4f %.4f %.4f", t[2] / t[1], t[4] / t[3], t[6] / t[5], t[8] / t[7] }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq "$ROUNDS"); do
  for side in base current; do
    bin=$new
    [ "$side" = base ] && bin=$old
    ratios=$(run "$bin")
    echo "$side $ratios" >>"$results"
    echo "round $round $side: uncontended, 2 threads, pool, keyed (sluice / peer): $ratios"
  done
done

summary() {
  grep "^$1 " "$results" | cut -d' ' -f$(( $2 + 1 )) | sort -g |
    awk '{v[NR] = $1} END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
                            printf "%.3f (%.3f-%.3f)", m, v[1], v[NR] }'
}
pairs=("uncontended try_acquire / governor check()" "2 threads, one limiter / governor" "Pool acquire+drop / tokio Semaphore" "Keyed, 1M u64 keys / governor keyed")
echo "median ratio over $ROUNDS rounds (range): base $base | current $(git rev-parse --short=12 HEAD)$(git diff --quiet || echo '+changes')"
for i in 1 2 3 4; do
  echo "  ${pairs[$((i - 1))]}: $(summary base "$i") | $(summary current "$i")"
done
