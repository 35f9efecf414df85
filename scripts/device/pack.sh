#!/usr/bin/env bash
# Packs what the GPU machine needs into .device-cuda/ (git-ignored through
# .git/info/exclude): the CUDA test and benchmark binaries from build-cuda and
# the non-system shared libraries they link (the GPU machine has the CUDA
# runtime and cuBLAS, but not fmt, spdlog, openblas, pcre2...), and the same
# gzipped as <dest>.pack/cuda.tgz: all binaries take ~130 MB, over the 64 MiB a
# device call carries, the archive ~40 MB.
# Usage: scripts/device/pack.sh [build-dir] [dest]; then run check_and_bench.sh
# there with `carry: ["<dest>.pack"]` (it unpacks the archive first; dest
# defaults to .device-cuda; dest names must start with .device so that
# .git/info/exclude ignores them).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
dest=${2:-.device-cuda}
case "$dest" in .device*) ;; *) echo "pack.sh: dest must start with .device" >&2; exit 2 ;; esac
rm -rf "$dest" && mkdir -p "$dest/lib"
grep -qx '/.device\*/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.device*/' >> .git/info/exclude; }
bins=()
for b in ${PACK_BINS:-test_cuda bench_kernels_cuda bench_model_cuda bench_grouped_gemm bench_fp8 mlaserve}; do
  [ -x "$build/$b" ] && cp "$build/$b" "$dest/" && bins+=("$dest/$b")
done
# Debug info would not fit the 64 MiB the device call carries.
strip --strip-debug "${bins[@]}"
# Everything ldd resolves except the C runtime and CUDA's own libraries.
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|libcuda|libcublas|libcudart' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
rm -rf "$dest.pack" && mkdir -p "$dest.pack"
tar czf "$dest.pack/cuda.tgz" "$dest"
du -sh "$dest" "$dest.pack"
