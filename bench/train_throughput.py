"""Training throughput: our Transformer against keras-hub's and PyTorch's, side by side.

One configuration for everyone: shared vocabulary of 8000, 3 encoder + 3 decoder
layers, d_model 256, 4 heads, d_ff 1024, dropout 0.1, post-norm, batches of 64
sentence pairs padded to 32 source and 32 target tokens (about 20% padding),
Adam, label smoothing 0.1.

Implementations (`--impl`, comma separated):

    ours            keras_transformer.build_model + LabelSmoothedCrossEntropy
    ours_xla        the same, compiled with jit_compile=True
    keras_hub       keras_hub.layers TokenAndPositionEmbedding / TransformerEncoder /
                    TransformerDecoder + Dense head, categorical cross-entropy
                    with label_smoothing=0.1 (pads masked by the Keras mask)
    keras_hub_xla   the same with jit_compile=True
    torch           torch.nn.Transformer, nn.functional.cross_entropy(label_smoothing=0.1)
    torch_compile   the same through torch.compile (PyTorch's compiler; no XLA on CPU)

Every framework runs in its own worker process; the parent drives all workers
in lock step, one training step of each implementation in turn (the order
rotates every step), on the same batches. The per-step ratio of step times is
therefore taken under the same machine load, which is what makes it usable on a
shared, noisy machine: quote the paired median ratio on the last line, not the
absolute figures (separate runs drift by +-15%).

Output: JSON lines, one per implementation (non-pad target tokens/s, median step
time and CPU seconds, parameters, achieved model GFLOP/s and its fraction of the
measured matmul peak), one line with the peak-matmul probe (best float32 and
bfloat16 square matmul, by wall clock and per CPU-second), and last the paired
median ratios of the first implementation against each of the others, by wall
clock and by CPU seconds per step. Model FLOPs are the matmuls of forward and
backward over the padded batch (`model_gflop_per_step`). Both fractions of peak
are printed: by wall clock (the probe's wall figure is a lower bound of the
peak when other jobs share the machine) and per CPU-second (model GFLOP per
CPU-second of the step over the probe's GFLOP per CPU-second), which other jobs
disturb much less.

Usage:

    python bench/train_throughput.py --impl ours,keras_hub,torch
    python bench/train_throughput.py --impl ours_xla,keras_hub --dtype mixed_bfloat16 --steps 30
    python bench/train_throughput.py --impl ours@mixed_bfloat16,keras_hub@float32   # mixed dtypes, still paired
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CONFIG = dict(vocab_size=8000, num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1,
              attention_dropout=0.1,  # keras-hub's and torch's layers drop attention weights too
              batch_size=64, source_length=32, target_length=32, min_length=19,
              label_smoothing=0.1, learning_rate=1e-4)
PAD, BOS, EOS = 0, 2, 3
FRAMEWORK = {"ours": "tf", "ours_xla": "tf", "keras_hub": "tf", "keras_hub_xla": "tf",
             "torch": "torch", "torch_compile": "torch"}


# --------------------------------------------------------------------------- data and arithmetic
def make_batches(count, seed=0, config=CONFIG):
    """`count` batches of (source, decoder input, labels), int32, lengths uniform in [min_length, length].

    With lengths 19..32 of 32 the batches are about 20% padding, like length-bucketed real text.
    """
    rng = np.random.default_rng(seed)
    b, s_len, t_len, low = (config["batch_size"], config["source_length"], config["target_length"],
                            config["min_length"])
    batches = []
    for _ in range(count):
        source = np.zeros((b, s_len), "int32")
        target_in = np.zeros((b, t_len), "int32")
        labels = np.zeros((b, t_len), "int32")
        for i in range(b):
            n = rng.integers(low, s_len + 1)
            source[i, :n - 1] = rng.integers(4, config["vocab_size"], n - 1)
            source[i, n - 1] = EOS
            m = rng.integers(low, t_len + 1)
            sentence = np.append(rng.integers(4, config["vocab_size"], m - 1), EOS)  # (m,)
            labels[i, :m] = sentence
            target_in[i, 0] = BOS
            target_in[i, 1:m] = sentence[:-1]
        batches.append((source, target_in, labels))
    return batches


def model_gflop_per_step(config=CONFIG):
    """Matmul FLOPs of one training step (forward x 3) over the padded batch, in GFLOP.

    Counts the projections, attention scores and weighted sums, the FFN and the
    output projection; embeddings, norms, softmax and the optimizer are left out
    (the usual "model FLOPs" of MFU figures).
    """
    d, f, v, n = config["d_model"], config["d_ff"], config["vocab_size"], config["num_layers"]
    b, s, t = config["batch_size"], config["source_length"], config["target_length"]
    encoder = b * s * (2 * 4 * d * d + 2 * 2 * d * f + 2 * 2 * s * d)  # QKV+O, FFN, QK^T and AV
    decoder = (b * t * (2 * 4 * d * d + 2 * 2 * t * d  # masked self-attention
                        + 2 * 2 * d * d + 2 * 2 * s * d  # cross-attention Q, O, QK^T, AV
                        + 2 * 2 * d * f)  # FFN
               + b * s * 2 * 2 * d * d)  # cross-attention K, V of the memory
    head = b * t * 2 * d * v
    return 3 * (n * encoder + n * decoder + head) / 1e9


# --------------------------------------------------------------------------- TensorFlow / Keras
def _keras_setup(dtype):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    keras.config.set_dtype_policy(dtype)
    return keras


def _adam(keras):
    return keras.optimizers.Adam(CONFIG["learning_rate"], beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def build_ours(jit_compile):
    """Our model as a user trains it: build_model + LabelSmoothedCrossEntropy."""
    import keras

    import keras_transformer as kt
    config = kt.TransformerConfig(vocab_size=CONFIG["vocab_size"], num_layers=CONFIG["num_layers"],
                                  d_model=CONFIG["d_model"], num_heads=CONFIG["num_heads"],
                                  d_ff=CONFIG["d_ff"], dropout=CONFIG["dropout"],
                                  attention_dropout=CONFIG["attention_dropout"], norm_first=False)
    model = kt.build_model(config)
    model.compile(optimizer=_adam(keras), jit_compile=jit_compile,
                  loss=kt.LabelSmoothedCrossEntropy(CONFIG["label_smoothing"], pad_id=PAD))
    return model


def build_keras_hub(jit_compile):
    """The model a keras-hub user writes (the keras.io translation example, sized to CONFIG).

    One TokenAndPositionEmbedding with mask_zero=True shared by source and target
    (shared vocabulary); its Keras mask carries the padding through the encoder,
    the decoder and the Dense head into the loss, which therefore averages over
    non-pad tokens only.
    """
    import keras
    import keras_hub
    from keras import ops

    v, d = CONFIG["vocab_size"], CONFIG["d_model"]
    source = keras.Input(shape=(None,), dtype="int32", name="source")
    target = keras.Input(shape=(None,), dtype="int32", name="target")
    embedding = keras_hub.layers.TokenAndPositionEmbedding(v, 256, d, mask_zero=True, name="embedding")
    x = embedding(source)
    for i in range(CONFIG["num_layers"]):
        x = keras_hub.layers.TransformerEncoder(CONFIG["d_ff"], CONFIG["num_heads"], dropout=CONFIG["dropout"],
                                                name=f"encoder_{i}")(x)
    y = embedding(target)
    for i in range(CONFIG["num_layers"]):
        y = keras_hub.layers.TransformerDecoder(CONFIG["d_ff"], CONFIG["num_heads"], dropout=CONFIG["dropout"],
                                                name=f"decoder_{i}")(y, x)
    logits = keras.layers.Dense(v, name="head")(y)
    # The Keras mixed-precision recipe: compute in the policy's dtype, hand float32 to the loss.
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    model = keras.Model({"source": source, "target": target}, logits)

    def smoothed_cross_entropy(labels, logits):
        return keras.losses.categorical_crossentropy(ops.one_hot(labels, v), logits, from_logits=True,
                                                     label_smoothing=CONFIG["label_smoothing"])

    model.compile(optimizer=_adam(keras), loss=smoothed_cross_entropy, jit_compile=jit_compile)
    return model


class KerasRunner:
    """One Keras implementation: a compiled model stepped with train_on_batch."""

    def __init__(self, impl, batches, dtype):
        import keras
        import tensorflow as tf
        keras.config.set_dtype_policy(dtype)  # layers take the policy in force when they are built
        builder = build_ours if impl.startswith("ours") else build_keras_hub
        self.model = builder(jit_compile=impl.endswith("_xla"))
        self.batches = [({"source": tf.constant(s), "target": tf.constant(t)}, tf.constant(y))
                        for s, t, y in batches]
        self.params = self.model.count_params()

    def step(self, i):
        x, y = self.batches[i % len(self.batches)]
        return float(self.model.train_on_batch(x, y))  # returns host floats: the step has finished


def _best_rate(matmul, sizes=(1024, 2048, 3072), repeats=6, budget_s=4.0):
    """Best GFLOP/s of `matmul(n)` over sizes and repeats, by wall clock and per CPU-second.

    On a shared machine the wall-clock figure is a lower bound of the peak; the CPU-time
    figure (FLOPs per CPU-second of this process, times the core count) is not hurt by
    other jobs, and approaches the hardware's peak when this process has the cores.
    Each size gets at most `budget_s` seconds, and a size that overruns it ends the probe:
    a dtype without a native kernel (bfloat16 on a CPU without AVX512_BF16/AMX, through
    PyTorch) runs a scalar fallback whose 3072 x 3072 matmuls would take minutes.
    """
    wall = per_cpu = 0.0
    for n in sizes:
        run = matmul(n)
        run()
        flop = 2 * n ** 3 / 1e9
        spent = 0.0
        for _ in range(repeats):
            cpu, start = time.process_time(), time.perf_counter()
            run()
            seconds = time.perf_counter() - start
            spent += seconds
            wall = max(wall, flop / seconds)
            per_cpu = max(per_cpu, flop / max(time.process_time() - cpu, 1e-9))
            if spent > budget_s:
                break
        if spent > budget_s:
            break
    return {"wall": wall, "per_cpu_second": per_cpu}


def tf_probe():
    """Float32 and bfloat16 square-matmul peak through TensorFlow (oneDNN; AMX for bfloat16)."""
    import tensorflow as tf

    def maker(dtype):
        def matmul(n):
            a, b = tf.cast(tf.random.normal((n, n)), dtype), tf.cast(tf.random.normal((n, n)), dtype)
            run = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
            return lambda: run().numpy()
        return matmul

    return {"float32": _best_rate(maker(tf.float32)), "bfloat16": _best_rate(maker(tf.bfloat16))}


# --------------------------------------------------------------------------- PyTorch
def build_torch(dtype, compiled):
    """torch.nn.Transformer sized to CONFIG, with tied embeddings and sinusoidal positions."""
    import math

    import torch
    from torch import nn
    torch.manual_seed(0)
    v, d = CONFIG["vocab_size"], CONFIG["d_model"]

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(v, d, padding_idx=PAD)
            nn.init.normal_(self.embedding.weight, std=d ** -0.5)  # as ours: unit variance after the sqrt(d) scale
            position = torch.arange(256).unsqueeze(1)
            rate = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
            table = torch.zeros(256, d)
            table[:, 0::2] = torch.sin(position * rate)
            table[:, 1::2] = torch.cos(position * rate)
            self.register_buffer("positions", table)
            self.dropout = nn.Dropout(CONFIG["dropout"])
            self.transformer = nn.Transformer(d, CONFIG["num_heads"], CONFIG["num_layers"], CONFIG["num_layers"],
                                              CONFIG["d_ff"], CONFIG["dropout"], batch_first=True)

        def embed(self, ids):
            return self.dropout(self.embedding(ids) * math.sqrt(d) + self.positions[: ids.shape[1]])

        def forward(self, source, target):
            length = target.shape[1]
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)  # True = may not attend
            h = self.transformer(self.embed(source), self.embed(target), tgt_mask=causal, tgt_is_causal=True,
                                 src_key_padding_mask=source == PAD, tgt_key_padding_mask=target == PAD,
                                 memory_key_padding_mask=source == PAD)
            return h @ self.embedding.weight.t()  # tied pre-softmax projection, (B, T, V)

    model = Seq2Seq()
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG["learning_rate"], betas=(0.9, 0.98), eps=1e-9)
    autocast = dtype == "mixed_bfloat16"

    def loss_fn(source, target, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(source, target)
        return nn.functional.cross_entropy(logits.float().reshape(-1, v), labels.reshape(-1), ignore_index=PAD,
                                           label_smoothing=CONFIG["label_smoothing"])

    forward = torch.compile(loss_fn) if compiled else loss_fn

    def train_step(source, target, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = forward(source, target, labels)
        loss.backward()
        optimizer.step()
        return float(loss)

    return model, train_step


class TorchRunner:
    def __init__(self, impl, batches, dtype):
        import torch
        torch.set_num_threads(os.cpu_count())
        self.model, self.train_step = build_torch(dtype, compiled=impl == "torch_compile")
        self.model.train()
        self.batches = [tuple(torch.from_numpy(a.astype("int64")) for a in batch) for batch in batches]
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self, i):
        return self.train_step(*self.batches[i % len(self.batches)])


def torch_probe():
    """Float32 and bfloat16 square-matmul peak through PyTorch."""
    import torch

    def maker(dtype):
        def matmul(n):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            return lambda: torch.mm(a, b)
        return matmul

    return {"float32": _best_rate(maker(torch.float32)), "bfloat16": _best_rate(maker(torch.bfloat16))}


# --------------------------------------------------------------------------- worker and driver
DTYPES = ("float32", "mixed_bfloat16")


def _name(impl):
    """`ours@mixed_bfloat16` -> `ours`."""
    return impl.split("@")[0]


def _dtype(impl, default):
    """`ours@mixed_bfloat16` -> `mixed_bfloat16`; `ours` -> the `--dtype` default."""
    return impl.split("@")[1] if "@" in impl else default


def worker(args):
    """Runs the implementations of one framework; steps them when the parent says so."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # libraries may print; the protocol channel stays clean
    impls = args.impl.split(",")
    batches = make_batches(args.batches)
    if args.worker == "tf":
        _keras_setup(args.dtype)
        peaks = tf_probe() if args.probe else {}
        runners = {impl: KerasRunner(_name(impl), batches, _dtype(impl, args.dtype)) for impl in impls}
    else:
        peaks = torch_probe() if args.probe else {}
        runners = {impl: TorchRunner(_name(impl), batches, _dtype(impl, args.dtype)) for impl in impls}
    for impl, runner in runners.items():
        for i in range(args.warmup):
            runner.step(i)
    protocol.write(json.dumps({"ready": {impl: r.params for impl, r in runners.items()}, "peaks": peaks}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("stop"):
            break
        step, times = command["step"], {}
        order = impls[step % len(impls):] + impls[: step % len(impls)]
        for impl in order:
            cpu, start = time.process_time(), time.perf_counter()
            loss = runners[impl].step(step)
            times[impl] = (time.perf_counter() - start, time.process_time() - cpu, loss)
        protocol.write(json.dumps({"times": times}) + "\n")


def drive(args):
    impls = args.impl.split(",")
    unknown = [impl for impl in impls if _name(impl) not in FRAMEWORK or _dtype(impl, args.dtype) not in DTYPES]
    if unknown:
        raise SystemExit(f"unknown --impl {unknown}; choose from {sorted(FRAMEWORK)}")
    groups = {}
    for impl in impls:
        groups.setdefault(FRAMEWORK[_name(impl)], []).append(impl)
    if "torch" in groups:
        try:
            import importlib.util
            if importlib.util.find_spec("torch") is None:
                raise ImportError
        except ImportError:
            print(json.dumps({"skipped": groups.pop("torch"), "reason": "torch is not installed"}), flush=True)
            impls = [impl for impl in impls if FRAMEWORK[_name(impl)] != "torch"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    workers, params, peaks = {}, {}, {}
    for framework, members in groups.items():
        command = [sys.executable, os.path.abspath(__file__), "--worker", framework, "--impl", ",".join(members),
                   "--dtype", args.dtype, "--warmup", str(args.warmup), "--batches", str(args.batches),
                   "--probe" if args.probe else "--no-probe"]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=env, bufsize=1)
        # Wait until this worker has built, probed and warmed up before starting the next one:
        # two probes at once would share the cores and understate the peak.
        ready = json.loads(process.stdout.readline())
        workers[framework] = process
        params.update(ready["ready"])
        for name, rates in ready["peaks"].items():
            best = peaks.setdefault(name, {"wall": 0.0, "per_cpu_second": 0.0})
            for key, value in rates.items():
                best[key] = max(best[key], value)
    times = {impl: [] for impl in impls}
    cpu_times = {impl: [] for impl in impls}
    losses = {impl: [] for impl in impls}
    names = list(workers)
    for step in range(args.steps):
        for framework in names[step % len(names):] + names[: step % len(names)]:
            process = workers[framework]
            process.stdin.write(json.dumps({"step": step + args.warmup}) + "\n")
            process.stdin.flush()
            for impl, (seconds, cpu_seconds, loss) in json.loads(process.stdout.readline())["times"].items():
                times[impl].append(seconds)
                cpu_times[impl].append(cpu_seconds)
                losses[impl].append(loss)
    for process in workers.values():
        process.stdin.write(json.dumps({"stop": True}) + "\n")
        process.stdin.flush()
        process.wait()

    tokens = float(np.mean([np.count_nonzero(labels) for _, _, labels in make_batches(args.batches)]))
    gflop = model_gflop_per_step()
    for impl in impls:
        dtype = _dtype(impl, args.dtype)
        peak = peaks.get("bfloat16" if dtype == "mixed_bfloat16" else "float32")
        median, median_cpu = statistics.median(times[impl]), statistics.median(cpu_times[impl])
        record = {"impl": _name(impl), "dtype": dtype, "steps": len(times[impl]), "median_step_s": round(median, 4),
                  "median_cpu_s": round(median_cpu, 4), "tokens_per_s": round(tokens / median, 1),
                  "params": params[impl], "model_gflop_per_step": round(gflop, 2),
                  "gflop_per_s": round(gflop / median, 1),
                  # achieved model GFLOP/s over the probe's best matmul GFLOP/s, both by wall clock
                  "fraction_of_peak": round(gflop / median / peak["wall"], 3) if peak else None,
                  # the same per CPU-second: what share of the cores' matmul rate the step turns into model FLOPs
                  "fraction_of_peak_cpu": round(gflop / median_cpu / peak["per_cpu_second"], 3) if peak else None,
                  "first_loss": round(losses[impl][0], 3), "last_loss": round(losses[impl][-1], 3)}
        print(json.dumps(record), flush=True)
    if peaks:
        print(json.dumps({"probe_peak_gflop_per_s": {name: round(rates["wall"], 1) for name, rates in peaks.items()},
                          "probe_gflop_per_cpu_second": {name: round(rates["per_cpu_second"], 1)
                                                         for name, rates in peaks.items()},
                          "cpu_count": os.cpu_count()}), flush=True)
    subject = impls[0]

    def paired(series):
        return {f"{subject}/{other}": round(statistics.median(
            [o / s for s, o in zip(series[subject], series[other])]), 3) for other in impls[1:]}

    print(json.dumps({"paired_median_speedup": paired(times), "paired_median_cpu_ratio": paired(cpu_times),
                      "dtype": args.dtype, "steps": args.steps,
                      "meaning": f"median over steps of step_time(other) / step_time({subject}); "
                                 "the CPU ratio uses each process's CPU seconds per step, less sensitive "
                                 "to other jobs on the machine"}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="ours,keras_hub,torch",
                        help=f"comma-separated, first one is compared to the others; from {sorted(FRAMEWORK)}, "
                             "each optionally with its own dtype: ours@mixed_bfloat16,keras_hub@float32")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype policy of every impl without @")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per implementation")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (tracing, XLA compilation)")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    parser.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the float32 and bfloat16 matmul peak")
    parser.add_argument("--worker", choices=["tf", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
