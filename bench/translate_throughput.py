"""Translation throughput of `Translator.translate_lines` (what `evaluate` and `translate` run) on Multi30k sentences.

    .venv/bin/python bench/translate_throughput.py runs/gpu3/de_e \
        --checkpoint runs/gpu3/de_e/checkpoints/average-last-10.weights.h5 --sentences 320 --output /tmp/hyp.txt

Loads a training workdir's model (or an exported model's Keras weights), decodes the first `--sentences` English
sentences of `val.en.gz` with beam search through `tf.function` (every batch shape is traced in a warm-up pass that
is not timed), then times `--repeats` passes. Prints a table: median seconds per pass, sentences/s and output
words/s. `--output` writes the translations, so two checkouts (before / after a decoding change) can be timed
alternately and their outputs compared with `cmp`: the figure to quote is the ratio of the medians. Several
models (each with its `--checkpoint`, in order) are decoded as one ensemble.
"""

import argparse
import gzip
import pathlib
import statistics
import time

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="+", help="a training workdir or an exported model; several: an ensemble")
    parser.add_argument("--checkpoint", action="append", help="a .weights.h5 file (workdirs only); one per model")
    parser.add_argument("--source", default=str(DATA / "val.en.gz"))
    parser.add_argument("--sentences", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--max-extra", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", help="write the translations here")
    args = parser.parse_args(argv)

    from keras_transformer import load_translator
    from keras_transformer.evaluation import one_line
    opener = gzip.open if args.source.endswith(".gz") else open
    with opener(args.source, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][:args.sentences]
    start = time.perf_counter()
    single = len(args.model) == 1
    checkpoint = args.checkpoint[0] if single and args.checkpoint else args.checkpoint
    translator = load_translator(args.model[0] if single else args.model, checkpoint=checkpoint,
                                 beam_size=args.beam_size,
                                 alpha=args.alpha, max_extra=args.max_extra)
    load = time.perf_counter() - start
    start = time.perf_counter()
    translator.translate_lines(lines, batch_size=args.batch_size)  # traces every batch shape
    warm_up = time.perf_counter() - start
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        translations = translator.translate_lines(lines, batch_size=args.batch_size)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    words = sum(len(t.split()) for t in translations)
    if args.output:
        pathlib.Path(args.output).write_text("".join(one_line(t) + "\n" for t in translations), encoding="utf-8")
    rows = [("models", str(len(args.model))), ("sentences, batch size, beam, alpha, max extra",
             f"{len(lines)}, {args.batch_size}, {args.beam_size}, {args.alpha:g}, {args.max_extra}"),
            ("load (s)", f"{load:.1f}"), ("warm-up pass, tracing included (s)", f"{warm_up:.1f}"),
            ("pass: median (s)", f"{median:.2f}"), ("passes (s)", ", ".join(f"{s:.2f}" for s in seconds)),
            ("sentences/s", f"{len(lines) / median:.1f}"), ("output words/s", f"{words / median:.0f}")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
