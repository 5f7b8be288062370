#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer for SECONDS (default 30). Run from the repository root.
# Exits non-zero if the fuzzer finds a crash, a sanitizer report or a leak; exits 0 with a note
# where clang++-14 is missing, since libFuzzer needs clang.
set -uo pipefail
seconds="${1:-30}"
out=build-fuzz
cxx=clang++-14
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: $cxx not found, skipping the GGUF fuzzer (install clang-14 and libclang-rt-14-dev)"
  exit 0
fi
mkdir -p "$out"
sources=(src/base/*.cc src/gguf/*.cc)
flags=(-std=c++20 -g -Iinclude/base -Iinclude/gguf -Isrc/gguf)

echo "fuzz: building $out/gguf_fuzzer"
"$cxx" "${flags[@]}" -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${sources[@]}" fuzz/gguf_fuzzer.cc -lfmt -o "$out/gguf_fuzzer" || {
  echo "fuzz: build of the fuzzer failed"; exit 1; }
"$cxx" "${flags[@]}" -O1 -DKVL_GGUF_FUZZ_SEEDS "${sources[@]}" fuzz/gguf_fuzzer.cc -lfmt \
  -o "$out/gguf_seeds" || { echo "fuzz: build of the seed writer failed"; exit 1; }

# Seeds: tiny valid files from the writer, plus the head of a real model (its header and
# metadata, which is where the parser's work is).
corpus="$out/gguf_corpus"
mkdir -p "$corpus"
"$out/gguf_seeds" "$corpus" || { echo "fuzz: writing seed files failed"; exit 1; }
model=../shared/models/stories260K.gguf
if [ -f "$model" ]; then
  head -c 65536 "$model" > "$corpus/stories260K_head.gguf"
else
  echo "fuzz: $model not found, fuzzing from the synthetic seeds only"
fi

log="$out/gguf_fuzz.log"
echo "fuzz: running for ${seconds}s (log in $log)"
"$out/gguf_fuzzer" "$corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
  -timeout=10 -artifact_prefix="$out/" -print_final_stats=1 >"$log" 2>&1
rc=$?
runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
secs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE 'in [0-9]+' | grep -oE '[0-9]+' | tail -1)
if [ $rc -ne 0 ]; then
  tail -40 "$log"
  echo "fuzz: FAILED (exit $rc) after ${runs:-?} runs; crashing input saved under $out/ (crash-*, leak-*, timeout-*, oom-*)"
  exit 1
fi
echo "fuzz: ${runs:-?} runs in ${secs:-$seconds} s, no crashes"
