"""Export precisions at serving speed: SavedModel float32 / bfloat16 and CTranslate2 float32 / int8, paired.

For each model (the shipped EN-DE model; a Transformer-base-size model of random weights in the OPUS-MT shape: 6+6
layers, d_model 512, 8 heads, d_ff 2048, a 58k vocabulary), it writes under `--workdir` the four exports with
beam 4 (alpha 0.6, at most source length + `--max-extra` tokens) through `keras-transformer export --precision`,
starts one worker process per export (a SavedModel worker imports only `tensorflow` and `tensorflow_text` and
calls `serving_default`; a CTranslate2 worker `keras_transformer.engines.ctranslate2`, loading with the precision
the export records), warms each up (XLA compiles its programs then), and runs `--rounds` rounds. In a round the
workers take turns, never at the same time, who goes first rotating, on the same test2016 sentences: batches of
32, batches of 64 (sentences/s), then `--single` sentences one at a time (p50 ms), taking turns every 5
sentences. The table gives medians over rounds and the paired ratios (per round, then their median):

- SavedModel float32 against CTranslate2 float32 (batch 64 throughput, single-sentence p50): issue #65 asks
  the SavedModel at or above CTranslate2 float32 at batch 64 on the shipped model, p50 within 1.2x;
- SavedModel bfloat16 against its float32 (at least 1.5x on the base-size model, on a CPU with AMX), CTranslate2
  int8 against its float32.

`--overhead` also measures the search's own overhead on the shipped model, in this process: one XLA-compiled beam
search over a batch (its steps counted), against the same number of decoder steps of its weight matrix products
alone (every Dense of the decoder and the output projection, on batch x beam rows, XLA-compiled too; the
encoder's and the cross-attention keys' products once): what is not those products is the search's (attention
over the cache, softmax, top-k, gathers, the loop).

Timings on a machine shared with other jobs are "under load": the load average is printed with the table.

    python bench/precision.py                                   # both models, 64 sentences, 3 rounds
    python bench/precision.py --models shipped --sentences 128 --rounds 5 --single 40 --overhead
"""

import argparse
import gzip
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"
ENGINES = (("SavedModel", "float32"), ("SavedModel", "bfloat16"), ("CTranslate2", "float32"),
           ("CTranslate2", "int8"))
BASE_VOCABULARY = 58_000  # OPUS-MT en-de's, about

WORKER = r"""
import json, os, sys, time
kind, folder, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "SavedModel":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import tensorflow_text  # noqa: F401  (the SentencePiece ops)
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    translate = lambda texts: [t.decode() for t in serve(tf.constant(texts))["translation"].numpy()]
else:
    from keras_transformer.engines.ctranslate2 import CTranslate2Translator
    translate = CTranslate2Translator(folder, intra_threads=threads).translate
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    if "batch" in command:
        start, texts, size = time.perf_counter(), command["sentences"], command["batch"]
        outputs = [text for i in range(0, len(texts), size) for text in translate(texts[i:i + size])]
        print(json.dumps({"seconds": time.perf_counter() - start, "outputs": outputs}), flush=True)
    else:
        times = []
        for text in command["sentences"]:
            start = time.perf_counter()
            translate([text])
            times.append(1000 * (time.perf_counter() - start))
        print(json.dumps({"ms": times}), flush=True)
"""


def cpu_description():
    """`lscpu`'s model name and whether the CPU has the flags that matter here."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    except (OSError, subprocess.CalledProcessError):
        fields = {}
    flags = fields.get("Flags", "").split()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return (f"{fields.get('Model name', 'unknown CPU')}, {fields.get('CPU(s)', '?')} CPUs; "
            + ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in wanted))


def export(source, out, *arguments):
    """`keras-transformer export` in a child process (its TensorFlow stays out of this one); `out` is reused."""
    if (out / "manifest.json").is_file():
        return out
    command = [sys.executable, "-m", "keras_transformer.cli", "export", "--workdir", str(source), "--out", str(out),
               *arguments]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return out


def base_workdir(folder):
    """A workdir of the base-size model with random weights and a SentencePiece word vocabulary of 58k ids whose
    first pieces are Multi30k's English words (so test2016 tokenizes to real ids), the rest filler words."""
    if (folder / "model.yaml").is_file():
        return folder
    import io

    import keras
    import sentencepiece

    import keras_transformer as kt
    from keras_transformer.data.tokenizers import SubwordTokenizer, save_tokenizers
    from keras_transformer.workdir import checkpoints as workdir

    with gzip.open(DATA / "train.en.gz", "rt", encoding="utf-8") as handle:
        english = [line.strip() for line in handle]
    words = len({word for line in english for word in line.split()})
    filler = [f"x{i}" for i in range(BASE_VOCABULARY - words)]
    writer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(english + filler), model_writer=writer, vocab_size=BASE_VOCABULARY,
        model_type="word", hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    tokenizer = SubwordTokenizer(writer.getvalue(), model_type="unigram")
    config = kt.TransformerConfig.preset("base", vocab_size=int(tokenizer.vocab_size), max_length=256)
    keras.utils.set_random_seed(0)
    model = kt.build_model(config)
    staging = folder.with_name(folder.name + ".tmp")
    (staging / "checkpoints").mkdir(parents=True, exist_ok=True)
    config.save_yaml(staging / "model.yaml")
    workdir.save_weights(model, staging / "checkpoints" / "ckpt-0001.weights.h5")
    save_tokenizers(staging / "data" / "vocab", tokenizer, tokenizer)
    os.replace(staging, folder)
    return folder


