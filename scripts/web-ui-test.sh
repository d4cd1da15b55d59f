#!/usr/bin/env bash
# The web page in headless Chromium (scripts/web-ui-test.py): installs Chromium when it
# is missing, builds the binary as the other tests build it, and runs the test, which
# also refreshes docs/web-ui-chat.png and docs/web-ui-engine.png. Under CI=true a browser
# that cannot be installed or started fails the test.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! CHROMIUM=$(bash scripts/install-chromium.sh); then
    if [ "${CI:-}" = true ]; then
        echo "web-ui-test: Chromium cannot be installed and CI=true: failing" >&2
        exit 1
    fi
    echo "web-ui-test: no Chromium: skipped" >&2
    exit 0
fi
cargo build --release --quiet --bin dcpserve ${DCPSERVE_CARGO_FEATURES:+--features "$DCPSERVE_CARGO_FEATURES"}
exec python3 scripts/web-ui-test.py --exe target/release/dcpserve --chromium "$CHROMIUM" "$@"
