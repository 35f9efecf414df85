#!/usr/bin/env bash
# FP8 kernels on the GPU machine in one device call (issue 6).
#   here:   scripts/device/fp8.sh pack [build-dir]   (default build-fp8)
#   device: scripts/device/fp8.sh run                (carry: [".device-fp8"])
# `run` writes to $OUT: device.txt, tests.log (the FP8 GPU tests with their
# relative L2 errors), sass.txt (tensor-core instructions of the FP8
# kernels), bench.log (bench_fp8), sanitize.log (memcheck over a subset).
set -uo pipefail
cd "$(dirname "$0")/../.."
dest=.device-fp8
case ${1:-} in
  pack)
    set -e
    build=${2:-build-fp8}
    rm -rf "$dest" && mkdir -p "$dest/lib"
    grep -qx "/$dest/" .git/info/exclude 2>/dev/null || echo "/$dest/" >> .git/info/exclude
    cp "$build/test_cuda" "$build/bench_fp8" "$dest/"
    strip --strip-debug "$dest/test_cuda" "$dest/bench_fp8"  # the call carries 64 MiB at most
    for b in "$dest/test_cuda" "$dest/bench_fp8"; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u |
      grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|libcuda|libcublas|libcudart' |
      while read -r lib; do cp -L "$lib" "$dest/lib/"; done
    du -sh "$dest"
    ;;
  run)
    OUT=${OUT:-/tmp/out}
    mkdir -p "$OUT"
    dir=$PWD/$dest
    cublas=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    export LD_LIBRARY_PATH="$dir/lib:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}"
    { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
      echo "cublasLt: $cublas"; } | tee "$OUT/device.txt"
    timeout 60 "$dir/test_cuda" --gtest_filter='*Fp8*' 2>&1 | tee "$OUT/tests.log"
    echo "tests rc=${PIPESTATUS[0]}" | tee -a "$OUT/tests.log"
    objdump_bin=$(command -v cuobjdump || find /usr/local -name cuobjdump -type f 2>/dev/null | head -1)
    if [ -n "$objdump_bin" ]; then
      "$objdump_bin" -sass "$dir/test_cuda" 2>/dev/null |
        awk '/Function :/{f=$3} /MMA/{for(i=1;i<=NF;i++) if($i ~ /MMA/){print f, $i; break}}' |
        grep -i fp8 | sort | uniq -c | sort -rn > "$OUT/sass.txt"
      cat "$OUT/sass.txt"
    fi
    timeout 170 "$dir/bench_fp8" --benchmark_min_warmup_time=0.02 --benchmark_counters_tabular=true 2>&1 |
      tee "$OUT/bench.log"
    echo "bench rc=${PIPESTATUS[0]}"
    san=$(command -v compute-sanitizer || find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)
    if [ -n "$san" ]; then
      timeout 40 "$san" --tool memcheck --error-exitcode 9 "$dir/test_cuda" --gtest_brief=1 \
        --gtest_filter='Fp8Quant*:Fp8KvCache*:Shapes/Fp8Gemm.*/0:Shapes/Fp8Gemm.*/5:Tokens/Fp8Moe.*/1:Tokens/Fp8MlaBmm.*/0' \
        > "$OUT/sanitize.log" 2>&1
      echo "sanitize rc=$? $(grep -c 'Invalid' "$OUT/sanitize.log") invalid accesses"
    fi
    ;;
  *)
    echo "usage: $0 pack [build-dir] | run" >&2
    exit 2
    ;;
esac
