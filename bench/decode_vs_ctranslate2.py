"""SavedModel (TensorFlow) against CTranslate2 (float32 and int8) on the same sentences, alternating rounds.

    .venv/bin/python bench/decode_vs_ctranslate2.py saved_models/multi30k_en_de \\
        [--sentences 1000 --rounds 3 --tf-threads 1 --ct2-threads 1 --cpus 0]

What it does:

1. Rebuilds the Keras model from the export's ``assets.extra/`` and writes, into a
   temporary folder, (i) a fresh SavedModel with the benchmark's decoding settings
   baked in (beam, alpha, max_extra: a SavedModel fixes them at export; pass
   ``--no-reexport`` to time the folder as it is, with its own settings; ``--no-xla`` to
   export it without XLA; the engine ``savedmodel-no-xla`` adds such an export) and (ii) a
   CTranslate2 export of the same weights (float32; int8 is CTranslate2's
   ``compute_type="int8"`` on that folder).
2. Starts one worker process per engine, each pinned to the same CPUs when
   ``--cpus`` is given (``taskset``). The SavedModel worker imports only
   ``tensorflow`` and ``tensorflow_text``; the CTranslate2 workers import
   ``keras_transformer.engines.ctranslate2`` (``ctranslate2``,
   ``sentencepiece``, ``numpy``: neither Keras nor TensorFlow). Each loads its model and warms up
   with one untimed pass over all three modes below, one worker after the other; the table's
   ``warm-up s`` is its wall time (an XLA-compiled SavedModel compiles one program per padded
   input shape then, as a serving process does on its first requests).
3. Runs ``--rounds`` rounds; in each, the engines take turns (never at the same
   time) on the same sentences: (a) batches of 64 in file order, (b) batches of 64
   sorted by length, each engine one after the other, then (c) ``--latency-sentences``
   sentences one at a time (p50 and p95 ms), the engines taking turns every
   ``--latency-chunk`` sentences (who goes first alternates), so that both time each
   sentence within a second or so of each other: this machine's speed drifts by 2x
   within seconds, and a latency phase run minutes apart from the other engine's
   measured the drift as much as the engines. Each worker reports wall time and its
   own CPU seconds (``resource.getrusage`` around each mode, all its threads).
4. Prints sentences/s per engine and mode with medians over rounds, the paired
   per-round ratios CTranslate2 / SavedModel and their medians (for latency also the
   median over all rounds of each sentence's own ratio), CPU seconds, BLEU
   (Multi30k protocol: lowercased, Moses-tokenized against
   ``test_2016_flickr.lc.norm.tok.de.gz``; and cased sacreBLEU against the raw
   references), and how many translations each CTranslate2 engine shares with the
   SavedModel. ``--json`` writes everything.

Thread settings: the SavedModel worker uses ``--tf-threads`` intra-op threads and
``--tf-inter-threads`` inter-op threads (default 1); CTranslate2 ``intra_threads=--ct2-threads``, ``inter_threads=1``.
With one intra-op thread the SavedModel worker also runs with
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``, as
``keras_transformer.engines.tensorflow_threads.configure_threads(intra_op=1)`` sets it (XLA's matrix products on
the calling thread); ``--tf-xla-flags`` gives the worker other XLA flags ("" for none). The engine
``savedmodel-eigen-pool`` is the same export in a worker without that addition, which times the
setting itself: ``--engines savedmodel,savedmodel-eigen-pool``.

The engine ``savedmodel-baseline`` times another SavedModel as it is (``--baseline DIR``, e.g. the
shipped export as an older commit wrote it: ``git worktree add /tmp/old <commit>`` and
``--baseline /tmp/old/saved_models/multi30k_en_de``) in the same rounds, so a change to the search
is timed against the code before it, paired, on the same sentences:
``--engines savedmodel,savedmodel-baseline``. It must bake the same decoding settings.
"""

import argparse
import gzip
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "multi30k"

# --------------------------------------------------------------------------- workers

