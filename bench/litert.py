"""LiteRT exports (float32, float16, int8) against the SavedModel (float32) and CTranslate2 (float32, int8), paired.

    .venv/bin/python bench/litert.py [--models shipped,opus] [--sentences 1000] [--latency-sentences 200]

Two models: the shipped EN-DE model (`saved_models/multi30k_en_de`, Multi30k test2016, beam 4 with its alpha and
max_extra) and a random model of the OPUS-MT base shape (6 + 6 layers, d_model 512, 8 heads, d_ff 2048, 58,101
tokens: `bench/import_marian.py`'s builder, imported), decoded with beam 4 and alpha 0 to a fixed cap
(`--opus-max-extra`: a random model does not stop, so every engine decodes as many steps). Each model is
exported once per engine, in a child process whose resident memory is watched (killed above `--memory-gib`); every
export decodes with early exit (CTranslate2's rule).

Each engine then runs in a worker process of its own (so that its peak RSS is its own), with 1, then 2 threads:

* single-sentence latency on the first `--latency-sentences` sentences, the engines taking turns every
  `--chunk` sentences (who goes first rotates), so that each sentence is timed by all within seconds; p50 per
  engine, and the median of each sentence's own ratio LiteRT int8 / CTranslate2 int8;
* with 1 thread, batches of 32 over `--sentences` sentences (sentences/s) and, on the shipped model, BLEU of those
  translations (Multi30k protocol: lowercased and Moses-tokenized against ``test_2016_flickr.lc.norm.tok.de``);
* peak RSS of each worker (``ru_maxrss``) after its runs, and each export's file size.

Prints one markdown table per model. Give the process CPU priority on a shared machine (docs/BENCHMARKS.md).
"""

import argparse
import gzip
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"
ENGINES = ("savedmodel", "ct2-float32", "ct2-int8", "litert-float32", "litert-float16", "litert-int8")

WORKER = r"""
import json, resource, sys, time
setup = json.loads(sys.stdin.readline())
sys.path.insert(0, setup["repo"])
engine, path, threads = setup["engine"], setup["path"], setup["threads"]
if engine == "savedmodel":
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (its SentencePiece ops)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    signature = tf.saved_model.load(path).signatures["serving_default"]
    def translate(batch):
        result = signature(tf.constant([text.encode("utf-8") for text in batch]))["translation"].numpy()
        return [text.decode("utf-8") for text in result]
elif engine.startswith("ct2"):
    from keras_transformer.engines.ctranslate2 import CTranslate2Translator
    translate = CTranslate2Translator(path, intra_threads=threads, inter_threads=1).translate
else:
    from keras_transformer.engines.litert import LiteRTTranslator
    translate = LiteRTTranslator(path, intra_threads=threads).translate
sentences = setup["sentences"]
translate(sentences[:setup["batch_size"]]); translate(sentences[:1])  # warm-up
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    if "single" in command:
        times = []
        for i in command["single"]:
            start = time.perf_counter(); translate([sentences[i]]); times.append(1000 * (time.perf_counter() - start))
        print(json.dumps({"ms": times}), flush=True)
    elif "batch" in command:
        start, outputs = time.perf_counter(), []
        for first in range(0, command["batch"], setup["batch_size"]):
            outputs += translate(sentences[first:min(command["batch"], first + setup["batch_size"])])
        print(json.dumps({"seconds": time.perf_counter() - start, "translations": outputs}), flush=True)
    else:
        print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
        break
"""


class Worker:
    """One engine in its own process, one JSON line per command."""

    def __init__(self, engine, path, threads, sentences, batch_size):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": str(threads)}
        self.process = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=REPO)
        self.ask({"engine": engine, "path": str(path), "threads": threads, "sentences": sentences,
                  "batch_size": batch_size, "repo": str(REPO)})

    def ask(self, message):
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker exited with {self.process.wait()}")
        return json.loads(line)

    def stop(self):
        peak = self.ask({"stop": True})["peak_mib"]
        self.process.wait(timeout=60)
        return peak


def read_gz(path, count=None):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    return lines[:count]


def folder_mib(path):
    path = pathlib.Path(path)
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) / 2**20


# --------------------------------------------------------------------------- exports (in a child process)


