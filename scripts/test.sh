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
)

missing=()
for need in "${NEEDS[@]}"; do
  cmd=${need%%:*} pkg=${need#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
# Libraries without a command: DPDK 22.11 and libclang for the dpdk
# feature's bindings (bindgen).
for pkg in libdpdk-dev libclang-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "==> installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Tests that need a system tool fail instead of skipping when it is absent.
export UNIPLANE_REQUIRE_TOOLS=1

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> cargo test"
cargo test --workspace --all-targets
cargo test --workspace --doc
echo "==> cargo test -p uniplane-dpdk --features dpdk (EAL on vdevs, no hugepages)"
cargo clippy -p uniplane-dpdk --features dpdk --all-targets -- -D warnings
cargo clippy -p uniplane-stacks --features dpdk -- -D warnings
cargo test -p uniplane-dpdk --features dpdk
