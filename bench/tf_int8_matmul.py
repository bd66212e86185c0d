"""TensorFlow's low-precision matrix products on this CPU: is any int8 path faster than float32 for a SavedModel?

One product of a `(B, 512)` input by a `(512, N)` weight (a decoding step's feed-forward and output projection
shapes), each way in a `tf.function`, the ways taking turns on the same input; the median of `--repeats` calls:

- float32: `tf.matmul` in float32;
- bfloat16: input and weights in bfloat16 (oneDNN's bfloat16 kernels where the CPU has AVX512_BF16 or AMX);
- keras int8: a `keras.layers.Dense` after `quantize("int8")` (int8 weights, per-call input quantization);
- int8 weights cast: int8 weights and their scales, cast back to float32 in the graph before the product;
- tf QuantizedMatMul: `tf.quantization.quantize` of the input to quint8, `tf.raw_ops.QuantizedMatMul` against
  quint8 weights into qint32 (the only types its CPU kernel is registered for), dequantized (TensorFlow's own
  quantized kernel);
- tf QuantizedMatMulWithBiasAndDequantize: the fused oneDNN kernel (quint8 input, qint8 weights, float32 out),
  where this TensorFlow build has it for the CPU.

Each int8 way's error against float32 is printed too (max |difference| / max |float32|).

    python bench/tf_int8_matmul.py                 # about a minute on 2 cores
    python bench/tf_int8_matmul.py --repeats 50 --shapes 64x2048,64x32000,320x32000
"""

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

D_MODEL = 512


def cpu_description():
    """The CPU's model name and the flags that matter for low precision."""
    name, flags = platform.processor(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                if key.strip() == "flags":
                    flags = value.split()
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return f"{name or 'unknown CPU'}; " + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in wanted)


def ways(batch, width, seed=0):
    """`{name: tf.function}` of the products above, each taking the same float32 input, and that input."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, D_MODEL)).astype("float32"))
    w = rng.normal(scale=D_MODEL ** -0.5, size=(D_MODEL, width)).astype("float32")
    w32 = tf.constant(w)
    w16 = tf.constant(w, tf.bfloat16)
    scale = np.abs(w).max(axis=0) / 127.0  # per output column
    w8 = tf.constant(np.round(w / scale).astype("int8"))
    scale = tf.constant(scale.astype("float32"))

    dense = keras.layers.Dense(width, use_bias=False)
    dense.build((None, D_MODEL))
    dense.kernel.assign(w)
    dense.quantize("int8")

    w_range = float(np.abs(w).max())
    wq = tf.quantization.quantize(w32, -w_range, w_range, tf.qint8, mode="SCALED")  # what oneDNN's kernel takes
    wq8 = tf.quantization.quantize(w32, -w_range, w_range, tf.quint8, mode="MIN_FIRST")  # the reference kernel's

    found = {
        "float32": tf.function(lambda a: tf.matmul(a, w32)),
        "bfloat16": tf.function(lambda a: tf.cast(tf.matmul(tf.cast(a, tf.bfloat16), w16), tf.float32)),
        "keras int8": tf.function(lambda a: dense(a)),
        "int8 weights cast": tf.function(lambda a: tf.matmul(a, tf.cast(w8, tf.float32)) * scale),
    }

    def quantized(a):
        low, high = tf.reduce_min(a), tf.reduce_max(a)
        aq = tf.quantization.quantize(a, low, high, tf.quint8, mode="MIN_FIRST")
        out, out_min, out_max = tf.raw_ops.QuantizedMatMul(
            a=aq.output, b=wq8.output, min_a=aq.output_min, max_a=aq.output_max, min_b=wq8.output_min,
            max_b=wq8.output_max, Toutput=tf.qint32)
        return tf.quantization.dequantize(out, out_min, out_max, mode="MIN_FIRST")
    found["tf QuantizedMatMul"] = tf.function(quantized)

    bias = tf.zeros([width], tf.float32)

    def fused(a):
        low, high = tf.reduce_min(a), tf.reduce_max(a)
        aq = tf.quantization.quantize(a, low, high, tf.quint8, mode="MIN_FIRST")
        return tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
            a=aq.output, b=wq.output, bias=bias, min_a=aq.output_min, max_a=aq.output_max, min_b=wq.output_min,
            max_b=wq.output_max, min_freezed_output=tf.constant(-1.0), max_freezed_output=tf.constant(1.0),
            Toutput=tf.float32, input_quant_mode="MIN_FIRST")
    found["tf QuantizedMatMulWithBiasAndDequantize"] = tf.function(fused)
    return found, x


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x2048,64x32000,320x32000", help="BATCHxOUTPUT products to time")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per way and shape (median)")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_description()}; TensorFlow {tf.__version__}, Keras {keras.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    names = None
    for shape in args.shapes.split(","):
        batch, width = (int(part) for part in shape.split("x"))
        found, x = ways(batch, width)
        reference = found["float32"](x).numpy()
        usable, errors = {}, {}
        for name, function in found.items():
            try:
                out = function(x).numpy()  # traces and warms up
            except (tf.errors.OpError, TypeError, ValueError) as error:
                errors[name] = f"n/a ({type(error).__name__})"
                print(f"{name} at {shape}: {' '.join(str(error).split())[:400]}")
                continue
            usable[name] = function
            errors[name] = float(np.abs(out - reference).max() / np.abs(reference).max())
        times = {name: [] for name in usable}
        for _ in range(args.repeats):  # the ways take turns, so the machine's drift hits them alike
            for name, function in usable.items():
                start = time.perf_counter()
                function(x).numpy()
                times[name].append(time.perf_counter() - start)
        names = list(found)
        rows.append((shape, {name: (statistics.median(times[name]) * 1e3 if name in times else None, errors[name])
                             for name in found}))
    print()
    print("| B x output | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---:" for _ in names) + " |")
    for shape, cells in rows:
        formatted = []
        for name in names:
            ms, error = cells[name]
            formatted.append(error if ms is None else
                             f"{ms:.2f} ms" + ("" if name == "float32" else f" ({error:.0e})"))
        print(f"| {shape} | " + " | ".join(formatted) + " |")
    print("\n(in brackets: max |difference from float32| / max |float32|)")


if __name__ == "__main__":
    main()
