"""Peak memory of a LiteRT conversion (`exports.litert.convert`) against the model's weight bytes, per model shape.

    .venv/bin/python bench/litert_memory.py [--shapes 1x64x1000,2x256x16000] [--precision float32] [--cap-gib 7]
                                            [--repo PATH]

Each shape is `layers x d_model x vocabulary` (heads d_model / 64, d_ff 4 d_model, shared vocabulary, random
weights), built and converted with beam search (beam 4), greedy and score signatures in a child process of its
own; its peak RSS is the child's `VmHWM` (`peak_rss.py`), and it is killed above `--cap-gib` (the row then says
so). `--repo` converts with another checkout's package (a before/after comparison). The child's resident memory
with TensorFlow and the model loaded, before converting, is given too: the conversion's own cost is the
difference.
"""

import argparse
import os
import pathlib

from peak_rss import run_child

REPO = pathlib.Path(__file__).resolve().parents[1]

CHILD = r"""
import sys
layers, d_model, vocabulary, precision = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import keras_transformer as kt
from keras_transformer.config import TransformerConfig
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.exports import litert
config = TransformerConfig(vocab_size=vocabulary, num_layers=layers, d_model=d_model, num_heads=max(1, d_model // 64),
                           d_ff=4 * d_model, max_length=128)
model = kt.build_model(config)
resident = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmRSS')) / 1024
print('WEIGHTS', sum(w.size * w.dtype.itemsize for w in model.get_weights()) / 2 ** 20, resident, flush=True)
data = litert.convert(model, config, DecodeOptions(beam_size=4, alpha=0.6, max_extra=5), (precision,))[precision]
print('TFLITE', len(data) / 2 ** 20, flush=True)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="1x64x1000,2x256x16000")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--cap-gib", type=float, default=7.0)
    parser.add_argument("--repo", default=str(REPO))
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=args.repo, TF_CPP_MIN_LOG_LEVEL="2")
    print("| shape | weights MiB | before converting MiB | peak MiB | peak - before | / weights | seconds |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        seconds, peak, out = run_child(CHILD, shape.split("x") + [args.precision], cap_mib=args.cap_gib * 1024,
                                       env=env)
        found = [line.split() for line in out.splitlines() if line.startswith("WEIGHTS")]
        weights, before = (float(found[0][1]), float(found[0][2])) if found else (float("nan"), float("nan"))
        if peak is None:
            print(f"| {shape} | {weights:.1f} | {before:.0f} | killed above {args.cap_gib:g} GiB | | | {seconds:.0f} |")
        else:
            print(f"| {shape} | {weights:.1f} | {before:.0f} | {peak:.0f} | {peak - before:.0f} | "
                  f"{(peak - before) / weights:.0f}x | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
