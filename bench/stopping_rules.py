"""Beam search's two stopping rules on a model's validation split: steps, BLEU and what changes.

For each sentence of the validation split, decoded one at a time (as a
serving request is), with the model's beam size, alpha and max_extra:

* "exact": `decoding.beam_search` as by default: a sentence stops when no
  alive hypothesis can still beat its finished one.
* "early exit": `early_exit=True`, which adds OpenNMT's and CTranslate2's rule
  (docs/decoding.md, "Early exit").

It prints, per rule, the decoder steps per sentence (mean, median, total),
BLEU by the published Multi30k protocol (lowercased, Moses-tokenized
references) and cased sacreBLEU, and then how many translations the early exit
changed, which ones, and how many of those it scores lower (by the search's
own score, log P / lp). Steps are what a single-sentence request pays for; the
latency itself is `bench/decode_vs_ctranslate2.py`'s.

Quality choices use the validation split only: this is the figure the shipped
models' `early_exit` setting was chosen by (docs/BENCHMARKS.md).

Usage:

    python bench/stopping_rules.py                                     # the shipped EN-DE model
    python bench/stopping_rules.py saved_models/multi30k_en_fr --lang fr
    python bench/stopping_rules.py runs/en_de --sentences 200 --json out.json
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_transformer import decoding, load_translator  # noqa: E402
from keras_transformer.evaluation import bleu, multi30k_bleu, read_lines  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "multi30k"
RULES = (("exact", False), ("early exit", True))


def decode_one_at_a_time(translator, sentences, early_exit):
    """Each sentence alone: `(translations, scores, steps)`."""
    models = translator.models

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def search(source):
        return decoding.beam_search(models, source, beam_size=translator.beam_size, alpha=translator.alpha,
                                    max_extra=translator.max_extra, early_exit=early_exit, return_steps=True)

    translations, scores, steps = [], [], []
    for sentence in sentences:
        tokens, score, count = search(translator.encode_sources(tf.constant([sentence])))
        text = translator.target_tokenizer.detokenize(tokens[:, 0]).numpy()[0]
        translations.append(text.decode("utf-8"))
        scores.append(float(score[0, 0]))
        steps.append(int(count))
    return translations, scores, steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=str(REPO / "saved_models" / "multi30k_en_de"),
                        help="a training workdir or a SavedModel export with its Keras weights")
    parser.add_argument("--lang", default="de", help="target language of the Multi30k validation split")
    parser.add_argument("--sentences", type=int, default=None, help="the first N sentences (default: all)")
    parser.add_argument("--beam-size", type=int, default=None, help="default: the model's")
    parser.add_argument("--alpha", type=float, default=None, help="default: the model's")
    parser.add_argument("--max-extra", type=int, default=None, help="default: the model's")
    parser.add_argument("--json", default=None, help="write the per-sentence figures here")
    args = parser.parse_args()

    sources = read_lines(DATA / "val.en.gz")[: args.sentences]
    references = read_lines(DATA / f"val.{args.lang}.gz")[: args.sentences]
    tokenized = read_lines(DATA / f"val.lc.norm.tok.{args.lang}.gz")[: args.sentences]
    translator = load_translator(args.model, beam_size=args.beam_size, alpha=args.alpha, max_extra=args.max_extra)
    if not hasattr(translator, "models"):
        parser.error(f"{args.model} is a CTranslate2 export, which has only its own stopping rule.")

    results = {}
    for name, early_exit in RULES:
        start = time.perf_counter()
        translations, scores, steps = decode_one_at_a_time(translator, sources, early_exit)
        results[name] = {"translations": translations, "scores": scores, "steps": steps,
                         "seconds": time.perf_counter() - start,
                         "bleu_multi30k": multi30k_bleu(translations, tokenized, args.lang).score,
                         "sacrebleu": bleu(translations, references).score}

    print(f"\n{args.model}: Multi30k validation EN-{args.lang.upper()}, {len(sources)} sentences one at a time, "
          f"beam {translator.beam_size}, alpha {translator.alpha}, max_extra {translator.max_extra}")
    print(f"{'rule':<11} {'steps/sentence':>15} {'median':>7} {'total':>7} {'BLEU lc.tok':>12} {'sacreBLEU':>10} "
          f"{'seconds':>8}")
    for name, _ in RULES:
        r = results[name]
        print(f"{name:<11} {np.mean(r['steps']):>15.2f} {statistics.median(r['steps']):>7.0f} "
              f"{sum(r['steps']):>7d} {r['bleu_multi30k']:>12.2f} {r['sacrebleu']:>10.2f} {r['seconds']:>8.1f}")
    exact, early = results["exact"], results["early exit"]
    changed = [i for i, (a, b) in enumerate(zip(exact["translations"], early["translations"])) if a != b]
    lower = [i for i in changed if early["scores"][i] < exact["scores"][i] - 1e-6]
    fewer = sum(a < b for a, b in zip(early["steps"], exact["steps"]))
    print(f"\nearly exit: {fewer} of {len(sources)} sentences stop sooner "
          f"({1 - sum(early['steps']) / sum(exact['steps']):.1%} fewer steps in all); "
          f"{len(changed)} translations change, {len(lower)} of them to a lower-scored one")
    print(f"changed (0-based line numbers): {changed}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"args": vars(args), "changed": changed, "lower_scored": lower, "results": results},
            indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
