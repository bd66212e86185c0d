"""Training throughput of our model on any Keras backend (JAX on a GPU machine, say), with MFU.

`train_throughput.py` compares implementations on TensorFlow; this script
measures ours alone, on whatever backend `KERAS_BACKEND` names, at a preset
size (the paper's `base` by default), the way `keras-transformer train-packed`
trains: `train_on_batch` with XLA (`jit_compile=True`), a dtype policy, Adam
with the paper's schedule and label smoothing 0.1. Batches are synthetic
token ids of one shape with about 20% padding (lengths uniform in
[0.6 L, L]), so every step is compiled once.

Output: one JSON line for a square-matmul probe (`keras.ops.matmul`,
the best of a few sizes, in the compute dtype of the policy) and one per
measured configuration: non-pad target tokens/s, median step time, model
TFLOP/s (matmuls of forward and backward over the padded batch, as in
`train_throughput.model_gflop_per_step`) and MFU against the probe and
against a nominal peak given with `--peak-tflops` (e.g. 989 for an H100 SXM's
dense bfloat16).

Usage:

    KERAS_BACKEND=jax python bench/backend_throughput.py --preset base --batch-size 128 --length 64 \\
        --precision mixed_bfloat16 --peak-tflops 989
"""

import argparse
import json
import statistics
import time

import numpy as np
from train_throughput import make_batches, model_gflop_per_step


def matmul_probe(dtype, sizes=(4096, 8192), seconds=2.0):
    """Best achieved TFLOP/s of a square `keras.ops.matmul` in `dtype` (wall clock, synchronised).

    Each size runs for about `seconds` after a warm-up of the same length (a GPU raises its clocks under load).
    """
    import keras
    best = 0.0
    for n in sizes:
        a = keras.random.normal((n, n), dtype=dtype)
        b = keras.random.normal((n, n), dtype=dtype)
        for timed in (False, True):
            start, count = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                for _ in range(10):
                    out = keras.ops.matmul(a, b)
                keras.ops.convert_to_numpy(out[0, 0])  # wait for the queued products
                count += 10
            if timed:
                best = max(best, 2 * n ** 3 * count / (time.perf_counter() - start) / 1e12)
    return best


def measure(preset, vocab_size, batch_size, length, precision, steps, warmup, jit_compile):
    import keras

    import keras_transformer as kt
    from keras_transformer.config import recommended_warmup_steps
    from keras_transformer.experiment import TrainingSection
    keras.config.set_dtype_policy(precision)
    config = kt.TransformerConfig.preset(preset, vocab_size=vocab_size)
    model = kt.build_model(config)
    training = TrainingSection(warmup_steps=recommended_warmup_steps(preset))  # the paper's Adam and smoothing
    model.compile(optimizer=kt.make_optimizer(config, training), jit_compile=jit_compile,
                  loss=kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=0))
    shape = dict(vocab_size=vocab_size, num_layers=config.num_layers, d_model=config.d_model,
                 num_heads=config.num_heads, d_ff=config.d_ff, batch_size=batch_size, source_length=length,
                 target_length=length, min_length=max(2, int(0.6 * length)))
    batches = make_batches(4, seed=0, config=shape)
    times = []
    for i in range(warmup + steps):
        source, target_in, labels = batches[i % len(batches)]
        start = time.perf_counter()
        model.train_on_batch({"source": source, "target": target_in}, labels)  # returns numpy: synchronised
        if i >= warmup:
            times.append(time.perf_counter() - start)
    tokens = np.mean([np.count_nonzero(b[2]) for b in batches])
    step = statistics.median(times)
    tflops = model_gflop_per_step(shape) / step / 1e3
    return {"preset": preset, "precision": precision, "batch_size": batch_size, "length": length,
            "parameters": model.count_params(), "median_step_ms": round(step * 1e3, 2),
            "target_tokens_per_s": round(tokens / step), "model_tflops": round(tflops, 2)}


def main(argv=None):
    import keras
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab-size", type=int, default=37000, help="the paper's shared EN-DE BPE vocabulary")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[128], help="sentence pairs per step")
    parser.add_argument("--length", type=int, default=64, help="padded source and target length")
    parser.add_argument("--precision", nargs="+", default=["mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-jit", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="nominal peak of the compute dtype, for a second MFU")
    parser.add_argument("--probe-sizes", type=int, nargs="+", default=[4096, 8192],
                        help="square matmul sizes of the peak probe (smaller on a CPU: 8192 takes seconds a product)")
    args = parser.parse_args(argv)
    probes = {}
    for precision in args.precision:
        compute = keras.dtype_policies.get(precision).compute_dtype
        if compute not in probes:
            probes[compute] = matmul_probe(compute, sizes=args.probe_sizes)
            print(json.dumps({"probe": f"matmul {compute}", "backend": keras.config.backend(),
                              "tflops": round(probes[compute], 2)}), flush=True)
        for batch_size in args.batch_size:
            row = measure(args.preset, args.vocab_size, batch_size, args.length, precision, args.steps, args.warmup,
                          not args.no_jit)
            row["mfu_of_probe"] = round(row["model_tflops"] / probes[compute], 3)
            if args.peak_tflops:
                row["mfu_of_nominal"] = round(row["model_tflops"] / args.peak_tflops, 3)
            row["backend"] = keras.config.backend()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
