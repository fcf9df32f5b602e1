#!/usr/bin/env bash
# Checks the packaged systemd unit on a real systemd: `systemd-analyze
# verify` of uniplaned.service as the package installs it, then a boot of
# systemd (PID 1 of its own container, systemd-nspawn) on the host's /usr
# with the unpacked package laid over it, which starts uniplaned.service
# (Type=notify: it is active only once the daemon said READY=1), asks it
# `uniplane status`, reloads and stops it, and powers off.
#
#   scripts/systemd-unit.sh PKGROOT     # PKGROOT: the .deb unpacked by dpkg -x
#
# Nothing of the host changes: the container's root and /etc are a tmpfs,
# /usr is the host's read-only with the package's files over it, it has a
# network namespace of its own (loopback only), its cgroups live under a
# cgroup made for this run and removed after it, and the whole boot is
# bounded by a timeout. Without root or systemd-nspawn the boot is skipped
# with a message (scripts/test.sh installs systemd-container).
set -euo pipefail

root=$(realpath "${1:?usage: $0 PKGROOT}")
unit=lib/systemd/system/uniplaned.service
test -s "$root/$unit" || { echo "no $unit under $root" >&2; exit 1; }
work=$(mktemp -d)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

echo "==> systemd-analyze verify $unit"
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not installed (apt package systemd): skipping the unit checks"
  exit 0
fi
# A root with the package, systemd's own units (sysinit.target …) and the
# commands the unit names, so verify checks the paths the package installs.
verify="$work/verify"
mkdir -p "$verify/usr/lib/systemd/system" "$verify/bin"
cp -a "$root/." "$verify/"
cp -a /usr/lib/systemd/system/. "$verify/usr/lib/systemd/system/"
cp /bin/kill "$verify/bin/kill"
# verify exits 0 on warnings (an unknown key, a bad value): any output fails.
if ! out=$(systemd-analyze verify --man=no --root="$verify" uniplaned.service 2>&1) ||
  [ -n "$out" ]; then
  echo "systemd-analyze verify refuses the unit:" >&2
  echo "$out" >&2
  exit 1
fi
echo "the unit verifies"

echo "==> uniplaned.service started by systemd in a container"
if [ "$(id -u)" -ne 0 ] || ! command -v systemd-nspawn >/dev/null 2>&1; then
  echo "needs root and systemd-nspawn (apt package systemd-container): skipping the boot"
  exit 0
fi
out="$work/out"
units="$work/units/systemd/system"
mkdir -p "$out" "$units"
cat >"$units/uniplane-check.service" <<'EOF'
[Unit]
Description=ask the packaged uniplaned for its status, reload and stop it, power off
Wants=uniplaned.service
After=uniplaned.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c '\
  /usr/bin/uniplane status >/out/status.txt 2>&1; echo $? >/out/status.rc; \
  /usr/bin/uniplane top --once >/out/top.txt 2>&1; echo $? >/out/top.rc; \
  /usr/bin/bash /out/metrics.sh >/out/metrics.txt 2>&1; echo $? >/out/metrics.rc; \
  systemctl show -p Type,ActiveState,SubState uniplaned >/out/started.txt; \
  systemctl reload uniplaned; echo $? >/out/reload.rc; \
  systemctl stop uniplaned; systemctl show -p ActiveState,Result uniplaned >/out/stopped.txt'
ExecStartPost=/bin/systemctl poweroff --no-block
EOF

# The metrics endpoint the packaged configuration names, fetched with
# bash alone (no HTTP client is needed in the container).
metrics_at=$(sed -n 's/^metrics *= *"\([0-9.]*\):\([0-9]*\)".*/\1 \2/p' "$root/etc/uniplane/uniplaned.toml")
[ -n "$metrics_at" ] || { echo "the packaged configuration names no metrics endpoint" >&2; exit 1; }
read -r metrics_host metrics_port <<<"$metrics_at"
cat >"$out/metrics.sh" <<EOF
exec 3<>/dev/tcp/$metrics_host/$metrics_port
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
cat <&3
EOF

