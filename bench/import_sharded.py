"""Importing a large sharded checkpoint: wall time and peak RSS, float32 and `--dtype bfloat16`.

A random checkpoint of NLLB-1.3B's shape (d_model 1024, 24 + 24 layers, 16 heads, d_ff 8192, a shared vocabulary
of 256,206 tokens: 1.37B parameters, 5.1 GiB in float32) or NLLB-600M's (12 + 12 layers, d_ff 4096: 0.62B) is
written as `save_pretrained` writes a sharded one (`model-0000N-of-0000M.safetensors`, 1 GiB shards, and
`model.safetensors.index.json`), under Marian's names and config (the package's Marian importer: the tensors
and their sizes are what matter here, and Marian's tokenizer files are small), with SentencePiece models learned
here on Multi30k and the vocabulary padded to 256,206 entries. The weights are random numpy values written
directly: no model is built in PyTorch.

Each import runs in a child process (`keras-transformer import`), which reports its own peak RSS (VmHWM,
Linux; `peak_rss.py`, which kills a child above `--cap-gib`); a child that loads the same modules and imports
nothing gives the baseline. The goal: peak RSS above the baseline under 1.3x the weights' size in the chosen dtype.

Usage:

    python bench/import_sharded.py                 # NLLB-1.3B's shape (about 11 GB of disk in a temporary folder)
    python bench/import_sharded.py --shape 600m    # NLLB-600M's
"""

import argparse
import json
import os
import pathlib
import shutil
import struct
import tempfile
import time

import numpy as np
from peak_rss import run_child
from random_marian import marian_folder

SHAPES = {"1.3b": dict(layers=24, d_model=1024, heads=16, d_ff=8192, vocab=256206),
          "600m": dict(layers=12, d_model=1024, heads=16, d_ff=4096, vocab=256206),
          "tiny": dict(layers=2, d_model=64, heads=4, d_ff=128, vocab=8000)}
SHARD_BYTES = 1 << 30
CHILD = ("import sys\nfrom keras_transformer.cli import main\nstatus = main(sys.argv[1:]) if sys.argv[1:] else 0\n"
         "import keras; keras.ops.zeros(1)\nsys.exit(status)\n")


def tensor_shapes(shape):
    """Marian's tensor names and shapes for `shape` (a shared, tied vocabulary: what save_pretrained keeps)."""
    d, f, v = shape["d_model"], shape["d_ff"], shape["vocab"]
    shapes = {"model.shared.weight": (v, d), "final_logits_bias": (1, v)}

    def attention(prefix):
        for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{prefix}.{projection}.weight"] = (d, d)
            shapes[f"{prefix}.{projection}.bias"] = (d,)

    def layer_norm(prefix):
        shapes[f"{prefix}.weight"] = shapes[f"{prefix}.bias"] = (d,)

    for side in ("encoder", "decoder"):
        for i in range(shape["layers"]):
            prefix = f"model.{side}.layers.{i}"
            attention(f"{prefix}.self_attn")
            layer_norm(f"{prefix}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{prefix}.encoder_attn")
                layer_norm(f"{prefix}.encoder_attn_layer_norm")
            shapes[f"{prefix}.fc1.weight"], shapes[f"{prefix}.fc1.bias"] = (f, d), (f,)
            shapes[f"{prefix}.fc2.weight"], shapes[f"{prefix}.fc2.bias"] = (d, f), (d,)
            layer_norm(f"{prefix}.final_layer_norm")
    return shapes


def write_shards(folder, shapes):
    """Random float32 tensors in safetensors shards of about SHARD_BYTES, and their index."""
    rng = np.random.default_rng(0)
    groups, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = 4 * int(np.prod(shape))
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map = {}
    for index, names in enumerate(groups):
        shard = f"model-{index + 1:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {}, 0
        for name in names:
            end = offset + 4 * int(np.prod(shapes[name]))
            header[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [offset, end]}
            offset = end
        encoded = json.dumps(header).encode()
        with open(folder / shard, "wb") as handle:
            handle.write(struct.pack("<Q", len(encoded)) + encoded)
            for name in names:
                value = rng.standard_normal(shapes[name], dtype=np.float32)
                value *= 0.02
                if name.endswith("layer_norm.weight"):
                    value += 1.0
                handle.write(value.tobytes())
                weight_map[name] = shard
    total = sum(4 * int(np.prod(shape)) for shape in shapes.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total, len(groups)


def build_checkpoint(folder, shape):
    marian_folder(folder, shape, sentences=5000, pieces=2000, activation="relu").save_pretrained(folder)
    shapes = tensor_shapes(shape)
    total, shards = write_shards(folder, shapes)
    return sum(int(np.prod(shape)) for shape in shapes.values()), total, shards


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.3b")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--cap-gib", type=float, default=12.0, help="an import above this RSS is killed")
    args = parser.parse_args()

    root = pathlib.Path(tempfile.mkdtemp(prefix="import_sharded_"))
    try:
        start = time.perf_counter()
        parameters, total, shards = build_checkpoint(root / "checkpoint", SHAPES[args.shape])
        print(f"# import_sharded: {args.shape}, {parameters / 1e9:.2f}B parameters, {total / 2**30:.2f} GiB in "
              f"{shards} shards (written in {time.perf_counter() - start:.0f} s); load average "
              f"{os.getloadavg()[0]:.1f}")
        _, baseline, _ = run_child(CHILD)
        print("| dtype | weights in that dtype | import | peak RSS | baseline RSS | (peak - baseline) / weights |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for dtype in args.dtypes.split(","):
            weights_mib = parameters * (2 if dtype == "bfloat16" else 4) / 2**20
            workdir = root / f"workdir_{dtype}"
            seconds, peak, _ = run_child(CHILD, ["import", str(root / "checkpoint"), "--workdir", str(workdir),
                                                 "--dtype", dtype], cap_mib=args.cap_gib * 1024)
            if peak is None:
                print(f"| {dtype} | {weights_mib:.0f} MiB | killed at {args.cap_gib:g} GiB | | | |", flush=True)
                continue
            print(f"| {dtype} | {weights_mib:.0f} MiB | {seconds:.0f} s | {peak:.0f} MiB | {baseline:.0f} MiB | "
                  f"{(peak - baseline) / weights_mib:.2f}x |", flush=True)
            shutil.rmtree(workdir)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
