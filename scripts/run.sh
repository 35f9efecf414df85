#!/usr/bin/env bash
# `make run`: create the tiny default model once, then serve it (OpenAI API
# on http://127.0.0.1:30000, in the foreground; Ctrl-C drains and exits).
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/tiny
if [ ! -f "$model/config.json" ]; then
  build/mlaserve make-model --preset tiny --out "$model"
fi
exec build/mlaserve serve --model-path "$model" --served-model-name tiny --enable-metrics "$@"