# The container's network is loopback only: waiting for it to be "online"
# (the unit wants network-online.target) would never end, so that wait is
# masked there, and so is the host's firewall unit (nothing to load).

# The cgroup hierarchies nspawn writes to: a cgroup of this run in each.
if [ -e /sys/fs/cgroup/cgroup.procs ]; then
  hierarchies=(/sys/fs/cgroup)
else
  hierarchies=()
  for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
    [ -e "$h/cgroup.procs" ] && hierarchies+=("$h")
  done
fi
name="uniplane-unit-$$"
had_nspawn_root=$([ -d /run/systemd/nspawn-root ] && echo yes || echo no)
cleanup() {
  for h in "${hierarchies[@]}"; do
    [ -d "$h/$name" ] && find "$h/$name" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  rmdir "/run/systemd/nspawn/propagate/$name" /run/systemd/nspawn/propagate \
    /run/systemd/nspawn 2>/dev/null || true
  [ "$had_nspawn_root" = yes ] || rmdir /run/systemd/nspawn-root 2>/dev/null || true
  rm -rf "$work"
}
for h in "${hierarchies[@]}"; do mkdir -p "$h/$name"; done
start=$(date +%s)
set +e
(
  for h in "${hierarchies[@]}"; do echo "$BASHPID" >"$h/$name/cgroup.procs"; done
  exec timeout -k 10 90 systemd-nspawn --quiet --register=no --keep-unit \
    --machine="$name" --private-network --directory=/ --volatile=yes \
    --overlay-ro="/usr:$root/usr:/usr" \
    --overlay-ro="/usr/lib:$root/lib:$work/units:/usr/lib" \
    --bind-ro="$root/etc/uniplane:/etc/uniplane" \
    --bind="$out:/out" \
    --boot -- systemd.unit=uniplane-check.service systemd.firstboot=off \
    systemd.mask=systemd-networkd-wait-online.service systemd.mask=nftables.service
) >"$work/boot.log" 2>&1
rc=$?
set -e
# Back out of the run's cgroups so they can go.
for h in "${hierarchies[@]}"; do echo $$ >"$h/cgroup.procs" 2>/dev/null || true; done
fail() {
  echo "$1" >&2
  sed 's/\x1b\[[0-9;]*m//g' "$work/boot.log" | tail -n 40 >&2
  for f in "$out"/*; do [ -e "$f" ] && { echo "--- $(basename "$f")"; cat "$f"; } >&2; done
  exit 1
}
[ "$rc" -eq 0 ] || fail "the container did not power off by itself (exit $rc)"
[ "$(cat "$out/status.rc" 2>/dev/null)" = 0 ] || fail "uniplane status failed in the container"
grep -q '^server ' "$out/status.txt" || fail "uniplane status did not name the server"
for want in Type=notify ActiveState=active SubState=running; do
  grep -qx "$want" "$out/started.txt" || fail "uniplaned.service: want $want"
done
[ "$(cat "$out/top.rc" 2>/dev/null)" = 0 ] || fail "uniplane top --once failed in the container"
grep -qi 'ports' "$out/top.txt" || fail "uniplane top showed no ports"
[ "$(cat "$out/metrics.rc" 2>/dev/null)" = 0 ] || fail "the metrics endpoint did not answer"
grep -qE '^HTTP/1\.[01] 200' "$out/metrics.txt" || fail "the metrics endpoint did not answer 200"
grep -q '^uniplane_' "$out/metrics.txt" || fail "the metrics endpoint served no uniplane metric"
[ "$(cat "$out/reload.rc")" = 0 ] || fail "systemctl reload uniplaned failed"
for want in ActiveState=inactive Result=success; do
  grep -qx "$want" "$out/stopped.txt" || fail "stopped uniplaned.service: want $want"
done
echo "systemd started uniplaned.service (Type=notify), uniplane status, top and the metrics endpoint answered," \
  "reload and stop succeeded ($(($(date +%s) - start)) s)"
