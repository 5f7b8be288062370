#!/bin/bash
# Exports the latest checkpoint into models/: the GGUF, the compact resume state (see
# resume_state.py), the held-out text slice and the loss curve (a PNG; the table for
# models/README.md goes to $WORK/run/loss_table.md).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${TRAIN_WORK:-/work/train_ckpt}
NAME=kvl-doc-12m
PY=/usr/bin/python3
nice -n 5 $PY "$HERE/export_gguf.py" --ckpt "$WORK/run/ckpt.pt" \
  --tokenizer "$WORK/data/tokenizer.model" --out "$REPO/models/$NAME.gguf" --name "$NAME" \
  --train-state "$REPO/models/$NAME.train-state.npz"
$PY "$HERE/heldout_slice.py" --heldout "$WORK/corpus/heldout.txt" \
  --out "$REPO/models/$NAME.heldout.txt"
$PY "$HERE/loss_table.py" --csv "$WORK/run/loss.csv" --png "$REPO/models/$NAME.loss.png" \
  > "$WORK/run/loss_table.md"
echo "loss table for models/README.md: $WORK/run/loss_table.md"
