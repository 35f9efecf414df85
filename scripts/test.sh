#!/usr/bin/env bash
# Runs the test suite; GPU-labelled tests only where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ctest --preset default -j "$(nproc)"
else
  ctest --preset default -j "$(nproc)" -LE gpu
fi
