#!/usr/bin/env bash
# kvl bench beside llama-bench on the same GGUF files, threads, prompt and generation lengths
# (issue 25 part 4). Prints a markdown table of medians and ratios, then the same as JSON.
#
# Usage: scripts/bench_vs_llamacpp.sh LLAMA_BENCH [MODEL_DIR]
#   LLAMA_BENCH  path to llama.cpp's llama-bench (its llama-quantize is looked up beside it)
#   MODEL_DIR    where SHAPE-f16.gguf, SHAPE-q8_0.gguf and SHAPE-q4_k_m.gguf live (default
#                /tmp/speed); missing files are made: the f16 by `kvl synth`, the quantized ones by
#                llama-quantize from it, so both engines read the same bytes.
# Environment (defaults in brackets):
#   KVL [build/kvl]  SHAPES [llama-3.2-1b qwen2.5-0.5b qwen3-0.6b gemma-3-1b]
#   TYPES [q8_0 q4_k_m]  THREADS [2]  PROMPT [512]  GEN [128]  ROUNDS [3]
#   DEEP ["gemma-3-1b:8192"]: SHAPE:DEPTH pairs that also run tg GEN at -d DEPTH
#   LLAMA_ARGS [""]: extra llama-bench flags (e.g. "--poll 0" on a shared machine)
#   KVL_ARGS ["-ctk f16 -ctv f16"]: extra kvl bench flags; the default gives kvl llama-bench's
#     f16 KV cache (kvl's own default is f32)
#   LD_LIBRARY_PATH: set it to llama.cpp's library folder when its default build cannot run here
#   QUIET_LOAD [""]: when set, each unit first waits until the 1-minute load average is below it
#     (at most QUIET_WAIT [900] seconds, then runs anyway and says so): on a shared machine
#     llama.cpp's spinning threads lose far more than kvl's to a busy core, so a ratio taken at
#     load 10 measures preemption, not kernels
#
# The machine may be shared: each round runs the two engines one after the other, alternating
# which goes first, and the table gives each engine's median over the rounds, the load average
# seen, and the ratio kvl / llama.cpp of those medians.
set -euo pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 LLAMA_BENCH [MODEL_DIR]  (LLAMA_BENCH must be an executable llama-bench)" >&2
  exit 2
fi
LLAMA_BENCH=$1
MODEL_DIR=${2:-/tmp/speed}
KVL=${KVL:-build/kvl}
SHAPES=${SHAPES:-"llama-3.2-1b qwen2.5-0.5b qwen3-0.6b gemma-3-1b"}
TYPES=${TYPES:-"q8_0 q4_k_m"}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
ROUNDS=${ROUNDS:-3}
DEEP=${DEEP:-"gemma-3-1b:8192"}
LLAMA_ARGS=${LLAMA_ARGS:-}
KVL_ARGS=${KVL_ARGS:-"-ctk f16 -ctv f16"}
QUIET_LOAD=${QUIET_LOAD:-}
QUIET_WAIT=${QUIET_WAIT:-900}
QUANTIZE=$(dirname "$LLAMA_BENCH")/llama-quantize
[[ -x "$KVL" ]] || { echo "no kvl at $KVL (build it: cmake --build build --target kvl)" >&2; exit 2; }
mkdir -p "$MODEL_DIR"
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT

make_model() {  # SHAPE TYPE -> path
  local shape=$1 type=$2 f16="$MODEL_DIR/$1-f16.gguf" out="$MODEL_DIR/$1-$2.gguf"
  if [[ ! -f "$f16" ]]; then "$KVL" synth --shape "$shape" --type f16 -o "$f16" >&2; fi
  if [[ ! -f "$out" ]]; then
    [[ -x "$QUANTIZE" ]] || { echo "no llama-quantize beside $LLAMA_BENCH" >&2; exit 2; }
    "$QUANTIZE" "$f16" "$out" "${type^^}" >&2
  fi
  echo "$out"
}

depth_of() {  # SHAPE -> DEEP's depth for it, or nothing
  local pair
  for pair in $DEEP; do [[ "${pair%%:*}" == "$1" ]] && echo "${pair##*:}"; done
  return 0
}

wait_for_quiet() {  # returns at once unless QUIET_LOAD is set
  [[ -n "$QUIET_LOAD" ]] || return 0
  local waited=0
  while python3 -c "import sys; sys.exit(0 if float(open('/proc/loadavg').read().split()[0]) >= $QUIET_LOAD else 1)"; do
    if ((waited >= QUIET_WAIT)); then
      echo "  load still $(cut -d' ' -f1 /proc/loadavg) after ${waited} s: running anyway" >&2
      return 0
    fi
    sleep 10
    waited=$((waited + 10))
  done
}

