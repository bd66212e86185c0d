"""One training step's peak memory and time: full fine-tuning against LoRA, for models of NLLB-600M's and
NLLB-1.3B's shape.

Models of NLLB's shapes (a shared, tied vocabulary of 256,206 tokens, d_model 1024, 16 heads; 600M: 12 + 12 layers,
d_ff 4096; 1.3B: 24 + 24 layers, d_ff 8192; post-norm, sinusoidal positions: NLLB's sizes, which are what memory
depends on), float32, random weights written once per shape as the base weights file (`training.init_checkpoint`).
Each case runs in a process of its own, one after the other, through the trainer's own `compile_model` (the run's
Adam on the Noam schedule, the label-smoothed loss, the token accuracy; with `training.lora: {rank: 16}` the
adapters on every attention projection and feed-forward layer, the rest frozen) and `keras.Model.fit` on random
batches of 32 x 32 source and 32 x 32 target tokens (1,024-token batches): `--steps` updates, the first of which
traces the step. The child reports its own peak RSS (VmHWM; `peak_rss.py`), and apart the peaks of building and
loading the model and of the updates (VmHWM reset between them through `/proc/self/clear_refs`), the median time
of the updates after the first, the trainable parameters, the optimizer's state (Adam's slots) and the gradients'
size (one per trainable variable: Keras' `train_step` differentiates the loss with respect to the trainable
variables only).
`--chunked-loss false,true` runs each case with the whole `(tokens, V)` logits and with the loss computed a
vocabulary block at a time (`training.chunked_loss`; `auto`, the default, chunks the LoRA cases only).

Full fine-tuning of the 1.3B shape needs more memory than a machine of 24 GB has (16 bytes a parameter before any
activation: 21.9 GB): it is not run unless `--full-1.3b` is given, and then under the `--cap-gib` RSS cap (the
child is killed above it, and reported so). Its need is estimated from the 600M run: the peak above a process that
loads the same modules, per parameter, times the 1.3B shape's parameters, plus that baseline.

Usage:

    python bench/lora_memory.py                      # 600M full and LoRA, 1.3B LoRA (1.3B full: estimated)
    python bench/lora_memory.py --shapes 600m --steps 3 --chunked-loss false,true
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import tempfile

from peak_rss import run_child

SHAPES = {"600m": dict(num_layers=12, d_ff=4096), "1.3b": dict(num_layers=24, d_ff=8192),
          "tiny": dict(num_layers=1, d_ff=256, d_model=64, num_heads=4, vocab_size=1000)}
NLLB = dict(d_model=1024, num_heads=16, vocab_size=256206, tie_embeddings="all", max_length=1024, dropout=0.1,
            pad_id=1, bos_id=2, eos_id=2, unk_id=3, position="sinusoidal", scale_embeddings=True)
ROWS, LENGTH = 32, 32  # 1,024 source and 1,024 target tokens a batch

BASE = """
import sys
from keras_transformer.config import TransformerConfig
from keras_transformer.model import build_model
model = build_model(TransformerConfig(**__import__("json").loads(sys.argv[1])))
model.save_weights(sys.argv[2])
print("PARAMETERS", model.count_params())
"""

STEP = """
import json, sys, time
import keras, numpy as np
from keras_transformer.experiment import ExperimentConfig
from keras_transformer.trainer.loop import TrainingData, compile_model
model_fields, base, lora, chunked, steps, rows, length = json.loads(sys.argv[1])
training = {"init_checkpoint": base, "warmup_steps": 100, "chunked_loss": chunked}
if lora:
    training["lora"] = {"rank": 16}
experiment = ExperimentConfig.from_dict({"model": model_fields, "training": training,
                                         "data": {"kind": "synthetic", "vocab_size": model_fields["vocab_size"]}})
config = experiment.model_config()
data = TrainingData(train=None, validation=None, source_vocab_size=config.vocab_size,
                    target_vocab_size=config.vocab_size)
model = compile_model(experiment, config, data)
high_water = lambda: int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1])
loaded = high_water()  # KiB: building, loading the base weights, compiling
open("/proc/self/clear_refs", "w").write("5")  # VmHWM starts again from the resident memory now
rng = np.random.default_rng(0)
source = rng.integers(4, config.vocab_size, (steps * rows, length)).astype("int32")
target = rng.integers(4, config.vocab_size, (steps * rows, length + 1)).astype("int32")
target[:, 0] = config.bos_id
inputs = {"source": source, "target": target[:, :-1]}

class Times(keras.callbacks.Callback):
    seconds = []
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)

model.fit(inputs, target[:, 1:], batch_size=rows, epochs=1, shuffle=False, verbose=0, callbacks=[Times()])
size = lambda variables: sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
print("RESULT", json.dumps({
    "seconds": Times.seconds, "parameters": model.count_params(),
    "trainable": sum(int(np.prod(v.shape)) for v in model.trainable_variables),
    "optimizer_bytes": size(model.optimizer.variables), "gradient_bytes": size(model.trainable_variables),
    "weight_bytes": size(model.weights), "jit_compile": bool(model.jit_compile),
    "loaded_kib": loaded, "steps_kib": high_water(), "chunked": type(model).__name__ == "ChunkedLossTransformer"}))
