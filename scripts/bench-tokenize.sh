#!/usr/bin/env bash
# `kvl tokenize` beside llama.cpp's `llama-tokenize` on the same text and vocabularies: both
# programs end to end (start, vocabulary load, tokenizing, printing the ids; both with --no-escape,
# so that both read the file's bytes as they are), the median of REPS runs each, wall and CPU (user + sys) seconds, and whether the two printed the same ids.
# Usage: scripts/bench-tokenize.sh KVL LLAMA_TOKENIZE TEXT REPS VOCAB.gguf... (prints a Markdown
# table, then JSON lines). Make the text with: build/tokenizer_bench --mb 10 --write-text FILE.
set -euo pipefail
kvl="$1"; llama="$2"; text="$3"; reps="$4"; shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One run: prints "wall cpu" in seconds.
run() {
  local out="$1"; shift
  /usr/bin/time -f "%e %U %S" -o "$tmp/time" "$@" >"$out" 2>/dev/null
  awk '{printf "%.3f %.3f\n", $1, $2 + $3}' "$tmp/time"
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
bytes=$(stat -c %s "$text")
echo "text: $text ($bytes bytes), $reps runs each, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| vocab | kvl tokenize wall s | llama-tokenize wall s | kvl CPU s | llama CPU s | tokens | same ids |"
echo "|---|---:|---:|---:|---:|---:|---|"
json=()
for vocab in "$@"; do
  : >"$tmp/kvl"; : >"$tmp/llama"
  for ((r = 0; r < reps; ++r)); do
    run "$tmp/kvl.out" "$kvl" tokenize -m "$vocab" -f "$text" --ids --no-escape >>"$tmp/kvl"
    run "$tmp/llama.out" "$llama" -m "$vocab" -f "$text" --ids --no-escape --log-disable >>"$tmp/llama"
  done
  kw=$(cut -d' ' -f1 "$tmp/kvl" | median); kc=$(cut -d' ' -f2 "$tmp/kvl" | median)
  lw=$(cut -d' ' -f1 "$tmp/llama" | median); lc=$(cut -d' ' -f2 "$tmp/llama" | median)
  tokens=$(tr -cd ',' <"$tmp/kvl.out" | wc -c); tokens=$((tokens + 1))
  same=no; cmp -s "$tmp/kvl.out" "$tmp/llama.out" && same=yes
  name=$(basename "$vocab")
  echo "| $name | $kw | $lw | $kc | $lc | $tokens | $same |"
  json+=("{\"vocab\":\"$name\",\"kvl_wall_s\":$kw,\"llama_wall_s\":$lw,\"kvl_cpu_s\":$kc,\"llama_cpu_s\":$lc,\"tokens\":$tokens,\"same_ids\":\"$same\",\"text_bytes\":$bytes}")
done
printf '%s\n' "${json[@]}"
