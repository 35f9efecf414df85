#!/usr/bin/env bash
# Nsight Compute on one dense block-FP8 GEMM at M = 4096 (default o_proj,
# 7168 x 16384): the own wgmma kernel (BM_Fp8LinearSm90) against cuBLASLt
# (BM_Fp8Linear dispatches M = 4096 to it), with tensor-pipe, shared-memory
# and stall figures. Runs on the GPU machine with .device-cuda.pack carried.
# Usage: scripts/device/ncu_dense_fp8.sh [M/N/K]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
shape=${1:-4096/7168/16384}
[ -f .device-cuda.pack/cuda.tgz ] && tar xzf .device-cuda.pack/cuda.tgz
d=$PWD/.device-cuda
cublas=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$d/lib:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}"
ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
metrics=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
metrics+=,sm__cycles_active.avg,gpc__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_bytes.sum
"$d/bench_fp8" --benchmark_filter="BM_CopyBandwidth|BM_Fp8LinearSm90/$shape/|BM_Fp8Linear/$shape/" \
  --benchmark_min_time=0.1 2>&1 | tee "$OUT/dense_bench.log" | tail -4
for which in "BM_Fp8LinearSm90" "BM_Fp8Linear"; do
  "$ncu" --clock-control none --cache-control none -k "regex:gemm|cutlass|xmma|nvjet" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --metrics "$metrics" \
    "$d/bench_fp8" --benchmark_filter="$which/$shape/" --benchmark_min_time=0.01 > "$OUT/ncu_$which.txt" 2>&1
  echo "== $which"
  grep -E "^  [a-zA-Z_].*\(|Duration|gmma|Throughput|wavefronts|bank_conflicts|cycles_active|per_second|bytes|Stall|Issued" \
    "$OUT/ncu_$which.txt" | head -45
done
# The own kernel's variants (bench_grouped_gemm BM_Sm90Fp8Gemm {m, n, k,
# overlapped, block_m, cluster_m}): every V3 shape, then o_proj in pairs
# under Nsight Compute.
if [ -n "${VARIANTS:-}" ]; then
  "$d/bench_grouped_gemm" --benchmark_filter='BM_Sm90Fp8Gemm' 2>&1 | grep -E "BM_|Benchmark" | tee "$OUT/dense_variants.log"
  "$ncu" --clock-control none --cache-control none -k "regex:sm90_gemm" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --metrics "$metrics" \
    "$d/bench_grouped_gemm" --benchmark_filter="BM_Sm90Fp8Gemm/4096/7168/16384/1/128/2/" --benchmark_min_time=0.01 \
    > "$OUT/ncu_pairs.txt" 2>&1
  grep -E "sm90_gemm_kernel|Duration|Throughput|wavefronts|cycles_active|per_second|bytes|Busy" "$OUT/ncu_pairs.txt" | head -30
fi
