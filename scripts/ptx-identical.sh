#!/usr/bin/env bash
# Builds the test kernel crate (tests/kernels) to PTX at a base commit and in
# the working tree, without the trace feature, and compares them entry by
# entry; the call-sequence numbers and the names of anonymous constants
# (which carry source positions) are normalised away. The device trace's
# claim: a build without the `trace` feature is the PTX of the code without
# the hooks.
#   bash scripts/ptx-identical.sh <base-commit>
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/ptx-identical.sh <base-commit>}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/base" "$base"
build() { # repo target-dir
    (cd "$1" && RUSTC_BOOTSTRAP=1 cargo rustc -q --manifest-path tests/kernels/Cargo.toml --lib --release \
        --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core \
        --config 'profile.release.lto="fat"' --config 'profile.release.panic="abort"' \
        --config 'profile.release.codegen-units=1' --config 'profile.release.opt-level=3' \
        --config 'profile.release.debug=false' --config 'profile.release.incremental=false' \
        --target-dir "$2" -- -C target-cpu=sm_90 -C linker=true --emit=asm)
}
build "$work/base" "$work/t-base"
build "$PWD" "$work/t-head"
python3 - "$work/t-base/nvptx64-nvidia-cuda/release/deps/doorbell_test_kernels.s" \
    "$work/t-head/nvptx64-nvidia-cuda/release/deps/doorbell_test_kernels.s" <<'PY'
import re, sys
norm = lambda s: re.sub(r'anon_\$_[0-9a-f]+_\$_', 'anon_', re.sub(r'callseq \d+', 'callseq N', s))
a, b = (norm(open(p).read()) for p in sys.argv[1:3])
entries = lambda s: set(re.findall(r'\.visible \.entry (\w+)\(', s))
def body(s, e):
    i = s.find('.entry %s(' % e)
    return s[i:s.find('\n}\n', i)]
ea, eb = entries(a), entries(b)
differ = [e for e in sorted(ea & eb) if body(a, e) != body(b, e)]
print(f'entries: {len(ea)} at the base, {len(eb)} now; only one side: {sorted(ea ^ eb)}')
print(f'entries that differ: {len(differ)} {differ}')
print('identical' if a == b else 'DIFFERENT')
sys.exit(0 if a == b else 1)
PY
