#!/usr/bin/env bash
# Builds a kernel crate (default: the test kernels, tests/kernels) to PTX at a
# base commit and in the working tree, without the trace feature, and
# compares them entry by entry; the call-sequence numbers and the names of
# anonymous constants (which carry source positions) are normalised away.
# Used for the device trace's claim (a build without the `trace` feature is
# the PTX of the code without the hooks) and for refactors of device code
# that must not change it (e.g. `softnic`: the soft NIC's engine kernel).
#   bash scripts/ptx-identical.sh <base-commit> [crate-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/ptx-identical.sh <base-commit> [crate-dir]}
crate=${2:-tests/kernels}
if [ ! -f "$crate/Cargo.toml" ]; then
    echo "ptx-identical.sh: $crate is not a crate (no $crate/Cargo.toml); give a kernel crate's directory, e.g. tests/kernels or softnic" >&2
    exit 2
fi
lib=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$crate/Cargo.toml" | head -n1 | tr - _)
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/base" "$base"
build() { # repo target-dir
    (cd "$1" && RUSTC_BOOTSTRAP=1 cargo rustc -q --manifest-path "$crate/Cargo.toml" --lib --release \
        --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core \
        --config 'profile.release.lto="fat"' --config 'profile.release.panic="abort"' \
        --config 'profile.release.codegen-units=1' --config 'profile.release.opt-level=3' \
        --config 'profile.release.debug=false' --config 'profile.release.incremental=false' \
        --target-dir "$2" -- -C target-cpu=sm_90 -C linker=true --emit=asm)
}
build "$work/base" "$work/t-base"
build "$PWD" "$work/t-head"
python3 - "$work/t-base/nvptx64-nvidia-cuda/release/deps/$lib.s" \
    "$work/t-head/nvptx64-nvidia-cuda/release/deps/$lib.s" <<'PY'
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
if a != b:
    import difflib
    d = list(difflib.unified_diff(a.splitlines(), b.splitlines(), 'base', 'now', n=2, lineterm=''))
    print('\n'.join(d[:60]) + (f'\n... {len(d) - 60} more diff lines' if len(d) > 60 else ''))
sys.exit(0 if a == b else 1)
PY
