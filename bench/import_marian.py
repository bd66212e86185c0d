"""Importing an OPUS-MT-shaped Marian checkpoint, and decoding it: our SavedModel and CTranslate2 exports against
transformers' `generate` on the same CPU.

A random `MarianMTModel` of the OPUS-MT base shape (6 + 6 layers, d_model 512, 8 heads, d_ff 2048, a shared
vocabulary of 58,101 tokens, swish: about 74M parameters) is saved as `save_pretrained` saves it, with SentencePiece
models learned here on Multi30k (its vocabulary padded to 58,101 tokens). Then:

* `keras-transformer import` in a child process: wall time and the child's peak RSS, against the weights file's size
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
import gzip
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
SIZES = {"base": dict(layers=6, d_model=512, heads=8, d_ff=2048, vocab=58101),
         "small": dict(layers=2, d_model=128, heads=4, d_ff=512, vocab=8000)}


def lines(name, count):
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(count)]


def build_checkpoint(folder, size):
    import sentencepiece
    import torch
    import transformers

    shape = SIZES[size]
    folder.mkdir(parents=True)
    for side, name in (("source", "train.en.gz"), ("target", "train.de.gz")):
        with open(folder / f"{side}.spm", "wb") as handle:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines(name, 20000)), model_writer=handle, vocab_size=4000,
                model_type="unigram", minloglevel=2, unk_id=0, eos_id=1, bos_id=-1, pad_id=-1)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for side in ("source", "target"):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
        for index in range(processor.get_piece_size()):
            if not (processor.is_control(index) or processor.is_unknown(index)):
                vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
    while len(vocabulary) < shape["vocab"] - 1:
        vocabulary[f"<filler_{len(vocabulary)}>"] = len(vocabulary)
    vocabulary["<pad>"] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
    pad = len(vocabulary) - 1
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary), decoder_vocab_size=len(vocabulary), d_model=shape["d_model"],
        encoder_layers=shape["layers"], decoder_layers=shape["layers"], encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"], encoder_ffn_dim=shape["d_ff"], decoder_ffn_dim=shape["d_ff"],
        activation_function="swish", max_position_embeddings=512, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, scale_embedding=True)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    transformers.MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                                 str(folder / "vocab.json")).save_pretrained(folder)
    return sum(parameter.numel() for parameter in model.parameters())


def baseline_rss_mb():
    """The peak RSS of a child that loads what the import's process loads (TensorFlow, Keras, the importer) and
    imports nothing: what the import's own peak is compared with. Measured before the import (the children's peak
    is a maximum over all of them)."""
    subprocess.run([sys.executable, "-c", "import keras_transformer.cli, keras_transformer.imports.importer, "
                    "keras_transformer.model, keras; keras.ops.zeros(1)"], check=True)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def timed_import(folder, workdir):
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "keras_transformer.cli", "import", str(folder), "--workdir", str(workdir)],
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, peak_kib / 1024


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
    baseline_mb = baseline_rss_mb()
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
