#!/usr/bin/env bash
# Fuzzes the GGUF reader, the Jinja chat-template renderer, the kvl command line's option parsing
# and the tokenizer with libFuzzer, for SECONDS in all (default 40), split evenly between the four.
# The server's request parsers (every route's JSON) get an eighth of SECONDS on top.
# Run from the repository root.
# Exits non-zero if the fuzzer finds a crash, a sanitizer report or a leak; exits 0 with a note
# where clang++-14 is missing, since libFuzzer needs clang.
set -uo pipefail
seconds="${1:-40}"
per_fuzzer=$(( seconds / 4 > 0 ? seconds / 4 : 1 ))
out=build-fuzz
cxx=clang++-14
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: $cxx not found, skipping the fuzzers (install clang-14 and libclang-rt-14-dev)"
  exit 0
fi
# ccache, where installed, keeps the fuzzers' per-file compiles of unchanged sources cheap
# (calls naming several sources at once are not cached: they simply run).
compiler=("$cxx")
command -v ccache >/dev/null 2>&1 && compiler=(ccache "$cxx")
mkdir -p "$out"

# run_fuzzer LABEL BINARY CORPUS SECONDS ARTIFACT_PREFIX [libFuzzer options...]: runs one fuzzer
# for SECONDS, prints its run count, and exits the script (1) with the log's tail and where the
# crashing input went when the fuzzer found something.
run_fuzzer() {
  local label=$1 binary=$2 corpus=$3 secs=$4 prefix=$5
  shift 5
  local log="$out/${label// /_}_fuzz.log"
  echo "fuzz: $label for ${secs}s (log in $log)"
  "$binary" "$corpus" -max_total_time="$secs" -artifact_prefix="$prefix" -print_final_stats=1 "$@" \
    >"$log" 2>&1
  local rc=$?
  local runs
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  if [ $rc -ne 0 ]; then
    tail -40 "$log"
    echo "fuzz: FAILED (exit $rc) after ${runs:-?} runs; crashing input saved under ${prefix}* (crash-*, leak-*, timeout-*, oom-*)"
    exit 1
  fi
  echo "fuzz: $label: ${runs:-?} runs in ${secs} s, no crashes"
}

