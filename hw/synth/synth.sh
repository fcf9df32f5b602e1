#!/usr/bin/env bash
# Synthesizes uniplane's RTL with yosys and prints, per module, for 4 and 8
# ports: generic gate cells and flip-flops (`synth`, except that the wide
# FIFO memories -- VOQs, data FIFOs -- stay memory blocks, counted in
# fifo_mems, as they would be SRAM or BRAM), and from `synth_xilinx` (LUT6
# fabric, memories to LUTRAM/BRAM) the LUTs, flip-flops and RAM primitives.
# Usage: hw/synth/synth.sh [out-dir]   (about half an hour on one core;
# ONLY="top_n4 ..." runs some configurations; defaults need no chparam)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rtl="$here/../rtl"
out=${1:-$(mktemp -d)}
mkdir -p "$out"
command -v yosys >/dev/null || { echo "yosys is not installed (apt-get install yosys)" >&2; exit 1; }

# name | top module | parameters
configs=(
  "sched_n4|up_sched|N=4"
  "sched_n8|up_sched|N=8"
  "arb_mux_n4|up_arb_mux|N=4"
  "fwd_table_e32|up_fwd_table|E=32"
  "acl_c16_r8|up_acl|C=16 R=8"
  "connector_n4|up_connector|N=4"
  "crossbar_n4|up_crossbar|N=4 DEPTH=32"
  "crossbar_n4_islip|up_crossbar|N=4 DEPTH=32 MATCH=1"
  "crossbar_n4_islip2|up_crossbar|N=4 DEPTH=32 MATCH=1 ITER=2 PORTS=2"
  "crossbar_n8|up_crossbar|N=8 DEPTH=32"
  "underlay_m2|up_underlay|"
  "top_n4|uniplane_top|"
  "top_n8|uniplane_top|N=8"
  "kernel_echo|up_kernel_echo|"
  "kernel_sum32|up_kernel_sum32|"
)

count() { # file cell-regex
  awk -v re="$2" '$0 ~ re { s += $2 } END { print s + 0 }' "$1"
}

printf "%-14s %10s %10s %10s %10s %10s %10s\n" module cells dff fifo_mems luts ffs ram_prims
for c in "${configs[@]}"; do
  IFS='|' read -r name top params <<<"$c"
  # ONLY="name ..." limits the run to some configurations.
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  chp=""
  for p in $params; do chp+="chparam -set ${p%%=*} ${p#*=} $top; "; done
  read_src="read_verilog -I$rtl $(ls "$rtl"/*.v "$rtl"/kernels/*.v | tr '\n' ' '); $chp hierarchy -top $top;"
  yosys -q -l "$out/$name.generic.log" -p "$read_src synth -top $top -flatten -run begin:fine; select -set fifos t:\\\$mem_v2 r:WIDTH>200 %i; memory_map @fifos %n; opt -fast -full; techmap; opt -fast; abc -fast; opt -fast; tee -o $out/$name.generic.stat stat" >/dev/null 2>&1
  yosys -q -l "$out/$name.xilinx.log" -p "$read_src synth_xilinx -top $top -flatten; tee -o $out/$name.xilinx.stat stat" >/dev/null 2>&1
  g="$out/$name.generic.stat"; x="$out/$name.xilinx.stat"
  cells=$(awk '/Number of cells:/ { n = $4 } END { print n + 0 }' "$g")
  dff=$(count "$g" '^ +\$_.*DFF')
  luts=$(count "$x" '^ +LUT[1-6] ')
  ffs=$(count "$x" '^ +FD[RSCE]+ ')
  mem=$(count "$x" '^ +(RAM|RAMB)')
  bits=$(count "$g" '^ +\\$mem_v2 ')
  printf "%-14s %10s %10s %10s %10s %10s %10s\n" "$name" "$cells" "$dff" "$bits" "$luts" "$ffs" "$mem"
done