def prepare(model, root, max_extra, size, part):
    """Writes one part of `model`'s exports ("shipped" or "opus") under `root`: "base" (the random checkpoint and
    its import, the SavedModel, CTranslate2 float32 and int8) or "litert-<precision>"; returns `{engine: path}` and
    the decoding. Each part runs in a child of its own (a base-size conversion holds several copies of the weights)."""
    from keras_transformer import import_checkpoint
    from keras_transformer.exports import make_exporter
    from keras_transformer.workdir.checkpoints import load_models

    root = pathlib.Path(root)
    source = REPO / "saved_models" / "multi30k_en_de" if model == "shipped" else root / "workdir"
    if model == "opus" and part == "base":
        sys.path.insert(0, str(REPO / "bench"))
        from import_marian import build_checkpoint  # the random OPUS-MT-shaped Marian (moving to a shared helper)

        build_checkpoint(root / "checkpoint", size)
        import_checkpoint(root / "checkpoint", source)
    recorded = load_models(source).decoding if model == "shipped" else None
    settings = dict(strategy="beam", beam_size=4, alpha=recorded.alpha if recorded else 0.0,
                    max_extra=recorded.max_extra if recorded else max_extra, early_exit=True)
    paths = {}
    if part == "base":
        paths["savedmodel"] = make_exporter("savedmodel").export(source, root / "savedmodel", **settings)
        for precision in ("float32", "int8"):
            paths[f"ct2-{precision}"] = make_exporter("ctranslate2", precision=precision).export(
                source, root / f"ct2-{precision}", **settings)
    else:
        precision = part.split("-", 1)[1]
        paths[part] = make_exporter("litert", precision=precision).export(source, root / part, **settings)
    options = load_models(source).decoding.replace(**settings)
    return {engine: str(path) for engine, path in paths.items()}, options.describe()


def prepare_guarded(model, root, max_extra, size, limit_gib):
    """`prepare`'s parts, each in a child process killed if its RSS passes `limit_gib`."""
    paths, decoding = {}, ""
    for part in ("base", "litert-float32", "litert-float16", "litert-int8"):
        done = ["savedmodel", "ct2-float32", "ct2-int8"] if part == "base" else [part]
        if all((pathlib.Path(root) / name / "manifest.json").is_file() for name in done):  # --root of a run before
            paths.update({name: str(pathlib.Path(root) / name) for name in done})
            continue
        command = [sys.executable, __file__, "--prepare", model, "--part", part, "--root", str(root),
                   "--opus-max-extra", str(max_extra), "--size", size]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        peak = [0.0]

        def watch(child=child, peak=peak):
            while child.poll() is None:
                try:
                    with open(f"/proc/{child.pid}/status") as status:
                        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 2**20
                except (OSError, StopIteration):
                    rss = 0.0
                peak[0] = max(peak[0], rss)
                if rss > limit_gib:
                    child.kill()
                time.sleep(0.5)

        threading.Thread(target=watch, daemon=True).start()
        output, _ = child.communicate()
        if child.returncode:
            raise SystemExit(f"exporting {model} ({part}) failed (status {child.returncode}; peak RSS "
                             f"{peak[0]:.1f} GiB)")
        written, decoding = json.loads(output.strip().splitlines()[-1])
        paths.update(written)
        print(f"{model} {part}: peak RSS {peak[0]:.1f} GiB", file=sys.stderr, flush=True)
    return paths, decoding


# --------------------------------------------------------------------------- runs


