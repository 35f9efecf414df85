#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with
# .device-cuda.pack carried (see pack.sh): device facts, the GPU tests, a
# compute-sanitizer pass over them, and the kernel benchmarks. Logs go to
# $OUT; the last lines printed are the summary.
# Usage: scripts/device/check_and_bench.sh [tests|sanitize|bench|power|grouped|fp8|model|nopdl|ncu|ncudetail|engine|v3fp8|ab|envab|ncuv3|ncuprefill|timeline|peer]...
# (default: tests sanitize bench model peer). nopdl repeats the model's decode
# with programmatic dependent launch off (MLASERVE_PDL=0), to show what it buys;
# ncu times every kernel of a few decode steps of a 4-layer v2-lite with
# Nsight Compute, and ncudetail shows stall reasons for the kernels
# NCU_KERNELS names. model makes a random v2-lite
# checkpoint in $CKPT (default /tmp/v2lite) and runs bench_model_cuda on it;
# peer runs transformers on the same checkpoint. engine needs `assets` carried
# too (the tokenizer of the golden models). v2-lite (31 GB) and v3-slice
# (38 GB) do not fit the 64 GB disk together: making one removes the other.
# ncuv3 times every kernel of a v3-slice FP8 decode step at bs 1. timeline
# summarizes where the bs-1 decode chain kernel's time goes, from a pack
# built with -DMLASERVE_CHAIN_TIMELINE=ON.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
dir=$PWD/.device-cuda
# pack.sh's archive, when it was carried instead of the folder.
[ -f .device-cuda.pack/cuda.tgz ] && tar xzf .device-cuda.pack/cuda.tgz
cublas=$(find /usr/local /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$dir/lib:${cublas:+$(dirname "$cublas"):}${LD_LIBRARY_PATH:-}"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench model peer)
CKPT=${CKPT:-/tmp/v2lite}
summary=()
V3=${V3CKPT:-/tmp/v3slice}

# Frees the disk for a checkpoint about to be made in $1 by removing the
# other preset's (they do not fit together).
make_room_for() {
  [ -e "$1/config.json" ] && return
  for other in "$CKPT" "$V3"; do
    [ "$other" != "$1" ] && rm -rf "$other"
  done
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
echo "commit: ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  date: $(date -u +%F)" | tee -a "$OUT/device.txt"

for step in "${steps[@]}"; do
  case $step in
    tests)
      "$dir/test_cuda" --gtest_brief=1 2>&1 | tee "$OUT/tests.log"
      rc=${PIPESTATUS[0]}
      summary+=("tests: rc=$rc, $(grep -c '^\[rel_l2\]' "$OUT/tests.log") rel_l2 lines")
      ;;
    sanitize)
      san=$(command -v compute-sanitizer || find /usr/local /opt -name compute-sanitizer -type f 2>/dev/null | head -1)
      # One pass with memcheck over the fast tests (sanitizer slows kernels ~100x).
      "$san" --tool memcheck --error-exitcode 9 "$dir/test_cuda" --gtest_brief=1 \
        --gtest_filter="${SANITIZE_FILTER:-*}" > "$OUT/sanitize.log" 2>&1
      rc=$?
      # The test count shows a filter that matched fewer suites than meant.
      ran=$(grep -oE 'PASSED  \] [0-9]+ tests?' "$OUT/sanitize.log" | grep -oE '[0-9]+' | tail -1)
      summary+=("compute-sanitizer memcheck: rc=$rc, ${ran:-0} tests passed, $(grep -c 'Invalid' "$OUT/sanitize.log") invalid accesses")
      ;;
    bench)
      if [ -x "$dir/bench_kernels_cuda" ]; then
        "$dir/bench_kernels_cuda" --benchmark_min_warmup_time=0.05 ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
        summary+=("bench: rc=${PIPESTATUS[0]}")
      fi
      ;;
    power)
      # SM clock and board power while a benchmark repeats: GEMMs that reach
      # the 700 W cap run below their boost clock (perf.md sessions 22, 34).
      # POWER_BENCHES: binary:filter pairs (default the FP8 MoE at 4096 tokens
      # and cuBLASLt's FP8 o_proj at M = 4096).
      for spec in ${POWER_BENCHES:-bench_grouped_gemm:BM_Sm90MoeFp8/4096/0/0/1/0/192/ bench_fp8:BM_Fp8Linear/4096/7168/16384/}; do
        bin=${spec%%:*} filter=${spec#*:}
        [ -x "$dir/$bin" ] || continue
        nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 > "$OUT/power_samples.txt" &
        smi=$!
        "$dir/$bin" --benchmark_filter="$filter" --benchmark_repetitions=${POWER_REPS:-30} 2>&1 |
          grep -E "_(mean|median) " | tee -a "$OUT/power.log"
        kill $smi
        wait $smi 2>/dev/null
        python3 scripts/device/power_summary.py "$OUT/power_samples.txt" | sed "s|^|$bin $filter: |" | tee -a "$OUT/power.log"
      done
      summary+=("power: $(grep -c 'SM clock' "$OUT/power.log" 2>/dev/null || echo 0) benchmarks sampled")
      ;;
    grouped)
      if [ -x "$dir/bench_grouped_gemm" ]; then
        "$dir/bench_grouped_gemm" ${GROUPED_ARGS:-} 2>&1 | tee "$OUT/grouped.log"
        summary+=("grouped GEMM bench: rc=${PIPESTATUS[0]}")
      fi
      ;;
    fp8)
      if [ -x "$dir/bench_fp8" ]; then
        "$dir/bench_fp8" ${FP8_ARGS:-} 2>&1 | tee "$OUT/fp8.log"
        summary+=("fp8 bench: rc=${PIPESTATUS[0]}")
      fi
      ;;
    model)
      make_room_for "$CKPT"
      "$dir/bench_model_cuda" --dir "$CKPT" ${MODEL_ARGS:-} 2>&1 | tee "$OUT/model.log"
      summary+=("model bench: rc=${PIPESTATUS[0]}")
      ;;
    nopdl)
      MLASERVE_PDL=0 "$dir/bench_model_cuda" --dir "$CKPT" ${NOPDL_ARGS:---batches 1,8 --output 64} 2>&1 |
        tee "$OUT/model_nopdl.log"
      summary+=("model bench without PDL: rc=${PIPESTATUS[0]}")
      ;;
    ncu)
      ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
      # Clocks and caches left alone: the kernels run as in the step (weights stay in L2 as they would).
      "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        "$dir/bench_model_cuda" --dir /tmp/v2l4 --layers 4 --prefill 0 ${NCU_ARGS:---batches 1 --output 3} \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
      summary+=("ncu: rc=$?, $(grep -c gpu__time_duration "$OUT/ncu.csv") kernels")
      ;;
    ncudetail)
      # Stall reasons and memory throughput of the kernels NCU_KERNELS names (a regex).
      ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
      "$ncu" --clock-control none --cache-control none -k "regex:${NCU_KERNELS:-moe_select}" --launch-skip 6 \
        --launch-count ${NCU_COUNT:-2} --section SpeedOfLight --section WarpStateStats --section LaunchStats \
        --section Occupancy --section MemoryWorkloadAnalysis \
        "$dir/bench_model_cuda" --dir /tmp/v2l4 --layers 4 --prefill 0 --batches 1 --output 3 \
        > "$OUT/ncu_detail.txt" 2>&1
      summary+=("ncu detail: rc=$?")
      ;;
    engine)
      # The runtime end to end (golden tokens through generate / serve, then
      # bench-one-batch on the model step's v2-lite checkpoint).
      # The model step's checkpoint when it ran; otherwise engine_check makes
      # one there (the link must not dangle: make-model would fail on it).
      make_room_for "$CKPT"
      mkdir -p /tmp/engine "$CKPT" && ln -sfn "$CKPT" /tmp/engine/v2lite
      python3 scripts/device/engine_check.py "$dir/mlaserve" /tmp/engine --bench-layers 27 \
        --bench-output-len ${ENGINE_OUTPUT:-128} 2>&1 | tee "$OUT/engine.log"
      summary+=("engine check: rc=${PIPESTATUS[0]}")
      ;;
    v3fp8)
      # Issue 6 end to end: v3-slice (V3 width, 1 dense + 3 MoE layers) in
      # block-FP8 with FP8-resident weights, then fp8 vs bf16 latent cache at
      # batch 64 (context ${V3_KV_INPUT:-8192}).
      make_room_for "$V3"
      "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --batches 1,64 \
        --output ${V3_OUTPUT:-32} 2>&1 | tee "$OUT/v3fp8.log"
      summary+=("v3-slice fp8 bench: rc=${PIPESTATUS[0]}")
      for kv in auto fp8_e4m3; do
        "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --batches 64 \
          --input ${V3_KV_INPUT:-8192} --output 16 --kv-cache-dtype $kv 2>&1 | tee "$OUT/v3kv_$kv.log"
        summary+=("v3-slice kv $kv: rc=${PIPESTATUS[0]}")
      done
      ;;
    ab)
      # A/B of bench_model_cuda: this build against a baseline build carried
      # as .device-base.pack/base.tgz (folder .device-base), alternating, AB_ROUNDS
      # (default 3) rounds each, table rows only. AB_V3=1: v3-slice in block-FP8 (else
      # v2-lite bf16); AB_ARGS: the benchmark's options (default: decode at
      # bs 1, output 128, no prefill).
      ckpt=$CKPT model_args=()
      [ -n "${AB_V3:-}" ] && ckpt=$V3 model_args=(--preset v3-slice --dtype fp8)
      make_room_for "$ckpt"
      [ -f .device-base.pack/base.tgz ] && tar xzf .device-base.pack/base.tgz
      for round in $(seq "${AB_ROUNDS:-3}"); do
        for build in "$dir" "$PWD/.device-base"; do
          [ -x "$build/bench_model_cuda" ] || continue
          "$build/bench_model_cuda" --dir "$ckpt" "${model_args[@]}" ${AB_ARGS:---batches 1 --prefill 0 --output 128} 2>&1 |
            grep -E "^\| (prefill|decode)" | sed "s|^|$(basename "$build") round $round: |" | tee -a "$OUT/ab.log"
        done
      done
      summary+=("A/B: $(wc -l < "$OUT/ab.log") rows")
      ;;
    envab)
      # A/B of one build under the environments AB_ENVS names (space-separated
      # VAR=value words, one run each a round; "-" for none), otherwise as ab.
      ckpt=$CKPT model_args=()
      [ -n "${AB_V3:-}" ] && ckpt=$V3 model_args=(--preset v3-slice --dtype fp8)
      make_room_for "$ckpt"
      for round in $(seq "${AB_ROUNDS:-3}"); do
        for e in ${AB_ENVS:--}; do
          env $([ "$e" != - ] && echo "$e") "$dir/bench_model_cuda" --dir "$ckpt" "${model_args[@]}" \
            ${AB_ARGS:---batches 1 --prefill 0 --output 128} 2>&1 |
            grep -E "^\| (prefill|decode)" | sed "s|^|$e round $round: |" | tee -a "$OUT/ab.log"
        done
      done
      summary+=("env A/B: $(wc -l < "$OUT/ab.log") rows")
      ;;
    ncuv3)
      make_room_for "$V3"
      "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --batches 1 --prefill 0 --output 1 \
        > "$OUT/ncu_v3_make.log" 2>&1
      ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
      "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --prefill 0 --batches 1 --output 3 \
        > "$OUT/ncu_v3.csv" 2> "$OUT/ncu_v3.err"
      summary+=("ncu v3-slice: rc=$?, $(grep -c gpu__time_duration "$OUT/ncu_v3.csv") kernels")
      ;;
    ncuprefill)
      # Kernel times of one v3-slice block-FP8 prefill of 1 x 4096 (the
      # bench's second forward of that shape: the first warms up).
      make_room_for "$V3"
      "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --batches none > "$OUT/ncu_prefill_make.log" 2>&1
      ncu=$(command -v ncu || find /opt/nvidia /usr/local -name ncu -type f 2>/dev/null | head -1)
      "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        "$dir/bench_model_cuda" --dir "$V3" --preset v3-slice --dtype fp8 --batches none \
        > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
      python3 scripts/device/ncu_kernel_times.py "$OUT/ncu_prefill.csv" --marker "${NCU_MARKER:-embedding}" \
        --first 1 --count 1 | tee "$OUT/ncu_prefill.md"
      summary+=("ncu v3-slice prefill: rc=$?")
      ;;
    timeline)
      make_room_for "$CKPT"
      "$dir/bench_model_cuda" --dir "$CKPT" --batches 1 --prefill 0 --output 128 \
        --chain-timeline "$OUT/chain_timeline.bin" > "$OUT/timeline_bench.log" 2>&1
      rc=$?
      python3 scripts/device/chain_timeline.py "$OUT/chain_timeline.bin" | tee "$OUT/timeline.md"
      gzip -f "$OUT/chain_timeline.bin"  # 17 MB of mostly zeros
      summary+=("chain timeline: rc=$rc, $(grep -c '^|' "$OUT/timeline.md") table rows")
      ;;
    peer)
      PYTHONUNBUFFERED=1 python3 scripts/device/hf_peer.py "$CKPT" ${PEER_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/peer.log"
      summary+=("transformers peer: rc=${PIPESTATUS[0]}")
      ;;
  esac
done
echo "==== summary"
printf '%s\n' "${summary[@]}"