# One unit: one engine on one file, pp PROMPT and tg GEN (and tg GEN at the depth), one repetition
# each; the JSON goes to RAW/engine~shape~type~round.json (shape names hold dots), the load
# beside it.
run_unit() {  # ENGINE SHAPE TYPE ROUND MODEL
  local engine=$1 shape=$2 type=$3 round=$4 model=$5 depth
  depth=$(depth_of "$shape")
  local base="$RAW/$engine~$shape~$type~$round"
  cut -d' ' -f1 /proc/loadavg > "$base.load"
  if [[ $engine == llama ]]; then
    # shellcheck disable=SC2086
    "$LLAMA_BENCH" -m "$model" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o json $LLAMA_ARGS \
      > "$base.json"
    if [[ -n "$depth" ]]; then
      # shellcheck disable=SC2086
      "$LLAMA_BENCH" -m "$model" -t "$THREADS" -p 0 -n "$GEN" -d "$depth" -r 1 -o json \
        $LLAMA_ARGS > "$base.deep.json"
    fi
  else
    # shellcheck disable=SC2086
    "$KVL" bench -m "$model" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o json $KVL_ARGS \
      > "$base.json"
    if [[ -n "$depth" ]]; then
      # shellcheck disable=SC2086
      "$KVL" bench -m "$model" -t "$THREADS" -p 0 -n "$GEN" -d "$depth" -r 1 -o json \
        $KVL_ARGS > "$base.deep.json"
    fi
  fi
}

for ((round = 1; round <= ROUNDS; round++)); do
  for shape in $SHAPES; do
    for type in $TYPES; do
      model=$(make_model "$shape" "$type")
      if ((round % 2)); then order="llama kvl"; else order="kvl llama"; fi
      for engine in $order; do
        wait_for_quiet
        echo "round $round: $engine $shape $type (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        SECONDS=0
        # An engine that cannot run a file (an unsupported tensor type, say) leaves its cells
        # empty; the others still run.
        run_unit "$engine" "$shape" "$type" "$round" "$model" ||
          echo "  $engine failed on $model" >&2
        echo "  took ${SECONDS} s" >&2
      done
    done
  done
done

python3 - "$RAW" "$LLAMA_BENCH $LLAMA_ARGS" "$KVL bench $KVL_ARGS" "$THREADS" "$PROMPT" "$GEN" <<'PY'
import glob, json, os, statistics, sys
raw, llama_cmd, kvl_cmd, threads, prompt, gen = sys.argv[1:]
rows = {}  # (shape, type, test) -> {engine: [t/s per round], "load": [...]}
for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
    engine, shape, qtype, rnd = os.path.basename(path).split(".json")[0].split(".deep")[0].split("~")
    load = float(open(os.path.join(raw, f"{engine}~{shape}~{qtype}~{rnd}.load")).read())
    text = open(path).read().strip()
    for r in (json.loads(text) if text else []):
        if r.get("n_prompt", 0) > 0:
            test = f"pp{r['n_prompt']}"
        else:
            test = f"tg{r['n_gen']}"
        if r.get("n_depth", 0) > 0:
            test += f" @ d{r['n_depth']}"
        row = rows.setdefault((shape, qtype, test), {"llama": [], "kvl": [], "load": []})
        row[engine].append(r["avg_ts"])
        row["load"].append(load)

def med(v):
    return statistics.median(v) if v else float("nan")

out = []
print(f"| model | type | test | llama.cpp t/s (median) | kvl t/s (median) | kvl / llama.cpp | load |")
print("| :-- | :-- | :-- | --: | --: | --: | --: |")
for (shape, qtype, test), row in rows.items():
    l, k = med(row["llama"]), med(row["kvl"])
    ratio = k / l if l > 0 else float("nan")
    load = f"{min(row['load']):.1f}-{max(row['load']):.1f}"
    print(f"| {shape} | {qtype} | {test} | {l:.2f} | {k:.2f} | {ratio:.2f}x | {load} |")
    out.append({"model": shape, "type": qtype, "test": test, "llama_ts": row["llama"],
                "kvl_ts": row["kvl"], "llama_median": l, "kvl_median": k, "ratio": ratio,
                "load": row["load"]})
print()
print(f"threads {threads}, llama-bench: {llama_cmd}, kvl: {kvl_cmd}")
print(json.dumps(out, indent=1))
PY
