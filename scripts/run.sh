#!/usr/bin/env bash
# `make run`: create the tiny default model once, then run mlaserve on it.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/tiny
if [ ! -f "$model/config.json" ]; then
  build/mlaserve make-model --preset tiny --out "$model"
fi
exec build/mlaserve generate --model-path "$model" --prompt "The capital of France is" --max-new-tokens 32