# link_from_objects OUTPUT OBJDIR EXTRA_FLAGS -- SOURCES...: builds a fuzzer that links only what
# its entry point calls from the layers below. Each source is compiled on its own, two at a time,
# every run (a changed header would leave an older object stale; ccache makes unchanged ones
# cheap); the rest of those layers' files is never called, so their references stay unresolved
# and --gc-sections drops what it can.
link_from_objects() {
  local output=$1 objdir=$2 extra=$3
  shift 4
  local sources=("$@") objects=() compiles=() src obj i
  mkdir -p "$objdir"
  for src in "${sources[@]}"; do
    obj="$objdir/$(echo "$src" | tr / _).o"
    objects+=("$obj")
    [ "${#compiles[@]}" -ge 2 ] && { wait "${compiles[0]}"; compiles=("${compiles[@]:1}"); }
    # A failed compile leaves no object, which the check below names.
    # shellcheck disable=SC2086
    { "${compiler[@]}" -std=c++20 -g -O1 -fsanitize=fuzzer-no-link,address,undefined \
        -fno-sanitize-recover=undefined -ffunction-sections -fdata-sections "${includes[@]}" \
        $extra -c "$src" -o "$obj" || rm -f "$obj"; } &
    compiles+=($!)
  done
  wait
  for i in "${!sources[@]}"; do
    [ -f "${objects[$i]}" ] || { echo "fuzz: build of ${sources[$i]} failed"; exit 1; }
  done
  "${compiler[@]}" -fsanitize=fuzzer,address,undefined -fuse-ld=lld -Wl,--gc-sections \
    -Wl,--unresolved-symbols=ignore-all "${objects[@]}" -lfmt -o "$output" || {
    echo "fuzz: link of $output failed"; exit 1; }
}
includes=()
for d in include/*; do includes+=("-I$d"); done
sources=(src/base/*.cc src/gguf/*.cc)
flags=(-std=c++20 -g -Iinclude/base -Iinclude/gguf -Isrc/gguf)

echo "fuzz: building $out/gguf_fuzzer"
# The fuzzer and its seed writer build side by side (the machine has two cores).
"${compiler[@]}" "${flags[@]}" -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${sources[@]}" fuzz/gguf_fuzzer.cc -lfmt -o "$out/gguf_fuzzer" &
fuzzer_build=$!
"${compiler[@]}" "${flags[@]}" -O1 -DKVL_GGUF_FUZZ_SEEDS "${sources[@]}" fuzz/gguf_fuzzer.cc -lfmt \
  -o "$out/gguf_seeds" || { wait "$fuzzer_build"; echo "fuzz: build of the seed writer failed"; exit 1; }
wait "$fuzzer_build" || { echo "fuzz: build of the fuzzer failed"; exit 1; }

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

run_fuzzer gguf "$out/gguf_fuzzer" "$corpus" "$per_fuzzer" "$out/" -rss_limit_mb=2048 \
  -max_len=65536 -timeout=10

# The Jinja renderer: any bytes as a template, rendered over a conversation with tools. Seeds: a
# few templates in the shapes real ones take, and the real ones where the Jinja tests fetched
# llama.cpp's (build/npm-jinja/llama.cpp/models/templates).
echo "fuzz: building $out/jinja_fuzzer"
"${compiler[@]}" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude/base -Iinclude/jinja -Isrc/jinja src/base/*.cc src/jinja/*.cc fuzz/jinja_fuzzer.cc -lfmt \
  -o "$out/jinja_fuzzer" || { echo "fuzz: build of the jinja fuzzer failed"; exit 1; }
jinja_corpus="$out/jinja_corpus"
mkdir -p "$jinja_corpus"
printf '%s' "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content | trim }}{% elif m.tool_calls %}{% for c in m.tool_calls %}{{ c.function | tojson(indent=2) }}{% endfor %}{% else %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}" >"$jinja_corpus/loop"
printf '%s' "{%- set ns = namespace(n=0, last=none) -%}{%- for m in messages[::-1] if m.content is string -%}{%- set ns.n = ns.n + 1 -%}{%- if loop.first -%}{%- set ns.last = m.content.split('</think>')[-1].lstrip('\n') -%}{%- endif -%}{%- endfor -%}{{ ns.n ~ ':' ~ ns.last }}" >"$jinja_corpus/namespace"
printf '%s' "{% macro render(v, d=0) %}{% if v is mapping %}{% for k, x in v | items %}{{ k }}={{ render(x, d + 1) }};{% endfor %}{% elif v is iterable and v is not string %}[{{ v | join(',') }}]{% else %}{{ v | string }}{% endif %}{% endmacro %}{% for t in tools %}{{ render(t) }}{% endfor %}{{ tools | selectattr('type', 'equalto', 'function') | map(attribute='function') | list | length }}" >"$jinja_corpus/macro"
# Generated shapes (fuzz/jinja_fuzzer.cc: 0x01, a 16-bit count, then prefix, open, middle, close
# and suffix split at NUL, '#' in the prefix and suffix read as the count): operator chains,
# nesting, and loops that build deep values and large strings, at small counts for the fuzzer to
# grow (chains of 20k links and values 100k deep are what crashed a recursive evaluator).
generated() { printf "\x01$2" >"$jinja_corpus/gen_$1"; }
generated chain_plus '\x00\x40{{ 1\x00\x00\x00+1\x00 }}'
generated chain_concat '\x00\x40{{ "a"\x00\x00\x00 ~ "b"\x00 }}'
generated chain_filter '\x00\x40{{ "A"\x00\x00\x00|lower\x00 }}'
generated chain_and '\x00\x40{{ x\x00\x00\x00 and x < 2\x00 }}'
generated chain_test '\x00\x40{{ x\x00\x00\x00 is defined\x00 }}'
generated chain_index '\x00\x40{%% set x = [[1]] %%}{{ x\x00\x00\x00[0]\x00 }}'
generated nest_parens '\x00\x20{{ \x00(\x00x\x00)\x00 }}'
generated nest_lists '\x00\x20{{ \x00[\x00x\x00]\x00 | tojson }}'
generated nest_blocks '\x00\x20\x00{%% if true %%}\x00x\x00{%% endif %%}\x00'
generated loop_deep_list '\x01\x00{%% set ns = namespace(v=[]) %%}{%% for i in range(#) %%}{%% set ns.v = [ns.v] %%}{%% endfor %%}{{ ns.v | length }}'
generated loop_deep_method '\x01\x00{%% set ns = namespace(f=none) %%}{%% for i in range(#) %%}{%% set ns.f = {"a": ns.f}.get %%}{%% endfor %%}{{ ns.f("a") is none }}'
generated loop_big_string '\x00\x08{%% set ns = namespace(s="ab") %%}{%% for i in range(#) %%}{%% set ns.s = ns.s ~ ns.s %%}{%% endfor %%}{{ ns.s | length }}'
generated loop_big_list '\x00\x08{%% set ns = namespace(l=[1]) %%}{%% for i in range(#) %%}{%% set ns.l = ns.l + [ns.l, ns.l] %%}{%% endfor %%}{{ ns.l | tojson | length }}'
generated macro_recursion '\x00\x10{%% macro f(n) %%}{%% if n > 0 %%}({{ f(n - 1) }}){%% endif %%}{%% endmacro %%}{{ f(#) }}'
templates=build/npm-jinja/llama.cpp/models/templates
[ -d "$templates" ] && cp "$templates"/*.jinja "$jinja_corpus"/ 2>/dev/null
run_fuzzer jinja "$out/jinja_fuzzer" "$jinja_corpus" "$per_fuzzer" "$out/jinja-" -dict=fuzz/jinja.dict \
  -rss_limit_mb=2048 -max_len=16384 -timeout=10

# The command line: ParseCommandLine (parse and validate, nothing run) over argument vectors
# split at NUL bytes. Only the option parsers are linked from the layers below the CLI.
echo "fuzz: building $out/cli_options_fuzzer"
# src/cli/*_flags.cc names command_flags.cc too (listing it again links it twice).
cli_sources=(src/base/*.cc src/cli/options.cc src/cli/*_flags.cc
             src/cli/bench/*_flags.cc src/engine/engine_options.cc src/engine/spec_drafter.cc
             src/kv/tiers/tier_spec.cc src/kv/trace/kv_trace.cc
             src/kv/lattice/kv_policy.cc src/kv/pool/kv_block_storage.cc src/sampling/sampler.cc
             fuzz/cli_options_fuzzer.cc)
link_from_objects "$out/cli_options_fuzzer" "$out/cli_obj" "-Isrc/cli" -- "${cli_sources[@]}"
cli_corpus="$out/cli_corpus"
mkdir -p "$cli_corpus"
# Seeds: the first byte picks the command (run, bench, synth, calibrate, inspect, none).
printf '\x00-m\0m.gguf\0-n\0-5\0--kv-sink\09223372036854775800' >"$cli_corpus/run_sink"
printf '\x00-m\0m.gguf\0--kv-tier\0disk:/tmp/a:1MiB\0--kv-policy\0compress\0--kv-quality\0lossless' \
  >"$cli_corpus/run_tier"
printf '\x00-m\0m.gguf\0-s\018446744073709551616\0--kv-budget\00\0-c\02000000000' >"$cli_corpus/run_seed"
printf '\x01-m\0m.gguf\0-p\0-5,16\0-n\00\0--prefix\032\0--suffix\00\0-ctk\0f16,f32' \
  >"$cli_corpus/bench"
printf '\x02--shape\0tiny-test\0--seed\099\0-o\0x.gguf' >"$cli_corpus/synth"
printf '\x03-m\0m.gguf\0-t\0-1\0--quick' >"$cli_corpus/calibrate"
run_fuzzer "cli options" "$out/cli_options_fuzzer" "$cli_corpus" "$per_fuzzer" "$out/cli-" \
  -rss_limit_mb=2048 -max_len=1024 -timeout=10

# The tokenizer: encode and decode over hand-made vocabularies and llama.cpp's real ones where
# they can be fetched (scripts/fetch-llama-vocab.sh; without npm or network, the hand-made ones).
echo "fuzz: building $out/tokenizer_fuzzer"
"${compiler[@]}" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude/base -Iinclude/gguf -Iinclude/tokenizer -Isrc/tokenizer \
  src/base/*.cc src/gguf/*.cc src/tokenizer/*.cc fuzz/tokenizer_fuzzer.cc -lfmt \
  -o "$out/tokenizer_fuzzer" || { echo "fuzz: build of the tokenizer fuzzer failed"; exit 1; }
vocab_dir="$out/llama-vocab"
vocabs=""
if timeout 600 scripts/fetch-llama-vocab.sh "$vocab_dir" >"$out/fetch-vocab.log" 2>&1; then
  for v in llama-bpe qwen2 phi-3 llama-spm gpt-2 starcoder deepseek-llm command-r; do
    vocabs="$vocabs:$vocab_dir/llama.cpp/models/ggml-vocab-$v.gguf"
  done
else
  echo "fuzz: llama.cpp's vocab files could not be fetched ($(tail -1 "$out/fetch-vocab.log")): hand-made vocabularies only"
fi
tok_corpus="$out/tokenizer_corpus"
mkdir -p "$tok_corpus"
# Seeds: byte 0 picks the vocabulary, byte 1 the mode (bit 0 add_special, bit 1 parse_special,
# bit 7 decode ids).
printf '\x01\x00Hello world, it'"'"'s 12345 caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87  \n\n\t x' >"$tok_corpus/text"
printf '\x02\x03<|endoftext|> a<tool>b \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9' >"$tok_corpus/special"
printf '\x00\x02<s>a\xff\xfe\x80 \xe4\xb8 <|im_start|>' >"$tok_corpus/invalid"
printf '\x03\x81\x01\x00\x00\x00\xff\xff\xff\x7f\xff\xff\xff\xff\x05\x01\x00\x00' >"$tok_corpus/ids"
KVL_FUZZ_VOCABS="$vocabs" run_fuzzer tokenizer "$out/tokenizer_fuzzer" "$tok_corpus" "$per_fuzzer" \
  "$out/tokenizer-" -rss_limit_mb=4096 -max_len=4096 -timeout=20

# The server's request parsers (every route's JSON: completions, chat, /apply-template,
# /tokenize, /detokenize) over bodies a generator builds from the input: deep nesting, long
# strings, wrong types, huge numbers. A small share of the time (the generator reaches the deep
# cases at once). Only what the parsers call is linked.
server_seconds=$(( seconds / 8 > 0 ? seconds / 8 : 1 ))
echo "fuzz: building $out/server_json_fuzzer"
# A request's tools, tool_choice and response_format become grammars as they are parsed, so the
# grammar layer and the server's agent files are linked whole.
server_sources=(src/base/*.cc src/tokenizer/*.cc src/jinja/*.cc src/grammar/*.cc
                src/server/json_body.cc src/server/api_request.cc src/server/tokenize_routes.cc
                src/server/chat_formatter.cc src/server/chat_template.cc
                src/server/structured_output.cc src/server/tool_request.cc src/server/tool_calls.cc
                src/server/reply_splitter.cc src/server/request_fields.cc
                src/server/sampling_fields.cc
                src/kv/lattice/kv_policy.cc src/sampling/sampler.cc fuzz/server_json_fuzzer.cc)
link_from_objects "$out/server_json_fuzzer" "$out/server_obj" \
  "-Isrc/server -Isrc/tokenizer -Isrc/jinja -Isrc/grammar" \
  -- "${server_sources[@]}"
server_corpus="$out/server_corpus"
mkdir -p "$server_corpus"
# Seeds: byte 0 picks the route (0 completions, 1 chat, 2 /apply-template, 3 /tokenize,
# 4 /detokenize; +5 with a Jinja template), byte 1 bit 7 sends the rest raw.
printf '\x00\x80{"prompt": "Once", "max_tokens": 4, "logit_bias": {"600": 1}, "stop": ["a"]}' \
  >"$server_corpus/completion"
printf '\x06\x80{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\\"x\\": [1, {\\"y\\": 2}]}"}}]}], "tools": [{"type": "function"}]}' \
  >"$server_corpus/chat_tools"
printf '\x03\x80{"content": ["ab", 3, "aab"], "with_pieces": true}' >"$server_corpus/tokenize"
printf '\x04\x80{"tokens": [1, 2, 300, 18446744073709551615]}' >"$server_corpus/detokenize"
printf '\x01\x00\x05\x03\x07\x02\x06\x01\x00\x04\x09' >"$server_corpus/generated"
run_fuzzer "server JSON" "$out/server_json_fuzzer" "$server_corpus" "$server_seconds" "$out/server-" \
  -rss_limit_mb=2048 -max_len=2048 -timeout=20
