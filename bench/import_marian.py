"""Importing an OPUS-MT-shaped Marian checkpoint, and decoding it: our SavedModel and CTranslate2 exports against
transformers' `generate` on the same CPU.

A random `MarianMTModel` of the OPUS-MT base shape (6 + 6 layers, d_model 512, 8 heads, d_ff 2048, a shared
vocabulary of 58,101 tokens, swish: about 74M parameters) is saved as `save_pretrained` saves it, with SentencePiece
models learned here on Multi30k (its vocabulary padded to 58,101 tokens). Then:

* `keras-transformer import` in a child process: wall time and the child's own peak RSS (VmHWM, `peak_rss.py`),
  above that of a child that loads the same modules, against the weights file's size
  (the goal: under 30 s, under 2x the weights);
* the imported workdir exported as a SavedModel and for CTranslate2;
* sentences/s of transformers' `generate`, the SavedModel and the CTranslate2 export on the same Multi30k
  sentences, batch 32, beam 4, no length normalization, each translation capped at the same number of tokens;
  runs alternate between the three (paired), `--repeats` rounds, medians reported.

A random model does not stop where a trained one would: every engine decodes to the same cap, so the comparison is
of decoding cost per token at equal lengths, not of translation quality.

Usage:

    python bench/import_marian.py                       # base size (downloads nothing)
    python bench/import_marian.py --size small --repeats 2   # a quick check of the script
"""

import argparse
import os
import pathlib
import statistics
import tempfile
import time

from peak_rss import run_child
from random_marian import lines, marian_folder

SIZES = {"base": dict(layers=6, d_model=512, heads=8, d_ff=2048, vocab=58101),
         "small": dict(layers=2, d_model=128, heads=4, d_ff=512, vocab=8000)}
# the baseline: a child that loads what the import's process loads (TensorFlow, Keras, the importer), imports nothing
BASELINE = ("import keras_transformer.cli, keras_transformer.imports.importer, keras_transformer.model, keras\n"
            "keras.ops.zeros(1)\n")
IMPORT = "import sys\nfrom keras_transformer.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def build_checkpoint(folder, size):
    """A random `MarianMTModel` of `SIZES[size]` saved in `folder` as `save_pretrained` saves it; returns its number
    of parameters."""
    import torch
    import transformers

    config = marian_folder(folder, SIZES[size], sentences=20000, pieces=4000, activation="swish")
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[config.pad_token_id]]
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    return sum(parameter.numel() for parameter in model.parameters())


def timed_import(folder, workdir):
    """Wall seconds and the child's own peak RSS (MiB) of `keras-transformer import` (`peak_rss.py`)."""
    seconds, peak_mb, _ = run_child(IMPORT, ["import", str(folder), "--workdir", str(workdir)])
    return seconds, peak_mb


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens each translation is capped at")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--import-only", action="store_true", help="measure the import, not the decoding")
    args = parser.parse_args()

    root = pathlib.Path(tempfile.mkdtemp(prefix="import_marian_"))
    folder, workdir = root / "checkpoint", root / "workdir"
    parameters = build_checkpoint(folder, args.size)
    weights_mb = (folder / "model.safetensors").stat().st_size / 2**20
    _, baseline_mb, _ = run_child(BASELINE)
    seconds, peak_mb = timed_import(folder, workdir)
    if args.import_only:
        print(f"| parameters | weights file | import | peak RSS | baseline RSS | peak - baseline |\n"
              f"| ---: | ---: | ---: | ---: | ---: | ---: |\n"
              f"| {parameters / 1e6:.1f}M | {weights_mb:.0f} MiB | {seconds:.1f} s | {peak_mb:.0f} MiB | "
              f"{baseline_mb:.0f} MiB | {peak_mb - baseline_mb:.0f} MiB = "
              f"{(peak_mb - baseline_mb) / weights_mb:.2f}x |")
        return

    import torch
    import transformers

    from keras_transformer.engines.loader import load_translator
    from keras_transformer.exports import make_exporter

    sentences = lines("test_2016_flickr.en.gz", args.sentences)
    source_lengths = [len(ids) for ids in transformers.MarianTokenizer.from_pretrained(folder)(sentences)["input_ids"]]
    # the package caps a translation at source length (with eos) + max_extra; with max_extra chosen so that the
    # longest source's cap is --max-tokens, and that cap given to generate, a random model (which rarely ends)
    # makes every engine decode about as many steps
    max_extra = max(0, args.max_tokens - max(source_lengths))
    settings = dict(strategy="beam", beam_size=args.beam_size, alpha=0.0, max_extra=max_extra)
    exports = {"savedmodel": make_exporter("savedmodel").export(workdir, root / "savedmodel", **settings),
               "ctranslate2": make_exporter("ctranslate2").export(workdir, root / "ct2", **settings, early_exit=True)}
    engines = {name: load_translator(path) for name, path in exports.items()}
    reference = transformers.MarianMTModel.from_pretrained(folder).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    torch.set_num_threads(os.cpu_count() or 1)

    def run_reference():
        for start in range(0, len(sentences), args.batch_size):
            batch = tokenizer(sentences[start:start + args.batch_size], return_tensors="pt", padding=True)
            with torch.no_grad():
                reference.generate(**batch, num_beams=args.beam_size, length_penalty=0.0, do_sample=False,
                                   max_new_tokens=max(source_lengths) + max_extra)

    def run(engine):
        return lambda: engine.translate_lines(sentences, batch_size=args.batch_size)

    runners = {"transformers generate": run_reference, "our SavedModel": run(engines["savedmodel"]),
               "our CTranslate2": run(engines["ctranslate2"])}
    for runner in runners.values():  # warm-up: graphs traced, caches filled
        runner()
    times = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, runner in runners.items():  # paired: the three run in turn within each round
            start = time.perf_counter()
            runner()
            times[name].append(time.perf_counter() - start)

    print(f"# import_marian: {args.size} ({parameters / 1e6:.1f}M parameters, weights {weights_mb:.0f} MiB)")
    print(f"import: {seconds:.1f} s, peak RSS {peak_mb:.0f} MiB, {peak_mb - baseline_mb:.0f} MiB above a process "
          f"that loads the same modules ({(peak_mb - baseline_mb) / weights_mb:.2f}x the weights file)")
    print(f"decoding {len(sentences)} sentences, batch {args.batch_size}, beam {args.beam_size}, "
          f"{args.repeats} rounds (median):")
    print("| engine | s | sentences/s | vs transformers |")
    print("| --- | --- | --- | --- |")
    base = statistics.median(times["transformers generate"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {len(sentences) / median:.1f} | {base / median:.2f}x |")


if __name__ == "__main__":
    main()
