#!/usr/bin/env bash
# Runs doorbell's ConnectX (mlx5 DevX) checks on a machine with a NIC and a GPU:
#  1. tests/tests/nic_hw.rs (ignored elsewhere): loopback RC RDMA write posted
#     and polled by the GPU, GPU memory registration, and the IBGDA transport
#     set up by a communicator (two ranks on GPU 0) running put, get, signal
#     add (an RDMA atomic), waits and barriers from the GPU through the port,
#     and the same ring over the CPU proxy (a host thread posting the WQEs);
#  2. the IBGDA examples with DOORBELL_NIC=mlx5 (no fallback to the soft NIC):
#     pingpong --transport ibgda in two processes, ibgda_bench (put_signal round
#     trip, puts, post rate), allreduce --transport ibgda, embedding_exchange
#     --transport ibgda.
#
#   scripts/run-nic-tests.sh mlx5_0        # or mlx5_0:1; or DOORBELL_TEST_NIC=mlx5_0
#
# The port is also given to the examples as DOORBELL_IB_HCA (exact match), so
# every run uses the same one. Exits non-zero if any step fails; a summary of
# every step is printed at the end.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

nic="${1:-${DOORBELL_TEST_NIC:-}}"
if [ -z "$nic" ]; then
    echo "usage: $0 <device[:port]>   (e.g. mlx5_0, or set DOORBELL_TEST_NIC)" >&2
    echo "RDMA devices here: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')" >&2
    exit 2
fi
if [ ! -d "/sys/class/infiniband/${nic%%:*}" ]; then
    echo "$0: no RDMA device ${nic%%:*} (have: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' '))" >&2
    exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$0: no NVIDIA GPU (nvidia-smi -L fails)" >&2
    exit 2
fi

export DOORBELL_TEST_NIC="$nic"
export DOORBELL_NIC=mlx5
export DOORBELL_IB_HCA="=$nic"

results=()
failed=0
step() {
    local name="$1"; shift
    echo
    echo "=== $name: $*"
    if "$@"; then
        results+=("ok    $name")
    else
        results+=("FAIL  $name (exit $?)")
        failed=1
    fi
}

step "nic_hw tests" cargo test --release -p doorbell-tests --test nic_hw -- --ignored --test-threads=1

# Two processes on this host, each its own rank, over the NIC (CUDA IPC maps
# the heaps too, but --transport ibgda sends every byte through the port).
two_processes() {
    local token
    token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    DOORBELL_TOKEN=$token MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517} WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 \
        "$@" & local p0=$!
    DOORBELL_TOKEN=$token MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517} WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 \
        "$@"; local r1=$?
    wait "$p0"; local r0=$?
    [ "$r0" = 0 ] && [ "$r1" = 0 ]
}

if cargo build --release -p doorbell-examples --example ibgda_bench --example allreduce --example embedding_exchange --example pingpong; then
    ex="$here/target/release/examples"
    step "pingpong --transport ibgda, two processes" two_processes "$ex/pingpong" --device gpu --transport ibgda
    step "ibgda_bench" "$ex/ibgda_bench" --device gpu --maxbytes 67108864 --out "${TMPDIR:-/tmp}"
    step "allreduce --transport ibgda" "$ex/allreduce" --device gpu --transport ibgda
    step "embedding_exchange --transport ibgda" "$ex/embedding_exchange" --device gpu --transport ibgda
else
    results+=("FAIL  building the examples")
    failed=1
fi

echo
echo "=== summary (DOORBELL_NIC=mlx5, port $nic)"
printf '%s\n' "${results[@]}"
exit "$failed"
