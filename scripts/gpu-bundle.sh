#!/usr/bin/env bash
# Builds the test binaries and examples here and gathers them, stripped, in
# target/gpu-bundle/ for a GPU machine that has no Rust toolchain:
#   bash scripts/gpu-bundle.sh [test ...]      # default: every behaviour test
# then, on the GPU machine, from the repository root:
#   bash target/gpu-bundle/run-tests.sh        # tests/*, with DOORBELL_TEST_REQUIRE_GPU=1
#   target/gpu-bundle/p2p_bench --device gpu   # or any example (ibgda_bench: IBGDA over the soft NIC)
#   target/gpu-bundle/doorbell doctor          # what the machine offers doorbell, and what is wrong
set -euo pipefail
cd "$(dirname "$0")/.."
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(comm contract kernels user_kernels typed launch_family wqe_bytes wqe_cq wqe_post wqe_bench comm_procs hardening ibgda ibgda_engine ibgda_copy_order nic_select proxy)
    for t in allreduce embedding; do [ -f "tests/tests/$t.rs" ] && tests+=("$t"); done
fi
examples=(fma pingpong p2p_bench histogram ibgda_bench fused proxy_bench)
for e in allreduce embedding_exchange; do grep -q "name = \"$e\"" examples/Cargo.toml && examples+=("$e"); done
# Cubins for sm_90 next to the PTX (no driver compile on the GPU machine):
# the build takes ptxas from DOORBELL_PTXAS, the PATH or CUDA_HOME; else the
# PyPI wheel's that scripts/setup.sh installs.
if [ -z "${DOORBELL_PTXAS:-}" ] && ! command -v ptxas > /dev/null; then
    wheel=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cuda_nvcc/bin/ptxas'))" 2>/dev/null || true)
    if [ -n "$wheel" ] && [ -x "$wheel" ]; then export DOORBELL_PTXAS="$wheel"; fi
fi
out=target/gpu-bundle
rm -rf "$out" && mkdir -p "$out/tests"
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test --release -p doorbell-tests --features gpu "${args[@]}" --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do strip -o "$out/tests/$name" "$exe"; done
for e in "${examples[@]}"; do
    cargo build --release --example "$e" -q
    strip -o "$out/$e" "target/release/examples/$e"
done
cargo build --release -p doorbell --bin doorbell -q
strip -o "$out/doorbell" target/release/doorbell
cat > "$out/run-tests.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary on the GPU (a missing GPU fails them),
# each under its own time limit; prints every test's line and the summary.
cd "$(dirname "$0")/tests"
export DOORBELL_TEST_REQUIRE_GPU=1
# Two-GPU tests fail on a machine of two or more GPUs that cannot run them.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then export DOORBELL_TEST_REQUIRE_GPUS=2; fi
status=0
for t in TESTS; do
    echo "=== $t"
    # The GPU halves of a binary take turns (`gpu_turn`); TEST_THREADS=1
    # runs one test at a time, so that each test's time is its own.
    timeout "${TEST_TIMEOUT_S:-240}" ./"$t" ${TEST_THREADS:+--test-threads=$TEST_THREADS} > "$t.log" 2>&1
    rc=$?
    grep -E "^test |test result|FAILED|error" "$t.log"
    # A failure's message is on the lines after "panicked".
    grep -A8 "panicked" "$t.log"
    [ $rc = 0 ] || { echo "=== $t exited $rc"; status=1; }
done
exit $status
RUN
sed -i "s/TESTS/${tests[*]}/" "$out/run-tests.sh"
chmod +x "$out/run-tests.sh"
du -sh "$out"
