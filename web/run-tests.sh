#!/usr/bin/env bash
# The browser suite: builds sluice-wasm and the gateway (`sluice`, which embeds the module and
# serves web/ itself), installs the pinned npm packages, runs web/tests/ against the gateway.
#
#   bash web/run-tests.sh                        # from anywhere
#   CI=true bash web/run-tests.sh                # nothing may be skipped: a missing browser is an error
#   SLUICE_PROFILE=release bash web/run-tests.sh # test the release build of the gateway
#
# Needs: cargo with the wasm32-unknown-unknown target, node >= 20 with npm, and Debian's
# chromium at /usr/bin/chromium (or SLUICE_CHROMIUM). Installed here when missing and root.
set -euo pipefail

web="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$web/.." && pwd)"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi
(cd "$root" && cargo build -p sluice-wasm --target wasm32-unknown-unknown --release)
# The gateway the browser tests run against: the debug build by default (the one `cargo test`
# has just built in scripts/test, so nothing is compiled twice).
profile="${SLUICE_PROFILE:-debug}"
if [ "$profile" = release ]; then
  (cd "$root" && cargo build -p sluice-server --bin sluice --release)
else
  (cd "$root" && cargo build -p sluice-server --bin sluice)
fi
export SLUICE_BIN="${CARGO_TARGET_DIR:-$root/target}/$profile/sluice"

chromium="${SLUICE_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  if [ ! -x "$chromium" ]; then
    echo "run-tests.sh: no chromium at $chromium (install Debian's chromium or set SLUICE_CHROMIUM)" >&2
    exit 1
  fi
fi

cd "$web"
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi

# One file at a time: the browser tests measure real time and must not share two cores.
exec node --test --test-concurrency=1 "$web/tests/"
