#!/usr/bin/env bash
# Runs every check uniplane has, on a fresh machine or a developer's:
# installs the system packages the tests need when they are missing, then
# cargo fmt --check, clippy with -D warnings, and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use, as "command:package".
NEEDS=(
  "tshark:tshark"
  "pkg-config:pkg-config"
  "ip:iproute2"
  "nft:nftables"
  "dpdk-testpmd:dpdk-dev"
  "python3:python3"
  "verilator:verilator"
  "iverilog:iverilog"
  "yosys:yosys"
  "iperf3:iperf3"
  "sockperf:sockperf"
  "trafgen:netsniff-ng"
  "fc-list:fontconfig"
  "protoc:protobuf-compiler"
  "etcd:etcd-server"
  "openssl:openssl"
  "mpicc.openmpi:libopenmpi-dev"
  "mpirun.openmpi:openmpi-bin"
  "mpicc.mpich:libmpich-dev"
  "mpirun.mpich:mpich"
  "oshcc:libopenmpi-dev"
  "oshrun:openmpi-bin"
  "systemd-analyze:systemd"
  "systemd-nspawn:systemd-container"
)

missing=()
for need in "${NEEDS[@]}"; do
  cmd=${need%%:*} pkg=${need#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
# Libraries without a command: DPDK 22.11 and libclang for the dpdk
# feature's bindings (bindgen); the regex pipeline's OWASP Core Rule Set,
# Hyperscan (its hyperscan feature) and PCRE2 (its one-core baseline).
for pkg in libdpdk-dev libclang-dev modsecurity-crs libhyperscan-dev libpcre2-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages of the RTL unit testbenches (hw/tb: cocotb 1.x on Icarus;
# cocotb 2.x needs a newer Verilator than Debian's). Installed once.
if ! python3 -c 'import cocotb, pytest' >/dev/null 2>&1; then
  echo "==> installing cocotb and pytest"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  python3 -m pip install --quiet "cocotb>=1.8,<2" pytest 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "cocotb>=1.8,<2" pytest
fi

# Tests that need a system tool fail instead of skipping when it is absent.
export UNIPLANE_REQUIRE_TOOLS=1

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> cargo test"
# Tests that run an example program (the greeter across namespaces,
# uniplane-run's allreduce) find it built beside them: --all-targets
# builds examples only as test harnesses.
cargo build --workspace --examples
cargo test --workspace --all-targets
cargo test --workspace --doc
echo "==> the RTL plane: uniplane-services and uniplane-hw-sim with --features rtl"
cargo clippy -p uniplane-hw-sim -p uniplane-services --features uniplane-services/rtl --all-targets -- -D warnings
cargo test -p uniplane-hw-sim -p uniplane-services --features uniplane-services/rtl
echo "==> the RTL crossbar in uniplane-bench (hw, --features rtl)"
cargo clippy -p uniplane-bench --features rtl --all-targets -- -D warnings
cargo test -p uniplane-bench --features rtl --test hw
echo "==> uniplane-rpc with its tarpc transport (--features tarpc)"
cargo clippy -p uniplane-rpc --features tarpc --all-targets -- -D warnings
cargo test -p uniplane-rpc --features tarpc --test tarpc
echo "==> cargo test -p uniplane-dpdk --features dpdk (EAL on vdevs, no hugepages)"
cargo clippy -p uniplane-dpdk --features dpdk --all-targets -- -D warnings
cargo clippy -p uniplane-stacks --features dpdk -- -D warnings
cargo test -p uniplane-dpdk --features dpdk
cargo clippy -p uniplane-bench --features dpdk --all-targets -- -D warnings
cargo test -p uniplane-bench --features dpdk --test peer
echo "==> a daemon tunnel over DPDK ports (uniplane-services --features dpdk)"
cargo clippy -p uniplane-services --features dpdk --all-targets -- -D warnings
cargo test -p uniplane-services --features dpdk --test dpdk_tunnel
echo "==> GPU memory devices (uniplane-services --features gpu; the GPU tests show as ignored without a GPU)"
cargo clippy -p uniplane-services -p uniplane-bench --features uniplane-services/gpu,uniplane-bench/gpu --all-targets -- -D warnings
cargo test -p uniplane-services --features gpu --test gpu_memory
echo "==> the regex pipeline's Hyperscan engine (uniplane-kernel, regex-pipeline, bench: --features hyperscan)"
cargo clippy -p uniplane-kernel -p uniplane-regex-pipeline -p uniplane-bench \
  --features uniplane-kernel/hyperscan,uniplane-regex-pipeline/hyperscan,uniplane-bench/hyperscan \
  --all-targets -- -D warnings
cargo test -p uniplane-kernel -p uniplane-regex-pipeline \
  --features uniplane-kernel/hyperscan,uniplane-regex-pipeline/hyperscan
echo "==> the Debian package: build it, unpack it, run what it installs"
deb=$(scripts/package.sh | tail -n 1)
pkgroot=$(mktemp -d)
trap 'rm -rf "$pkgroot"' EXIT
dpkg -x "$deb" "$pkgroot"
"$pkgroot/usr/bin/uniplane" --version
"$pkgroot/usr/bin/uniplane-bench" --version
"$pkgroot/usr/bin/uniplaned" --check --config "$pkgroot/etc/uniplane/uniplaned.toml"
for f in lib/systemd/system/uniplaned.service usr/share/man/man8/uniplaned.8 \
  usr/share/man/man1/uniplane.1 usr/share/man/man1/uniplane-bench.1 \
  usr/share/bash-completion/completions/uniplane; do
  test -s "$pkgroot/$f" || { echo "the package lacks $f" >&2; exit 1; }
done
dpkg-deb --field "$deb" Package Version Depends
# The unit on a real systemd: verified, then started in a container.
scripts/systemd-unit.sh "$pkgroot"