class Worker:
    """One export served by a child process (`WORKER`), timed on request."""

    def __init__(self, kind, folder, threads):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
        if threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, kind, str(folder), str(threads)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if not json.loads(self.process.stdout.readline()).get("ready"):
            raise SystemExit(f"the {kind} worker for {folder} did not start")

    def ask(self, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("a worker died")
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def measure(name, exports, sentences, args):
    """`{engine: {"batch32": [s/s per round], "batch64": [...], "p50": [...], "outputs": [...]}}` for one model."""
    workers = {}
    for engine, folder in exports.items():
        started = time.perf_counter()
        workers[engine] = Worker(engine[0], folder, args.threads)
        workers[engine].ask(sentences=sentences, batch=64)  # warm-up: XLA compiles the shapes the rounds meet
        workers[engine].ask(sentences=sentences[:5], single=True)
        print(f"{name} {engine[0]} {engine[1]}: ready, warm-up {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    results = {engine: {"batch32": [], "batch64": [], "p50": [], "outputs": None} for engine in workers}
    order = list(workers)
    single = sentences[:args.single]
    for round_index in range(args.rounds):
        turn = order[round_index % len(order):] + order[:round_index % len(order)]  # who goes first rotates
        for size in (32, 64):
            for engine in turn:
                answer = workers[engine].ask(sentences=sentences, batch=size)
                results[engine][f"batch{size}"].append(len(sentences) / answer["seconds"])
                results[engine]["outputs"] = answer["outputs"]
        latencies = {engine: [] for engine in turn}
        for start in range(0, len(single), 5):
            for engine in turn:
                latencies[engine] += workers[engine].ask(sentences=single[start:start + 5], single=True)["ms"]
        for engine in turn:
            results[engine]["p50"].append(statistics.median(latencies[engine]))
        print(f"{name}: round {round_index + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    for worker in workers.values():
        worker.close()
    return results


def paired(results, a, b, key, invert=False):
    """The median over rounds of a / b (b / a with `invert`, for latencies: how many times faster a is)."""
    ratios = [(y / x if invert else x / y) for x, y in zip(results[a][key], results[b][key])]
    return statistics.median(ratios)


def search_overhead(model_folder, sentences, beam_size=4, rounds=3):
    """`(search seconds, weight-product seconds, steps)` of one XLA-compiled beam search over `sentences`."""
    import tensorflow as tf

    from keras_transformer import decoding, load_translator
    from keras_transformer.model import output_kernel, parts

    translator = load_translator(model_folder, beam_size=beam_size, alpha=0.6)
    model = translator.model
    source = translator.encode_sources(tf.constant(sentences))

    @tf.function(jit_compile=True, autograph=False)
    def search(source):
        return decoding.beam_search(model, source, beam_size=beam_size, alpha=0.6, max_extra=50,
                                    return_steps=True)

    p = parts(model)
    rows = int(source.shape[0]) * beam_size
    dense = []
    for layer in p.decoder.decoder_layers:
        dense += [layer.self_attention.qkv_dense.kernel, layer.self_attention.output_dense.kernel,
                  layer.cross_attention.query_dense.kernel, layer.cross_attention.output_dense.kernel,
                  layer.feed_forward.inner.kernel, layer.feed_forward.outer.kernel]
    projection = output_kernel(model)

    @tf.function(jit_compile=True, autograph=False)
    def products(steps):
        width = int(projection.shape[0])

        def body(i, x, inner):
            outputs = {width: x, int(dense[4].shape[1]): inner}  # the latest (rows, n) output of each width n
            for kernel in dense:  # each product takes the latest output of its input width
                y = tf.matmul(outputs.get(int(kernel.shape[0]), x)[:, :int(kernel.shape[0])], kernel)
                outputs[int(kernel.shape[1])] = y
            logits = tf.matmul(outputs[width], projection)
            return i + 1, outputs[width] + tf.reduce_mean(logits) * 1e-9, outputs[int(dense[4].shape[1])]

        start = (tf.constant(0), tf.zeros([rows, width], projection.dtype),
                 tf.zeros([rows, int(dense[4].shape[1])], projection.dtype))
        return tf.while_loop(lambda i, *_: i < steps, body, start)[1]

    _, _, steps = search(source)
    steps = int(steps)
    products(tf.constant(steps))
    search_times, product_times = [], []
    for _ in range(rounds):  # alternating
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), search(source))
        search_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        products(tf.constant(steps)).numpy()
        product_times.append(time.perf_counter() - start)
    return statistics.median(search_times), statistics.median(product_times), steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="shipped,base", help="shipped, base or both")
    parser.add_argument("--workdir", default="/tmp/kt_precision_bench", help="where the exports are written")
    parser.add_argument("--sentences", type=int, default=64, help="test2016 sentences per batch pass")
    parser.add_argument("--single", type=int, default=20, help="sentences timed one at a time per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="intra-op (and inter-op) threads per worker; CTranslate2's intra_threads")
    parser.add_argument("--max-extra", type=int, default=50)
    parser.add_argument("--overhead", action="store_true", help="also measure the search's own overhead")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with gzip.open(DATA / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as handle:
        sentences = [line.strip() for line in handle][:args.sentences]
    decoding = ["--beam-size", "4", "--alpha", "0.6", "--max-extra", str(args.max_extra)]
    sources = {"shipped": REPO / "saved_models" / "multi30k_en_de"}
    tables = []
    for name in args.models.split(","):
        source = sources[name] if name in sources else base_workdir(workdir / "base_workdir")
        exports = {}
        for kind, precision in ENGINES:
            form = ["--format", "ctranslate2"] if kind == "CTranslate2" else []
            out = workdir / f"{name}_{kind.lower()}_{precision}"
            exports[kind, precision] = export(source, out, *form, "--precision", precision, *decoding)
        tables.append((name, measure(name, exports, sentences, args)))
    print(f"\nCPU: {cpu_description()}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{args.threads} thread(s) per worker; beam 4, alpha 0.6; {len(sentences)} test2016 sentences per pass, "
          f"{args.single} one at a time; medians of {args.rounds} rounds\n")
    print("| model | export | precision | batch 32, sentences/s | batch 64, sentences/s | one sentence p50 ms | "
          "same output as float32 |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for name, results in tables:
        for (kind, precision), r in results.items():
            same = sum(a == b for a, b in zip(r["outputs"], results[kind, "float32"]["outputs"]))
            print(f"| {name} | {kind} | {precision} | {statistics.median(r['batch32']):.1f} | "
                  f"{statistics.median(r['batch64']):.1f} | {statistics.median(r['p50']):.1f} | "
                  f"{same} / {len(r['outputs'])} |")
    print("\n| model | paired ratio (median over rounds) | batch 32 | batch 64 | one sentence p50 |")
    print("| --- | --- | ---: | ---: | ---: |")
    pairs = ((("SavedModel", "float32"), ("CTranslate2", "float32"), "SavedModel float32 / CTranslate2 float32"),
             (("SavedModel", "bfloat16"), ("SavedModel", "float32"), "SavedModel bfloat16 / float32"),
             (("CTranslate2", "int8"), ("CTranslate2", "float32"), "CTranslate2 int8 / float32"))
    for name, results in tables:
        for a, b, label in pairs:
            print(f"| {name} | {label} (speed-up) | {paired(results, a, b, 'batch32'):.2f}x | "
                  f"{paired(results, a, b, 'batch64'):.2f}x | {paired(results, a, b, 'p50', invert=True):.2f}x |")
    if args.overhead:
        for size in (1, 8):
            total, products, steps = search_overhead(sources["shipped"], sentences[:size])
            print(f"\nsearch overhead, shipped model, {size} sentence(s), beam 4, XLA: {steps} steps in "
                  f"{1000 * total:.1f} ms, their weight products alone {1000 * products:.1f} ms: "
                  f"{100 * (1 - products / total):.0f}% of the search is not matrix products by weights")


if __name__ == "__main__":
    main()
