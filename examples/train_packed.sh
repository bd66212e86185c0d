#!/usr/bin/env bash
# Trains several packed workdirs (keras-transformer pack) side by side on one machine, with a time limit,
# then averages the last N epoch checkpoints of each. For a GPU machine without TensorFlow (docs/gpu.md):
# a Multi30k-sized model leaves most of a large GPU idle, so several runs share it with little slowdown each.
#
#   bash examples/train_packed.sh EPOCHS SECONDS AVERAGE WORKDIR...
#
# Each run stops after EPOCHS epochs or SECONDS seconds (SIGTERM), whichever comes first; finished epochs are
# kept (checkpoints are written atomically) and rerunning resumes after the last one. Logs go to
# WORKDIR/train.log; the average of the last AVERAGE epochs to WORKDIR/averaged.weights.h5, written by a run
# that finishes as it ends, and for a run the time limit stopped once every run has ended. Extra options for
# `keras-transformer train-packed` can be given in ARRAYS_OPTIONS (e.g. "--precision mixed_bfloat16").
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 EPOCHS SECONDS AVERAGE WORKDIR..." >&2
    exit 2
fi
epochs=$1 seconds=$2 average=$3
shift 3
for workdir in "$@"; do
    if [ ! -d "$workdir/arrays" ] && [ ! -f "$workdir/arrays.npz" ]; then
        echo "$workdir is not a packed workdir (no arrays/): run keras-transformer pack first" >&2
        exit 2
    fi
done
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1  # JAX: let the runs share the GPU's memory
python=${PYTHON:-python3}
pids=()
for workdir in "$@"; do  # a run that ends by itself averages its last epochs before it exits
    # shellcheck disable=SC2086
    timeout -k 30 "$seconds" "$python" -m keras_transformer.cli train-packed "$workdir" --epochs "$epochs" \
        --keep-checkpoints "$average" --average-last "$average" ${ARRAYS_OPTIONS:-} >>"$workdir/train.log" 2>&1 &
    pids+=("$!")
done
workdirs=("$@")
stopped=()
for i in "${!pids[@]}"; do  # the time limit (or a failure) stopped the others before they averaged
    wait "${pids[$i]}" || stopped+=("${workdirs[$i]}")
done
status=0
pids=()
for workdir in ${stopped[@]+"${stopped[@]}"}; do  # --epochs 0: train nothing more, average what the run finished
    "$python" -m keras_transformer.cli train-packed "$workdir" --epochs 0 --average-last "$average" \
        >>"$workdir/train.log" 2>&1 &
    pids+=("$!")
done
for pid in ${pids[@]+"${pids[@]}"}; do
    wait "$pid" || status=1
done
for workdir in "$@"; do
    echo "== $workdir: $(grep -c . "$workdir/history.csv" 2>/dev/null || echo 0) history lines"
    tail -n 2 "$workdir/history.csv" 2>/dev/null
done
exit $status