COMMON = r"""
import json, resource, statistics, sys, time

def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def measure(translate, sentences, batch_size, order):
    # (a)/(b): batches in the given order.
    results = {}
    for mode, indices in (("file_order", list(range(len(sentences)))), ("sorted", order)):
        outputs = [None] * len(sentences)
        wall, cpu = time.perf_counter(), cpu_seconds()
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            for i, text in zip(chunk, translate([sentences[i] for i in chunk])):
                outputs[i] = text
        results[mode] = {"seconds": time.perf_counter() - wall, "cpu_seconds": cpu_seconds() - cpu,
                         "translations": outputs}
    return results

def one_at_a_time(translate, sentences, indices):
    # (c): each sentence alone, as a request.
    latencies = []
    cpu = cpu_seconds()
    for i in indices:
        start = time.perf_counter()
        translate([sentences[i]])
        latencies.append(1000 * (time.perf_counter() - start))
    return {"ms": latencies, "cpu_seconds": cpu_seconds() - cpu}

def serve(translate, setup):
    # One untimed pass over every mode first: an XLA-compiled SavedModel compiles one program per
    # padded input shape on first use, and a serving process pays that once. Its wall time is reported.
    start = time.perf_counter()
    measure(translate, setup["sentences"], setup["batch_size"], setup["order"])
    one_at_a_time(translate, setup["sentences"], range(setup["latency_sentences"]))
    print(json.dumps({"ready": True, "warmup_seconds": time.perf_counter() - start}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("stop"):
            break
        if "single" in command:
            result = one_at_a_time(translate, setup["sentences"], command["single"])
        else:
            result = measure(translate, setup["sentences"], setup["batch_size"], setup["order"])
        print(json.dumps(result), flush=True)
"""

TF_WORKER = COMMON + r"""
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
setup = json.loads(sys.stdin.readline())
tf.config.threading.set_intra_op_parallelism_threads(setup["threads"])
tf.config.threading.set_inter_op_parallelism_threads(setup["inter_threads"])
signature = tf.saved_model.load(setup["model"]).signatures["serving_default"]
assert not any(name.startswith("keras_transformer") for name in sys.modules), "imported keras_transformer"

def translate(batch):
    result = signature(tf.constant([s.encode("utf-8") for s in batch]))["translation"].numpy()
    return [t.decode("utf-8") for t in result]

serve(translate, setup)
"""

CT2_WORKER = COMMON + r"""
setup = json.loads(sys.stdin.readline())
sys.path.insert(0, setup["repo"])
from keras_transformer.engines.ctranslate2 import CTranslate2Translator  # no Keras, no TensorFlow
threads = {} if setup["threads"] is None else {"intra_threads": setup["threads"], "inter_threads": 1}
translator = CTranslate2Translator(setup["model"], beam_size=setup["beam_size"], alpha=setup["alpha"],
                                          max_extra=setup["max_extra"], compute_type=setup["compute_type"],
                                          exact_limits=setup["exact_limits"], **threads)
assert "tensorflow" not in sys.modules and "keras" not in sys.modules, "the CTranslate2 worker imported Keras"
print(json.dumps({"backend": translator.cpu_backend, "intra_threads": translator.intra_threads}), file=sys.stderr)
serve(translator.translate, setup)
"""


class Worker:
    """One engine in its own process, answering one JSON line per round."""

    def __init__(self, name, script, setup, cpus, env=None):
        command = [sys.executable, "-c", script]
        if cpus:
            command = ["taskset", "-c", cpus] + command
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
        if setup["threads"] is not None:  # None: the engine's own choice
            env["OMP_NUM_THREADS"] = str(setup["threads"])
        self.name = name
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=REPO)
        self._send(setup)
        ready = self._receive()
        assert ready.get("ready"), f"{name} did not start: {ready}"
        self.warmup_seconds = ready["warmup_seconds"]

    def _send(self, message):
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _receive(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} exited with {self.process.wait()}")
        return json.loads(line)

    def run_round(self):
        self._send({"run": True})
        return self._receive()

    def run_single(self, indices):
        self._send({"single": list(indices)})
        return self._receive()

    def stop(self):
        try:
            self._send({"stop": True})
            self.process.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.process.kill()


# --------------------------------------------------------------------------- preparation


def read_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def prepare(args, folder):
    """Writes the SavedModel(s) (re-exported with the benchmark settings) and the CTranslate2 export.

    Returns `(saved_model, saved_model_without_xla or None, ct2)` paths.
    """
    from keras_transformer import load_translator
    from keras_transformer.config import TransformerConfig
    from keras_transformer.exports.ctranslate2 import export_ctranslate2
    from keras_transformer.exports.savedmodel import export_translator

    extra = pathlib.Path(args.export) / "assets.extra"
    settings = dict(beam_size=args.beam_size, alpha=args.alpha, max_extra=args.max_extra)
    translator = load_translator(args.export, jit_compile=not args.no_xla, **settings)
    config = TransformerConfig.from_yaml(extra / "model.yaml")  # the architecture (the decoding: the translator's)
    saved_model = args.export
    if not args.no_reexport:
        saved_model = export_translator(translator, folder / "saved_model", config=config)
    without_xla = None
    if "savedmodel-no-xla" in args.engines.split(","):
        plain = load_translator(args.export, jit_compile=False, **settings)
        without_xla = str(export_translator(plain, folder / "saved_model_no_xla", config=config))
    ct2 = export_ctranslate2(translator.model, config, extra / "vocab", folder / "ct2", **settings)
    return str(saved_model), without_xla, str(ct2)


