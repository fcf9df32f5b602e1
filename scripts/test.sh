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

# Disk. A fresh machine may have only a few GiB free, and every test
# binary links the whole daemon: about 150 of them at 60 MB each would
# take 9 GiB. So this script builds without debug information or symbols
# (a failing assertion still names its file and line), keeps no
# incremental state, lints into metadata it deletes before building,
# and builds and runs the test binaries a slice at a time, deleting each
# slice once it has run. Cargo rebuilds nothing it still needs: the
# libraries, build scripts, binaries and examples stay.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=false CARGO_PROFILE_DEV_STRIP=true
# The workspace as cargo describes it: its target directory and the test
# targets of its packages.
metadata=$(cargo metadata --format-version 1 --no-deps)
target=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$metadata")
deps="$target/debug/deps"
SLICE=12

# Drops the test executables that ran: the executables in deps/ that have
# one name only (a binary or an example has a second under target/debug/,
# where the tests that run it find it, and stays), proc-macro libraries
# (.so) apart.
drop_test_binaries() {
  [ -d "$deps" ] && find "$deps" -maxdepth 1 -type f -perm -u+x -links 1 ! -name "*.so" -delete
  return 0
}

# cargo test with these arguments, then its binaries dropped.
run_tests() {
  cargo test "$@"
  drop_test_binaries
}

# The integration tests of the named packages (of the workspace when
# none is named), one name a line; those that need features are run by
# their own stage below.
test_targets() {
  python3 -c '
import json, sys
want = set(sys.argv[1:])
names = set()
for p in json.load(sys.stdin)["packages"]:
    if want and p["name"] not in want:
        continue
    for t in p["targets"]:
        if "test" in t["kind"] and not t.get("required-features"):
            names.add(t["name"])
print("\n".join(sorted(names)))' "$@" <<<"$metadata"
}

# cargo test over every target of PACKAGES (a space-separated list, or
# "" for the workspace; the selection, and so the features, are the same
# for every slice), with the remaining arguments added, a slice at a time.
sliced_test() {
  local pkgs=$1 p i
  shift
  local sel=(--workspace)
  if [ -n "$pkgs" ]; then
    sel=()
    for p in $pkgs; do sel+=(-p "$p"); done
  fi
  run_tests "${sel[@]}" "$@" --lib --bins
  run_tests "${sel[@]}" "$@" --examples --benches
  local names
  # shellcheck disable=SC2086 # the list splits into package names
  mapfile -t names < <(test_targets $pkgs)
  for ((i = 0; i < ${#names[@]}; i += SLICE)); do
    local args=()
    for p in "${names[@]:i:SLICE}"; do args+=(--test "$p"); done
    run_tests "${sel[@]}" "$@" "${args[@]}"
  done
}

# A stage's banner, with the space left where the build goes (what to
# read first when a run on a small disk fails).
stage() {
  local d=$target
  [ -d "$d" ] || d=$(dirname "$d")
  echo "==> $* ($(df -h --output=avail "$d" | tail -n 1 | tr -d ' ') free)"
}

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy -D warnings: the workspace, then each feature set tested below"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p uniplane-hw-sim -p uniplane-services --features uniplane-services/rtl --all-targets -- -D warnings
cargo clippy -p uniplane-bench --features rtl --all-targets -- -D warnings
cargo clippy -p uniplane-rpc --features tarpc --all-targets -- -D warnings
cargo clippy -p uniplane-dpdk --features dpdk --all-targets -- -D warnings
cargo clippy -p uniplane-stacks --features dpdk -- -D warnings
cargo clippy -p uniplane-bench --features dpdk --all-targets -- -D warnings
cargo clippy -p uniplane-services --features dpdk --all-targets -- -D warnings
cargo clippy -p uniplane-services -p uniplane-bench --features uniplane-services/gpu,uniplane-bench/gpu --all-targets -- -D warnings
cargo clippy -p uniplane-kernel -p uniplane-regex-pipeline -p uniplane-bench \
  --features uniplane-kernel/hyperscan,uniplane-regex-pipeline/hyperscan,uniplane-bench/hyperscan \
  --all-targets -- -D warnings
# Lint-only metadata (an .rmeta without its .rlib) is never read by a build.
if [ -d "$deps" ]; then
  for f in "$deps"/*.rmeta; do
    [ -e "${f%.rmeta}.rlib" ] || rm -f "$f"
  done
fi

stage "cargo test"
# Tests that run a binary or an example program (the daemon, the greeter
# across namespaces, uniplane-run's allreduce) find it built beside them.
cargo build --workspace --bins --examples
sliced_test ""
cargo test --workspace --doc
# The example programs were for the tests above; no later stage runs one.
rm -rf "$target/debug/examples"
stage "the RTL plane: uniplane-services and uniplane-hw-sim with --features rtl"
sliced_test "uniplane-hw-sim uniplane-services" --features uniplane-services/rtl
stage "the RTL crossbar in uniplane-bench (hw, --features rtl)"
run_tests -p uniplane-bench --features rtl --test hw
stage "uniplane-rpc with its tarpc transport (--features tarpc)"
run_tests -p uniplane-rpc --features tarpc --test tarpc
stage "cargo test -p uniplane-dpdk --features dpdk (EAL on vdevs, no hugepages)"
run_tests -p uniplane-dpdk --features dpdk
run_tests -p uniplane-bench --features dpdk --test peer
stage "a daemon tunnel over DPDK ports (uniplane-services --features dpdk)"
run_tests -p uniplane-services --features dpdk --test dpdk_tunnel
stage "GPU memory devices (uniplane-services --features gpu; the GPU tests show as ignored without a GPU)"
run_tests -p uniplane-services --features gpu --test gpu_memory
stage "the regex pipeline's Hyperscan engine (uniplane-kernel, regex-pipeline, bench: --features hyperscan)"
run_tests -p uniplane-kernel -p uniplane-regex-pipeline \
  --features uniplane-kernel/hyperscan,uniplane-regex-pipeline/hyperscan
# The package is a release build; the debug tree is done with. On a
# short disk it goes first (a developer's machine with room keeps it).
if [ "$(df --output=avail -k "$target" | tail -n 1)" -lt $((8 * 1024 * 1024)) ]; then
  echo "==> less than 8 GiB free: removing $target/debug before the release build"
  rm -rf "$target/debug"
fi
stage "the Debian package: build it, unpack it, run what it installs"
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
