#!/usr/bin/env bash
# A newcomer's first hour, as one script: an EN->FR model trained from the config reference (docs/config.md) on
# Multi30k's plain-text files, killed with SIGKILL and resumed with the same command, evaluated on the validation
# split, exported both ways, served from a TensorFlow-only process and from CTranslate2, and its attention plotted.
# Each step prints its wall time. A tiny model and short epochs (training.steps_per_epoch below one pass), so that it
# runs in minutes on a 2-core CPU; the numbers it prints are a smoke test, not a result.
#
#   bash examples/first_hour.sh [WORKFOLDER]      (default: a new folder under /tmp; ../shared beside the repo)
set -euo pipefail
cd "$(dirname "$0")/.."
KT=".venv/bin/keras-transformer"
PY=".venv/bin/python"
WORK="${1:-$(mktemp -d /tmp/first_hour.XXXXXX)}"
DATA="../shared/data/multi30k"
mkdir -p "$WORK"
step() { local name="$1"; shift; local start; start=$(date +%s.%N); "$@"; printf '%-34s %6.1f s\n' "$name" \
  "$(echo "$(date +%s.%N) - $start" | bc)" >> "$WORK/timings.txt"; }
: > "$WORK/timings.txt"

cat > "$WORK/en_fr.yaml" <<EOF
# Keys from docs/config.md.
model:
  preset: tiny
  num_layers: 2
  norm_first: true
data:
  kind: text
  train_source: $DATA/train.en.gz
  train_target: $DATA/train.fr.gz
  valid_source: $DATA/val.en.gz
  valid_target: $DATA/val.fr.gz
  vocab_size: 2000
  tokens_per_batch: 2048
training:
  warmup_steps: 200
  epochs: 4
  steps_per_epoch: 60          # below one pass of the corpus: each epoch is exactly 60 updates
  backup_every_steps: 20       # a kill inside an epoch loses at most 20 updates
  tensorboard: false
  verbose: 2
decoding:
  beam_size: 4
EOF

# 1. A typo and a dry run answer at once (no TensorFlow import).
step "typo in a key (error expected)" bash -c "$KT train --config $WORK/en_fr.yaml --set training.epochz=3 \
  --workdir $WORK/run 2> $WORK/typo.txt || true"
grep -q "Unknown config key 'training.epochz'" "$WORK/typo.txt"
step "train --dry-run" bash -c "$KT train --config $WORK/en_fr.yaml --workdir $WORK/run --dry-run > $WORK/resolved.yaml"

# 2. Train, kill -9 after the second epoch's first backup, run the same command again.
$KT train --config "$WORK/en_fr.yaml" --workdir "$WORK/run" > "$WORK/train1.log" 2>&1 &
PID=$!
start=$(date +%s.%N)
until [ -f "$WORK/run/checkpoints/ckpt-0001.weights.h5" ] && grep -q '"epoch": 1, "batches_done": [1-9]' \
    "$WORK/run/backup/training_metadata.json" 2>/dev/null; do
  kill -0 "$PID" 2>/dev/null || { echo "training ended early"; tail -20 "$WORK/train1.log"; exit 1; }
  sleep 0.5
done
kill -9 "$PID"; wait "$PID" 2>/dev/null || true
printf '%-34s %6.1f s\n' "train until killed (kill -9)" "$(echo "$(date +%s.%N) - $start" | bc)" >> "$WORK/timings.txt"
step "train again: resumes, finishes" bash -c "$KT train --config $WORK/en_fr.yaml --workdir $WORK/run \
  > $WORK/train2.log 2>&1"
grep -q "Resuming from" "$WORK/train2.log"
cut -d, -f1 "$WORK/run/history.csv" | tr '\n' ' ' > "$WORK/epochs.txt"

# 3. Evaluate on the validation split (test sets are not for choosing anything).
step "evaluate (val, 200 sentences)" bash -c "zcat $DATA/val.en.gz | head -200 > $WORK/val200.en; \
  zcat $DATA/val.fr.gz | head -200 > $WORK/val200.fr; \
  $KT evaluate --model $WORK/run --average 2 --source $WORK/val200.en --reference $WORK/val200.fr > $WORK/evaluate.txt"

# 4. Both exports.
step "export (SavedModel)" bash -c "$KT export --workdir $WORK/run --average 2 --out $WORK/saved_model \
  > $WORK/export.txt 2>&1"
step "export (CTranslate2)" bash -c "$KT export --workdir $WORK/run --average 2 --format ctranslate2 \
  --out $WORK/ct2 > $WORK/export_ct2.txt 2>&1"

# 5. Serve: a TensorFlow-only process, and CTranslate2 without TensorFlow.
step "serve: TensorFlow-only process" $PY -c "
import tensorflow as tf, tensorflow_text
loaded = tf.saved_model.load('$WORK/saved_model')
print(loaded.signatures['serving_default'](tf.constant(['A man rides a bike.']))['translation'].numpy()[0].decode())"
step "serve: CTranslate2 (no TensorFlow)" $PY -c "
import sys
from keras_transformer import load_translator
print(load_translator('$WORK/ct2').translate_lines(['A man rides a bike.'])[0])
assert 'tensorflow' not in sys.modules"

# 6. Attention maps.
step "plot-attention" bash -c "$KT plot-attention --model $WORK/saved_model 'A man rides a bike.' \
  --out $WORK/attention --kinds cross > $WORK/plot.txt 2>&1"

echo "epochs in history.csv: $(cat "$WORK/epochs.txt")"
cat "$WORK/evaluate.txt"
cat "$WORK/timings.txt"
echo "everything is in $WORK"
