#!/usr/bin/env bash
# The 8-GPU comparison against NCCL (one rank per GPU, P2P over
# NVLink/NVSwitch, NVLink multicast off), from binaries bundled here with
#   bash scripts/gpu-bundle.sh
# and carried to an 8-GPU machine. Usage there, from the repository root:
#   bash scripts/run-8gpu.sh OUT_DIR
# Writes, per benchmark, the printed table (.txt) and the JSON and plots
# into OUT_DIR. Every run checks its results against the CPU reference.
set -uo pipefail
out=${1:?usage: run-8gpu.sh OUT_DIR}
b=target/gpu-bundle
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt 8 ]; then
    echo "run-8gpu.sh: this machine has $gpus GPU(s); the comparison needs 8" >&2
    exit 2
fi
export DOORBELL_RANK_PER_GPU=1 DOORBELL_LOG=warn NCCL_NVLS_ENABLE=0
status=0
run() {
    local name=$1
    shift
    mkdir -p "$out/$name"
    echo "=== $name: $*"
    "$@" --out "$out/$name" 2>&1 | tee "$out/$name/out.txt" || status=1
}
# All-reduce, 8 B .. 4 GiB: the plain all-reduce and NCCL on the same buffers.
run allreduce_h200x8_plain "$b/allreduce" --device gpu --bench --ranks 8 --compute none --max-bytes 4294967296
# Fused compute + all-reduce vs the producer followed by NCCL, end to end.
run allreduce_h200x8_gemv "$b/allreduce" --device gpu --bench --ranks 8 --compute gemv --max-bytes 4294967296
# Embedding exchange vs the NCCL all-to-all pipeline, DLRM-like shape, batch 512..8192.
run embedding_h200x8 "$b/embedding_exchange" --device gpu --bench --ranks 8
exit $status
