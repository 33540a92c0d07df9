#!/usr/bin/env bash
# One-time (idempotent) set-up of a Debian 12 machine for doorbell:
#  - Debian's rustc-web 1.96 + cargo-web + rust-web-src (+ rustfmt-web, rust-web-clippy for
#    scripts/check.sh): the compiler for host
#    AND device code (its core source is what -Zbuild-std needs for nvptx64);
#  - libibverbs-dev: rdma-core headers for the mlx5 reference shim in tests;
#  - ibverbs-providers: libmlx5 (mlx5 direct verbs and DevX) at run time;
#  - linux-headers-<newest>-common: include/linux/mlx5/mlx5_ifc.h, the PRM
#    layouts rdma-sys-ext's DevX command builders are checked against;
#  - ptxas from the PyPI wheel nvidia-cuda-nvcc-cu12, for PTX validation;
#  - links the Debian toolchain into rustup as `doorbell-web`, the name
#    rust-toolchain.toml pins.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

pkgs=(rustc-web cargo-web rust-web-src rustfmt-web rust-web-clippy libibverbs-dev ibverbs-providers gcc)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
have_ifc=0
ls /usr/src/linux-headers-*/include/linux/mlx5/mlx5_ifc.h >/dev/null 2>&1 && have_ifc=1

if [ ${#missing[@]} -gt 0 ] || [ "$have_ifc" = 0 ]; then
    # Fresh package lists first: a package picked from stale lists (the
    # newest linux-headers of last month) may be gone from the mirror.
    $SUDO apt-get update -qq
    # One linux-headers-*-common package for mlx5_ifc.h: any one already
    # installed will do; otherwise the newest non-realtime one apt knows.
    if [ "$have_ifc" = 0 ]; then
        hdr=$(apt-cache search --names-only '^linux-headers-.*-common$' \
            | awk '{print $1}' | grep -v -- '-rt' | sort -V | tail -n 1 || true)
        if [ -z "$hdr" ]; then
            echo "setup: apt lists no linux-headers-*-common package (needed for mlx5_ifc.h)" >&2
            exit 1
        fi
        missing+=("$hdr")
    fi
    echo "setup: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# rustc-web must be the 1.96 build (bookworm-security); 1.85 lacks what we use.
ver=$(/usr/bin/rustc --version | awk '{print $2}')
case "$ver" in
    1.9[6-9]*|1.[1-9][0-9][0-9]*) ;;
    *) echo "setup: /usr/bin/rustc is $ver; need >= 1.96 (Debian bookworm-security rustc-web)" >&2; exit 1 ;;
esac

if ! python3 -c "import nvidia, os, sys; sys.exit(0 if os.path.exists(os.path.join(list(nvidia.__path__)[0], 'cuda_nvcc/bin/ptxas')) else 1)" 2>/dev/null; then
    echo "setup: installing ptxas (PyPI nvidia-cuda-nvcc-cu12)"
    python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc-cu12
fi

if command -v rustup >/dev/null 2>&1; then
    if ! rustup toolchain list | grep -q '^doorbell-web'; then
        rustup toolchain link doorbell-web /usr
    fi
else
    echo "setup: no rustup; use /usr/bin/cargo directly (rust-toolchain.toml is ignored without rustup)"
fi
echo "setup: ok ($(/usr/bin/rustc --version))"
