#!/usr/bin/env bash
# Nsight Compute's per-instruction view of one kernel launch: executions and
# warp-stall samples for every SASS instruction, as CSV in $OUT/sass.csv
# (scripts/sass_profile.py summarizes it on the development VM). Runs on the
# GPU machine with .device-cuda.pack carried.
# Usage: scripts/device/ncu_sass.sh <binary in .device-cuda> <kernel regex> [binary args...]
# e.g. ncu_sass.sh bench_grouped_gemm sm90_gemm --benchmark_filter='BM_Sm90Fp8Gemm/4096/7168/16384/0/128/1/192/'
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bin=$1 kernel=$2
shift 2
[ -f .device-cuda.pack/cuda.tgz ] && tar xzf .device-cuda.pack/cuda.tgz
d=$PWD/.device-cuda
cublas=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$d/lib:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}"
ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
# The fourth launch: the benchmarks' warm-up runs come first.
"$ncu" --clock-control none --cache-control none -k "regex:$kernel" --launch-skip ${NCU_SKIP:-3} --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no -f -o /tmp/sass_rep \
  "$d/$bin" "$@" > "$OUT/ncu_sass.log" 2>&1
echo "ncu: rc=$?"
grep -E "Duration|Throughput|Warp Cycles Per Issued" "$OUT/ncu_sass.log" | head -12
"$ncu" --import /tmp/sass_rep.ncu-rep --page source --csv --print-source sass > "$OUT/sass.csv"
echo "sass page: rc=$? $(wc -l < "$OUT/sass.csv") lines"
