#!/usr/bin/env bash
# The trained model's quality figures beside llama.cpp's, on the same GGUF and text (issue 39):
# held-out perplexity, and the KV cache types' mean / p99 KL divergence and top-1 agreement
# against an f16 cache, with llama.cpp's rotation on (its default for quantized caches) and off
# (LLAMA_ATTN_ROT_DISABLE=1). Both engines score a chunk's second half, teacher-forced.
#
#   scripts/quality_vs_llamacpp.sh LLAMA_BIN_DIR [MODEL] [TEXT] [CTX] [CHUNKS]
#
# LLAMA_BIN_DIR holds llama.cpp's llama-perplexity and llama-simple (built from its source, e.g. the bundle in npm
# node-llama-cpp; nothing of it is committed here). Prints a markdown table; the raw logs stay in
# a temp dir whose path it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: $0 LLAMA_BIN_DIR [MODEL] [TEXT] [CTX] [CHUNKS]}
model=${2:-models/kvl-doc-12m.gguf}
text=${3:-models/kvl-doc-12m.heldout.txt}
ctx=${4:-512}
chunks=${5:-0}
threads=${THREADS:-2}
kvl=${KVL:-build/kvl}
perplexity="$bin/llama-perplexity"
[ -x "$perplexity" ] || { echo "$0: no llama-perplexity in $bin" >&2; exit 2; }
[ -x "$kvl" ] || { echo "$0: no kvl at $kvl (make build, or KVL=...)" >&2; exit 2; }
logs=$(mktemp -d /tmp/quality-vs-llamacpp.XXXXXX)
chunk_args=()  # llama-perplexity's; kvl perplexity always reads the whole text
[ "$chunks" -gt 0 ] && chunk_args=(--chunks "$chunks")

# llama-perplexity's figures from a log: perplexity, mean KLD, p99 KLD, same top-1 (%).
llama_field() {  # LOG PATTERN
  sed -n "s/^$2 *\([0-9.]*\).*/\1/p" "$1" | tail -n 1
}

echo "logs: $logs" >&2
"$perplexity" -m "$model" -f "$text" -c "$ctx" -t "$threads" -ctk f16 -ctv f16 \
  > "$logs/llama-f16.log" 2>&1
"$perplexity" -m "$model" -f "$text" -c "$ctx" -t "$threads" "${chunk_args[@]}" \
  -ctk f16 -ctv f16 --kl-divergence-base "$logs/base.kld" > "$logs/llama-f16-base.log" 2>&1
llama_ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$logs/llama-f16.log")
kvl_ppl=$("$kvl" perplexity -m "$model" -f "$text" -c "$ctx" -t "$threads" \
  2> "$logs/kvl-perplexity.log" | sed -n 's/^perplexity: \([0-9.]*\).*/\1/p' | tail -n 1)
echo "| engine | n_ctx | held-out perplexity (f16 cache) |"
echo "| --- | --- | --- |"
echo "| llama.cpp llama-perplexity | $ctx | $llama_ppl |"
echo "| kvl perplexity | $ctx | $kvl_ppl |"
python3 -c "a, b = $llama_ppl, $kvl_ppl; print(f'\nkvl vs llama.cpp: {100 * (b - a) / a:+.4f}%\n')"

# Greedy continuations: llama-simple (greedy, no chat template; llama-completion's text output
# came back cut short by a few tokens in some runs of the same command) and kvl run, 64 tokens.
simple="$bin/llama-simple"
if [ -x "$simple" ]; then
  same=0 total=0
  while IFS= read -r prompt; do
    total=$((total + 1))
    "$simple" -m "$model" -n 64 "$prompt" 2> /dev/null < /dev/null > "$logs/greedy-llama-$total.txt"
    "$kvl" run -m "$model" -p "$prompt" -n 64 --temp 0 -t "$threads" \
      2> /dev/null > "$logs/greedy-kvl-$total.txt" < /dev/null
    # llama-simple prints the BOS piece and the prompt's leading space: "<s> The ...".
    if [ "$(sed '1s/^<s> //' "$logs/greedy-llama-$total.txt")" = \
         "$(cat "$logs/greedy-kvl-$total.txt")" ]; then
      same=$((same + 1))
    fi
  done <<'PROMPTS'
The configuration file is read at startup and
To install the package, run
The function returns a pointer to
In this chapter we describe how the
Error messages are written to
PROMPTS
  echo "greedy continuations, 64 tokens: $same of $total identical to llama.cpp's"
  echo
fi

echo "| cache K/V | engine | rotation | bits/value | mean KLD | p99 KLD | same top-1 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for type in q8_0 q4_0; do
  for rot in on off; do
    log="$logs/llama-$type-rot-$rot.log"
    env_args=()
    [ "$rot" = off ] && env_args=(LLAMA_ATTN_ROT_DISABLE=1)
    env "${env_args[@]}" "$perplexity" -m "$model" -f "$text" -c "$ctx" -t "$threads" \
      "${chunk_args[@]}" -ctk "$type" -ctv "$type" -fa on \
      --kl-divergence-base "$logs/base.kld" --kl-divergence > "$log" 2>&1
    bits=$([ "$type" = q8_0 ] && echo 8.5 || echo 4.5)
    echo "| $type | llama.cpp | $rot | $bits | $(llama_field "$log" 'Mean    KLD:') |" \
         "$(llama_field "$log" '99.0%   KLD:') | $(llama_field "$log" 'Same top p:')% |"
  done
done
"$kvl" bench quality -m "$model" -f "$text" --ctx "$ctx" --chunks "$chunks" -t "$threads" \
  --json "$logs/kvl-quality.json" > "$logs/kvl-quality.log" 2>&1
python3 - "$logs/kvl-quality.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["configs"]:
    name = r["name"]
    rot = "on" if "0r" in name else "off"
    print(f"| {name} | kvl | {rot} | {r['bits_per_value']:.2f} | {r['kld_mean']:.6f} | "
          f"{r['kld_p99']:.6f} | {100 * r['top1']:.3f}% |")
EOF
