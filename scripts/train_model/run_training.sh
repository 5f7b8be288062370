#!/bin/bash
# Builds whatever is missing (corpus, tokenizer + token streams) and runs one training session of
# at most MAX_MINUTES, detached from the calling shell, niced so compiles keep the CPU first.
# Resumes from $WORK/run/ckpt.pt when it exists, else from the committed GGUF (see README.md).
# Usage: scripts/train_model/run_training.sh   (log: $WORK/run/train.log)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${TRAIN_WORK:-/work/train_ckpt}
MAX_MINUTES=${MAX_MINUTES:-85}
PY=/usr/bin/python3
mkdir -p "$WORK/run"
if [ ! -f "$WORK/corpus/train.txt" ]; then
  nice -n 19 $PY "$HERE/corpus.py" --out "$WORK/corpus"
fi
if [ ! -f "$WORK/data/train.bin" ]; then
  nice -n 19 $PY "$HERE/tokenize_corpus.py" --corpus "$WORK/corpus" --out "$WORK/data"
fi
FROM_GGUF=()
if [ ! -f "$WORK/run/ckpt.pt" ] && [ -f "$REPO/models/kvl-doc-12m.gguf" ]; then
  FROM_GGUF=(--from-gguf "$REPO/models/kvl-doc-12m.gguf")
fi
setsid nohup nice -n 19 $PY "$HERE/train.py" --data "$WORK/data" --ckpt-dir "$WORK/run" \
  --max-minutes "$MAX_MINUTES" ${FROM_GGUF[@]+"${FROM_GGUF[@]}"} "$@" \
  >> "$WORK/run/train.log" 2>&1 < /dev/null &
echo "training started (pid $!), log: $WORK/run/train.log"
