#!/usr/bin/env bash
# Builds the Debian package `uniplane`: uniplaned, uniplane and
# uniplane-bench, the systemd unit, /etc/uniplane/uniplaned.toml, manual
# pages and shell completions generated from the binaries' own clap
# definitions. Installs cargo-deb when it is missing. Prints the path of
# the .deb on its last line.
#
#   scripts/package.sh            # release build into target/debian/
#   sudo apt-get install ./target/debian/uniplane_*.deb
#   sudo systemctl enable --now uniplaned && uniplane status
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "==> installing cargo-deb" >&2
  cargo install cargo-deb --locked --quiet
fi

target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
echo "==> building uniplaned, uniplane and uniplane-bench (release)" >&2
cargo build --release --quiet -p uniplane-services -p uniplane-bench --bins

manual="$target/release/manual"
rm -rf "$manual"
"$target/release/uniplaned" --generate-manual "$manual"
"$target/release/uniplane" generate-manual "$manual"
"$target/release/uniplane-bench" generate-manual "$manual"

mkdir -p "$target/debian"
cargo deb -p uniplane-services --no-build --quiet --output "$target/debian/"
ls -t "$target"/debian/uniplane_*.deb | head -n 1