# --------------------------------------------------------------------------- report


def summarise(name, rounds):
    row = {"engine": name}
    for mode in ("file_order", "sorted"):
        rates = [r["count"] / r[mode]["seconds"] for r in rounds]
        row[mode] = {"sentences_per_s": rates, "median": statistics.median(rates),
                     "cpu_seconds": statistics.median(r[mode]["cpu_seconds"] for r in rounds)}
    p50 = [statistics.median(r["single"]["ms"]) for r in rounds]
    p95 = [sorted(r["single"]["ms"])[max(0, round(0.95 * (len(r["single"]["ms"]) - 1)))] for r in rounds]
    row["single"] = {"p50_ms": p50, "p95_ms": p95, "median_p50": statistics.median(p50),
                     "median_p95": statistics.median(p95),
                     "cpu_seconds": statistics.median(r["single"]["cpu_seconds"] for r in rounds)}
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", nargs="?", default=str(REPO / "saved_models" / "multi30k_en_de"),
                        help="a SavedModel export with assets.extra/ (model.yaml, weights, vocab)")
    parser.add_argument("--sentences", type=int, default=1000, help="first N of test2016")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--latency-sentences", type=int, default=100, help="sentences timed one at a time")
    parser.add_argument("--latency-chunk", type=int, default=5,
                        help="one at a time: the engines take turns every this many sentences")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--max-extra", type=int, default=50)
    parser.add_argument("--tf-threads", type=int, default=1, help="SavedModel intra-op threads")
    parser.add_argument("--tf-inter-threads", type=int, default=1,
                        help="SavedModel inter-op threads (2 lets an XLA export decode two chunks of a batch at once)")
    parser.add_argument("--tf-xla-flags", default=None,
                        help="XLA_FLAGS for the SavedModel worker (default: --xla_cpu_multi_thread_eigen=false "
                             "with one intra-op thread, as configure_threads sets; '' for none)")
    parser.add_argument("--ct2-threads", type=int, default=1, help="CTranslate2 intra_threads (inter_threads: 1)")
    parser.add_argument("--ct2-variants", default="",
                        help="comma-separated CTranslate2 engines by CPU backend and intra_threads, each in "
                             "its own worker: dnnl-1, mkl-2, ... (CT2_USE_MKL=0 or 1 in the worker, before "
                             "ctranslate2 is imported), and auto (CTranslate2Translator's own choice of both: "
                             "no CT2_USE_MKL, no OMP_NUM_THREADS, no thread arguments); float32 unless prefixed "
                             "int8@ (int8@dnnl-2); named ct2-<type>-<variant>")
    parser.add_argument("--cpus", default=None, help="pin every worker to these CPUs with taskset, e.g. 0 or 0-3")
    parser.add_argument("--engines", default="savedmodel,ct2-float32,ct2-int8",
                        help="comma-separated: savedmodel, savedmodel-no-xla (the same export without XLA), "
                             "savedmodel-baseline (--baseline, as it is), "
                             "savedmodel-eigen-pool (the same export without --tf-xla-flags' additions: XLA's "
                             "products handed to the intra-op pool), ct2-float32, ct2-int8")
    parser.add_argument("--no-xla", action="store_true",
                        help="re-export the SavedModel without XLA (keras-transformer export --no-xla)")
    parser.add_argument("--ct2-batch-limits", action="store_true",
                        help="CTranslate2: one length limit per batch (its longest sentence's) instead of grouping "
                             "sentences by their own limit")
    parser.add_argument("--baseline", default=None,
                        help="engine savedmodel-baseline: this SavedModel folder, timed as it is")
    parser.add_argument("--no-reexport", action="store_true",
                        help="time the SavedModel folder as it is (its own baked-in beam/alpha/max_extra)")
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--reference", default=str(DATA / "test_2016_flickr.de.gz"))
    parser.add_argument("--tokenized-reference", default=str(DATA / "test_2016_flickr.lc.norm.tok.de.gz"))
    parser.add_argument("--lang", default="de")
    parser.add_argument("--json", default=None, help="write all measurements here")
    args = parser.parse_args()
    if args.latency_chunk < 1:
        parser.error(f"--latency-chunk must be at least 1, got {args.latency_chunk}")

    from keras_transformer.engines.tensorflow_threads import xla_flags_for_threads

    xla_flags = args.tf_xla_flags
    if xla_flags is None:  # as configure_threads sets them for a process with these threads
        xla_flags = xla_flags_for_threads(args.tf_threads, os.environ.get("XLA_FLAGS", ""))
    variants = {}  # engine name -> (compute type, backend, threads or None), checked before any export
    for variant in [v for v in args.ct2_variants.split(",") if v]:
        compute_type, _, backend_variant = variant.rpartition("@")
        compute_type = compute_type or "float32"
        backend, _, threads = backend_variant.partition("-")
        if compute_type not in ("float32", "int8") or (
                backend_variant != "auto" and (backend not in ("dnnl", "mkl") or not threads.isdigit())):
            parser.error(f"--ct2-variants: {variant!r} is not [int8@]auto, [int8@]dnnl-N or [int8@]mkl-N")
        variants[f"ct2-{compute_type}-{backend_variant}"] = (compute_type, backend, int(threads) if threads else None)
    sentences = read_gz(args.source)[: args.sentences]
    references = read_gz(args.reference)[: args.sentences]
    tokenized = read_gz(args.tokenized_reference)[: args.sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].split()))
    folder = pathlib.Path(tempfile.mkdtemp(prefix="decode_vs_ct2-"))
    try:
        start = time.perf_counter()
        saved_model, without_xla, ct2 = prepare(args, folder)
        print(f"exports written in {time.perf_counter() - start:.0f} s", flush=True)
        common = {"sentences": sentences, "order": order, "batch_size": args.batch_size,
                  "latency_sentences": min(args.latency_sentences, len(sentences))}
        engines = {
            "savedmodel": (TF_WORKER, {**common, "model": saved_model, "threads": args.tf_threads,
                                       "inter_threads": args.tf_inter_threads}),
            "savedmodel-no-xla": (TF_WORKER, {**common, "model": without_xla, "threads": args.tf_threads,
                                              "inter_threads": args.tf_inter_threads}),
            "savedmodel-eigen-pool": (TF_WORKER, {**common, "model": saved_model, "threads": args.tf_threads,
                                                  "inter_threads": args.tf_inter_threads}),
            "savedmodel-baseline": (TF_WORKER, {**common, "model": args.baseline, "threads": args.tf_threads,
                                                "inter_threads": args.tf_inter_threads}),
            "ct2-float32": (CT2_WORKER, {**common, "model": ct2, "compute_type": "float32"}),
            "ct2-int8": (CT2_WORKER, {**common, "model": ct2, "compute_type": "int8"}),
        }
        worker_env = {}
        for name, (compute_type, backend, threads) in variants.items():
            engines[name] = (CT2_WORKER, {**common, "model": ct2, "compute_type": compute_type, "threads": threads})
            worker_env[name] = {} if backend == "auto" else {"CT2_USE_MKL": "1" if backend == "mkl" else "0"}
        for name, (script, setup) in engines.items():
            if script is CT2_WORKER:
                setup.update(repo=str(REPO), beam_size=args.beam_size, alpha=args.alpha, max_extra=args.max_extra,
                             exact_limits=not args.ct2_batch_limits)
                setup.setdefault("threads", args.ct2_threads)
        names = [n for n in args.engines.split(",") if n] + list(variants)
        if "savedmodel-baseline" in names and not args.baseline:
            parser.error("the engine savedmodel-baseline needs --baseline DIR")
        worker_env.update({"savedmodel": {"XLA_FLAGS": xla_flags}, "savedmodel-no-xla": {"XLA_FLAGS": xla_flags},
                      "savedmodel-baseline": {"XLA_FLAGS": xla_flags},
                      "savedmodel-eigen-pool": {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}})
        workers = {name: Worker(name, *engines[name], cpus=args.cpus, env=worker_env.get(name))  # one at a time
                   for name in names}
        results = {name: [] for name in names}
        try:
            latency_count = common["latency_sentences"]
            for round_index in range(args.rounds):
                turn = names if round_index % 2 == 0 else names[::-1]  # alternate who goes first
                for name in turn:
                    result = workers[name].run_round()
                    result["count"] = len(sentences)
                    results[name].append(result)
                # One sentence at a time: the engines take turns every --latency-chunk sentences, so that
                # both meet the machine in the same state (its speed drifts within seconds).
                single = {name: {"ms": [], "cpu_seconds": 0.0} for name in names}
                for chunk_index, start in enumerate(range(0, latency_count, args.latency_chunk)):
                    chunk = range(start, min(start + args.latency_chunk, latency_count))
                    for name in (turn if chunk_index % 2 == 0 else turn[::-1]):
                        part = workers[name].run_single(chunk)
                        single[name]["ms"].extend(part["ms"])
                        single[name]["cpu_seconds"] += part["cpu_seconds"]
                for name in names:
                    results[name][-1]["single"] = single[name]
                print(f"round {round_index + 1}/{args.rounds} done", flush=True)
        finally:
            warmups = {name: worker.warmup_seconds for name, worker in workers.items()}
            for worker in workers.values():
                worker.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    from keras_transformer.evaluation import bleu, multi30k_bleu

    rows = [summarise(name, results[name]) for name in names]
    for row in rows:
        row["warmup_seconds"] = warmups[row["engine"]]
    print(f"\n{len(sentences)} sentences of test2016, beam {args.beam_size}, alpha {args.alpha}, max_extra "
          f"{args.max_extra}, batches of {args.batch_size}; SavedModel: {args.tf_threads} intra-op and "
          f"{args.tf_inter_threads} inter-op thread(s), XLA_FLAGS={xla_flags!r}, "
          f"CTranslate2: intra_threads={args.ct2_threads}; CPUs: {args.cpus or 'any'}; {args.rounds} round(s)")
    header = (f"{'engine':<21} {'file order s/s':>15} {'sorted s/s':>11} {'p50 ms':>8} {'p95 ms':>8} "
              f"{'CPU s (a)':>10} {'CPU s (b)':>10} {'BLEU lc':>8} {'sacreBLEU':>10} {'same as SM':>10} "
              f"{'warm-up s':>10}")
    print(header)
    first = {name: results[name][0]["file_order"]["translations"] for name in names}
    for row in rows:
        name = row["engine"]
        hypotheses = first[name]
        row["bleu_multi30k"] = multi30k_bleu(hypotheses, tokenized, args.lang).score
        row["sacrebleu"] = bleu(hypotheses, references).score
        same = (sum(a == b for a, b in zip(hypotheses, first["savedmodel"])) if "savedmodel" in first else None)
        row["same_as_savedmodel"] = same
        print(f"{name:<21} {row['file_order']['median']:>15.1f} {row['sorted']['median']:>11.1f} "
              f"{row['single']['median_p50']:>8.1f} {row['single']['median_p95']:>8.1f} "
              f"{row['file_order']['cpu_seconds']:>10.1f} {row['sorted']['cpu_seconds']:>10.1f} "
              f"{row['bleu_multi30k']:>8.2f} {row['sacrebleu']:>10.2f} "
              f"{'-' if same is None else f'{same}/{len(sentences)}':>10} {row['warmup_seconds']:>10.1f}")
    base_name = "savedmodel" if "savedmodel" in results else names[0]
    if len(names) > 1:
        print(f"\nEach engine / {base_name}, paired by round (sentences/s ratio, above 1: faster than "
              f"{base_name}; latency: {base_name}'s p50 / its p50):")
        base = results[base_name]
        for name in names:
            if name == base_name:
                continue
            ratios = {}
            for mode in ("file_order", "sorted"):
                ratios[mode] = [b[mode]["seconds"] / r[mode]["seconds"] for r, b in zip(results[name], base)]
            ratios["single_p50"] = [statistics.median(b["single"]["ms"]) / statistics.median(r["single"]["ms"])
                                    for r, b in zip(results[name], base)]
            # The same sentence, timed by both engines within one chunk of turns: its own ratio.
            per_sentence = [a / b for r, base_round in zip(results[name], base)
                            for a, b in zip(base_round["single"]["ms"], r["single"]["ms"])]
            row = next(row for row in rows if row["engine"] == name)
            row["ratios"] = ratios
            row["per_sentence_latency_ratio_median"] = statistics.median(per_sentence)
            print(f"  {name}: " + "; ".join(
                f"{mode} {', '.join(f'{v:.2f}' for v in values)} (median {statistics.median(values):.2f})"
                for mode, values in ratios.items())
                + f"; per-sentence latency ratio, median over all rounds {statistics.median(per_sentence):.2f}")
    if args.json:
        for name in names:
            for result in results[name]:
                for mode in ("file_order", "sorted"):
                    result[mode].pop("translations", None)
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "rounds": results,
                                                       "translations": first}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
