#!/usr/bin/env bash
# Token quota benchmark: the clients of crates/sluice-server/tests/token_quota.rs (a gcra
# policy of 10,000 tokens per 20 s per API key, reserving 1,000 tokens a request and settled
# on the OpenAI usage; answers of 20,000 tokens one and four at a time, of 8,000, of 20,000
# on the memory store, and an honest client at 800 to 1,500) run for DURATION_SECONDS instead
# of the test's 55, through `sluice serve` on a real redis-server, every window of each
# client's run checked against the bound of the README's "Settled cost".
#
#   scripts/bench-token-quota.sh [DURATION_SECONDS]
#
# DURATION_SECONDS defaults to 300. PROFILE (default release) is the cargo profile the test
# and `sluice` are built with. Prints the table (Markdown) on stdout: per row the answers
# (200), the 429s, the tokens delivered over the whole run against the bound and against the
# plain quota (capacity + rate x run), and the worst window of at most 5 s, 20 s and any
# length. Fails, printing the test's output, when a window went above its bound.
set -euo pipefail

DURATION=${1:-300}
PROFILE=${PROFILE:-release}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOG=$(mktemp /tmp/sluice-bench-token-quota-XXXXXX)
trap 'rm -f "$LOG"' EXIT

cd "$ROOT"
cargo test --profile "$PROFILE" -q -p sluice-server --test token_quota --no-run
echo "running the clients for $DURATION s (commit $(git rev-parse --short HEAD))" >&2
if ! SLUICE_TOKEN_QUOTA_SECS="$DURATION" CI=true cargo test --profile "$PROFILE" -q \
    -p sluice-server --test token_quota -- --exact \
    every_window_of_every_client_keeps_the_bound --nocapture > "$LOG" 2>&1; then
    cat "$LOG" >&2
    exit 1
fi
# The table and the gateways' counters, without the test harness's lines.
sed -n '/^Token quota:/,/^gateway on port/p' "$LOG"
grep '^gateway on port' "$LOG" | tail -n +2
