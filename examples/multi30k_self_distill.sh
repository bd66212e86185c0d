#!/usr/bin/env bash
# The recipe of the shipped English-German model (saved_models/multi30k_en_de), as one command: sequence-level
# self-distillation on Multi30k.
#
#   bash examples/multi30k_self_distill.sh [ROOT] [--set KEY=VALUE ...]
#
# 1. ROOT/teacher: configs/multi30k_en_de.yaml trained by `keras-transformer train` (test2016 left out), its last 10
#    epoch checkpoints averaged and exported to ROOT/teacher_export.
# 2. The teacher translates the training sources with beam 5, alpha 1.0: ROOT/train.kd.de.
# 3. ROOT/student: the same config, trained from scratch with the teacher's vocabulary on each training source twice,
#    once against its reference and once against the teacher's translation; 42 epochs of these 58,000 pairs are about
#    as many updates as the teacher's 84. Its last 5 epoch checkpoints (the same number of updates as the teacher's
#    10) are averaged, test2016 is decoded and scored: ROOT/student/test_scores.yaml.
#
# Every step is skipped when its output exists and each training resumes from its last checkpoint, so rerunning the
# same command after an interruption goes on where it stopped. Extra `--set` options go to both trainings. The
# environment can change: DATA (the Multi30k folder, default ../shared/data/multi30k), CONFIG (default
# configs/multi30k_en_de.yaml), STUDENT_EPOCHS (default 42), KT (the command, default keras-transformer).
# Time on one core of a Zen 5 CPU (AVX512_BF16): about 1 h 45 min for the teacher, 25 min of decoding on two, 1.5 h
# for the student on two; figures in history/experiments.md ("Sequence-level self-distillation").
set -euo pipefail
root=runs/multi30k_en_de_kd
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
    root=$1
    shift
fi
data=${DATA:-../shared/data/multi30k}
config=${CONFIG:-configs/multi30k_en_de.yaml}
kt=${KT:-keras-transformer}
for file in train.{en,de}.gz val.{en,de,lc.norm.tok.de}.gz test_2016_flickr.{en,de,lc.norm.tok.de}.gz; do
    if [ ! -f "$data/$file" ]; then
        echo "$0: $data/$file is missing (set DATA to the Multi30k folder)" >&2
        exit 2
    fi
done
# The shipped model's settings: the config's defaults became relative positions and 8,192-token updates (two
# accumulated batches) for 122 epochs after it was trained (docs/BENCHMARKS.md); `--set model.position=relative
# --set training.gradient_accumulation_steps=2 --set training.epochs=122 --set decoding.average_last=24` distils the
# new recipe's teacher instead (then set STUDENT_EPOCHS and the student's average to match its updates).
paths=(--set "data.valid_source=$data/val.en.gz" --set "data.valid_target=$data/val.de.gz"
       --set "data.valid_tokenized_target=$data/val.lc.norm.tok.de.gz" --set model.position=sinusoidal
       --set training.gradient_accumulation_steps=1 --set training.epochs=84 --set decoding.average_last=10)
mkdir -p "$root"

echo "== 1. teacher: $root/teacher"
"$kt" train --config "$config" --workdir "$root/teacher" "${paths[@]}" \
    --set "data.train_source=$data/train.en.gz" --set "data.train_target=$data/train.de.gz" \
    --set data.test_source=null --set data.test_target=null --set data.test_tokenized_target=null "$@"
if [ ! -f "$root/teacher_export/saved_model.pb" ]; then
    "$kt" export --workdir "$root/teacher" --average 10 --out "$root/teacher_export" --beam-size 5 --alpha 1.0
fi

echo "== 2. the teacher translates the training sources: $root/train.kd.de"
if [ ! -f "$root/train.kd.de" ]; then
    gzip -dc "$data/train.en.gz" | "$kt" translate --model "$root/teacher_export" --beam-size 5 --alpha 1.0 \
        --batch-size 128 > "$root/train.kd.de.tmp"
    mv "$root/train.kd.de.tmp" "$root/train.kd.de"
fi
if [ ! -f "$root/union.de" ]; then
    gzip -dc "$data/train.en.gz" "$data/train.en.gz" > "$root/union.en"
    { gzip -dc "$data/train.de.gz"; cat "$root/train.kd.de"; } > "$root/union.de.tmp"
    mv "$root/union.de.tmp" "$root/union.de"
fi

echo "== 3. student: $root/student"
if [ ! -d "$root/student/data/vocab" ]; then
    mkdir -p "$root/student/data"
    rm -rf "$root/student/data/vocab.tmp"
    cp -r "$root/teacher/data/vocab" "$root/student/data/vocab.tmp"
    mv "$root/student/data/vocab.tmp" "$root/student/data/vocab"
fi
"$kt" train --config "$config" --workdir "$root/student" "${paths[@]}" \
    --set "data.train_source=$root/union.en" --set "data.train_target=$root/union.de" \
    --set "data.test_source=$data/test_2016_flickr.en.gz" --set "data.test_target=$data/test_2016_flickr.de.gz" \
    --set "data.test_tokenized_target=$data/test_2016_flickr.lc.norm.tok.de.gz" \
    --set "training.epochs=${STUDENT_EPOCHS:-42}" --set decoding.average_last=5 "$@"
echo "== done: $root/student/test_scores.yaml; export with"
echo "   $kt export --workdir $root/student --average 5 --out saved_models/multi30k_en_de --overwrite"