def run_model(args, model):
    root = pathlib.Path(args.root or tempfile.mkdtemp(prefix=f"bench_litert_{model}_"))
    start = time.perf_counter()
    paths, decoding = prepare_guarded(model, root, args.opus_max_extra, args.size, args.memory_gib)
    export_seconds = time.perf_counter() - start
    count = args.sentences if model == "shipped" else args.opus_sentences
    sentences = read_gz(DATA / "test_2016_flickr.en.gz", count)
    latency = min(args.latency_sentences if model == "shipped" else args.opus_latency_sentences, count)
    engines = [engine for engine in ENGINES if engine in args.engines.split(",")]
    rows = {engine: {"size": folder_mib(paths[engine])} for engine in engines}
    if "litert-float32" in paths:
        tflite = {engine: os.path.getsize(pathlib.Path(paths[engine]) / "model.tflite")
                  for engine in engines if engine.startswith("litert")}
    ratios = []
    for threads in (1, 2):
        workers = {engine: Worker(engine, paths[engine], threads, sentences, args.batch_size) for engine in engines}
        times = {engine: [None] * latency for engine in engines}
        for turn, first in enumerate(range(0, latency, args.chunk)):
            indices = list(range(first, min(latency, first + args.chunk)))
            order = engines[turn % len(engines):] + engines[:turn % len(engines)]
            for engine in order:
                for i, ms in zip(indices, workers[engine].ask({"single": indices})["ms"]):
                    times[engine][i] = ms
        for engine in engines:
            rows[engine][f"p50_{threads}"] = statistics.median(times[engine])
        if {"litert-int8", "ct2-int8"} <= set(engines) and threads == 1:
            ratios = [a / b for a, b in zip(times["litert-int8"], times["ct2-int8"])]
        if threads == 1:
            for turn in range(len(engines)):
                engine = engines[turn]
                result = workers[engine].ask({"batch": count})
                rows[engine]["rate"] = count / result["seconds"]
                rows[engine]["translations"] = result["translations"]
        for engine, worker in workers.items():
            peak = worker.stop()
            rows[engine]["peak"] = max(rows[engine].get("peak", 0.0), peak)
    if model == "shipped":
        from keras_transformer.evaluation import multi30k_bleu
        tokenized = read_gz(DATA / "test_2016_flickr.lc.norm.tok.de.gz", count)
        for engine in engines:
            rows[engine]["bleu"] = multi30k_bleu(rows[engine]["translations"], tokenized, "de").score
    return {"rows": rows, "decoding": decoding, "count": count, "latency": latency, "ratios": ratios,
            "tflite": tflite, "export_seconds": export_seconds}


def report(model, result):
    rows = result["rows"]
    print(f"\n### {model}: {result['decoding']}; {result['count']} sentences (batch 32), "
          f"{result['latency']} one at a time\n")
    print("| engine | files MiB | p50 ms, 1 thread | p50 ms, 2 threads | batch 32, sent/s (1 thread) | peak RSS MiB"
          + (" | BLEU lc.tok |" if model == "shipped" else " |"))
    print("| --- | ---: | ---: | ---: | ---: | ---:" + (" | ---: |" if model == "shipped" else " |"))
    for engine, row in rows.items():
        print(f"| {engine} | {row['size']:.1f} | {row['p50_1']:.1f} | {row['p50_2']:.1f} | {row['rate']:.1f} | "
              f"{row['peak']:.0f}" + (f" | {row['bleu']:.2f} |" if "bleu" in row else " |"))
    tflite = result["tflite"]
    if "litert-float32" in tflite:
        print("\nmodel.tflite / float32: " + ", ".join(
            f"{engine[7:]} {size / tflite['litert-float32']:.3f}x ({size / 2**20:.1f} MiB)"
            for engine, size in tflite.items()))
    if result["ratios"]:
        print(f"LiteRT int8 / CTranslate2 int8, single sentence, 1 thread: median of per-sentence ratios "
              f"{statistics.median(result['ratios']):.2f}x (p50s {rows['litert-int8']['p50_1']:.1f} / "
              f"{rows['ct2-int8']['p50_1']:.1f} ms)")
    if "bleu" in rows.get("litert-int8", {}) and "bleu" in rows.get("litert-float32", {}):
        print(f"BLEU LiteRT int8 - float32: {rows['litert-int8']['bleu'] - rows['litert-float32']['bleu']:+.2f}")
    print(f"(exports written in {result['export_seconds']:.0f} s)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="shipped,opus", help="shipped, opus, or both (comma-separated)")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--sentences", type=int, default=1000, help="shipped model: first N of test2016 (BLEU)")
    parser.add_argument("--latency-sentences", type=int, default=200)
    parser.add_argument("--opus-sentences", type=int, default=64)
    parser.add_argument("--opus-latency-sentences", type=int, default=32)
    parser.add_argument("--opus-max-extra", type=int, default=10,
                        help="random model: a translation stops at its source length + 1 + this many tokens")
    parser.add_argument("--size", default="base", help="random model: import_marian.py's size (base, small)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=5, help="one at a time: engines take turns every N sentences")
    parser.add_argument("--memory-gib", type=float, default=11.0, help="an export child above this RSS is killed")
    parser.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help="write (or reuse) the exports here (one model)")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        paths, decoding = prepare(args.prepare, args.root, args.opus_max_extra, args.size, args.part)
        print(json.dumps([paths, decoding]))
        return
    print(f"# bench/litert.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    for model in args.models.split(","):
        report(model, run_model(args, model))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