"""

MODULES = "import keras_transformer.trainer.loop, keras_transformer.experiment, keras; keras.ops.zeros(1)\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="600m,1.3b")
    parser.add_argument("--cases", default="full,lora", help="full fine-tuning, LoRA, or both")
    parser.add_argument("--chunked-loss", default="auto",
                        help="training.chunked_loss of each case: auto, true, false, or several (false,true)")
    parser.add_argument("--steps", type=int, default=2, help="updates a case runs (the first traces the step)")
    parser.add_argument("--cap-gib", type=float, default=14.0, help="a child above this RSS is killed")
    parser.add_argument("--full-1.3b", dest="full_13b", action="store_true",
                        help="run full fine-tuning of the 1.3B shape (under the cap) instead of estimating it")
    args = parser.parse_args()
    cap = args.cap_gib * 1024
    root = pathlib.Path(tempfile.mkdtemp(prefix="lora_memory_"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    try:
        _, baseline, _ = run_child(MODULES, env=env)
        print(f"# lora_memory: {ROWS} x {LENGTH} + {ROWS} x {LENGTH} tokens a batch, {args.steps} updates a case, "
              f"float32; baseline RSS {baseline:.0f} MiB; load average {os.getloadavg()[0]:.1f}", flush=True)
        print("| shape | parameters | fine-tuning | trainable | Adam's state | gradients | peak RSS (loading; steps) "
              "| above baseline "
              "| per parameter | update (median after the first) |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
        per_parameter, compiled = {}, set()
        for shape in args.shapes.split(","):
            fields = {**NLLB, **SHAPES[shape]}
            base = root / f"{shape}.weights.h5"
            seconds, _, out = run_child(BASE, [json.dumps(fields), str(base)], cap_mib=cap, env=env)
            parameters = next(int(line.split()[1]) for line in out.splitlines() if line.startswith("PARAMETERS"))
            settings = [value if value == "auto" else json.loads(value) for value in args.chunked_loss.split(",")]
            for lora, chunked in [(case == "lora", chunked) for case in args.cases.split(",") for chunked in settings]:
                name = "LoRA r16" if lora else "full"
                if shape == "1.3b" and not lora and not args.full_13b:
                    cost = per_parameter.get("full")
                    if cost is None:
                        print(f"| {shape} | {parameters / 1e9:.2f}B | {name} | not run | | | | | | |", flush=True)
                    else:
                        estimate = baseline + cost * parameters / 2**20
                        print(f"| {shape} | {parameters / 1e9:.2f}B | {name} (estimated) | {parameters / 1e9:.2f}B "
                              f"| {8 * parameters / 2**30:.1f} GiB | {4 * parameters / 2**30:.1f} GiB | "
                              f"**{estimate / 1024:.1f} GiB** | | {cost:.1f} B | |", flush=True)
                    continue
                case = [fields, str(base), lora, chunked, args.steps, ROWS, LENGTH]
                _, peak, out = run_child(STEP, [json.dumps(case)], cap_mib=cap, env=env)
                if peak is None:
                    print(f"| {shape} | {parameters / 1e9:.2f}B | {name} | | | | killed above {args.cap_gib:g} GiB "
                          "| | | |", flush=True)
                    continue
                result = json.loads(next(line.split(" ", 1)[1] for line in out.splitlines()
                                         if line.startswith("RESULT ")))
                loaded, steps = result["loaded_kib"] / 1024, result["steps_kib"] / 1024
                name += ", chunked loss" if result["chunked"] else ", whole logits"
                peak = max(peak, loaded)  # the child's own VmHWM at its end is that of the steps
                cost = (peak - baseline) * 2**20 / parameters
                compiled.add(result["jit_compile"])
                if chunked != (not lora):  # the default: the full run's whole logits, LoRA's chunked loss
                    per_parameter.setdefault("lora" if lora else "full", cost)
                step = statistics.median(result["seconds"][1:] or result["seconds"])
                print(f"| {shape} | {parameters / 1e9:.2f}B | {name} | {result['trainable'] / 1e6:.1f}M | "
                      f"{result['optimizer_bytes'] / 2**20:.0f} MiB | {result['gradient_bytes'] / 2**20:.0f} MiB | "
                      f"**{peak / 1024:.1f} GiB** ({loaded / 1024:.1f}; {steps / 1024:.1f}) | "
                      f"{(peak - baseline) / 1024:.1f} GiB | {cost:.1f} B | "
                      f"{step:.1f} s |", flush=True)
            base.unlink()
        print(f"# the training step compiled with XLA (jit_compile): {sorted(compiled)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
