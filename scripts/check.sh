#!/usr/bin/env bash
# The checks a change must pass, in the order CI runs them (README's test
# command): formatting, clippy and rustdoc with warnings denied, then every
# test of the workspace. Lints and docs skip the PTX build (they read the
# host code; the release build of the tests makes the PTX and cubins).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "+ $*" >&2; "$@"; }
step cargo fmt --all -- --check
DOORBELL_SKIP_PTX=1 step cargo clippy --workspace --all-targets -- -D warnings
DOORBELL_SKIP_PTX=1 RUSTDOCFLAGS="-D warnings" step cargo doc --workspace --no-deps
step cargo test --workspace --release --no-fail-fast
