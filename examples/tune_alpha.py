"""Choose the length-penalty exponent alpha on a validation split: one decode per alpha, one table.

Beam search ranks finished hypotheses by log P / lp(length) with lp = ((5 + |Y|) / 6) ** alpha. A model whose
translations come out short (the `length_ratio` column below 1, where BLEU's brevity penalty bites) gains from a
larger alpha; past the point where the outputs reach the references' length it loses again, and a large alpha
lets a few looping hypotheses run to the length limit. Run it on the validation split only, never on the test set,
and put the chosen value into the config's `decoding.alpha` (the export takes `--alpha`). Distrust an
optimum right before a steep drop: on Multi30k EN-DE validation chose 1.6 (41.41, against 41.06 at 1.0 and 40.68 at
1.8), and test2016 then lost 1.2 BLEU against 1.0, its references being relatively shorter (history/experiments.md,
"A wider length-penalty sweep").

    python examples/tune_alpha.py --model runs/multi30k_en_de --average 10 --lang de \
        --source ../shared/data/multi30k/val.en.gz --reference ../shared/data/multi30k/val.de.gz \
        --tokenized-reference ../shared/data/multi30k/val.lc.norm.tok.de.gz --alphas 0.6 1.0 1.5 2.0

Each alpha is one full decode (about 3 minutes for the 1,014 Multi30k validation sentences with beam 5 on this
repository's 2-core CPU); `--output-prefix P` keeps the translations as `P<alpha>.txt`.
"""

import argparse
import json
import sys

from keras_transformer import inference


def tune(model, source, reference, alphas, *, tokenized_reference=None, lang=None, checkpoint=None, average=None,
         beam_size=None, batch_size=64, output_prefix=None):
    """Scores one decode of `source` per alpha; returns `[{"alpha": a, "bleu": ..., "length_ratio": ...}, ...]`."""
    rows = []
    for alpha in alphas:  # beam_size None: the model config's (load_translator drops None options)
        output = f"{output_prefix}{alpha}.txt" if output_prefix else None
        scores = inference.evaluate(model, source, reference, tokenized_reference=tokenized_reference, lang=lang,
                                   checkpoint=checkpoint, average=average, batch_size=batch_size, output=output,
                                   alpha=float(alpha), beam_size=beam_size)
        rows.append({"alpha": float(alpha), **scores})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def table(rows):
    """A markdown table of `tune`'s rows, the best alpha (by the Multi30k protocol if present) in bold."""
    key = "bleu_multi30k" if all("bleu_multi30k" in row for row in rows) else "bleu"
    best = max(rows, key=lambda row: row[key])
    columns = ["alpha", "bleu", "bleu_lowercase"] + (["bleu_multi30k"] if key == "bleu_multi30k" else []) + [
        "length_ratio"]
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---:" for _ in columns) + " |"]
    for row in rows:
        cells = [f"{row[c]:.4f}" if c == "length_ratio" else f"{row[c]:g}" for c in columns]
        if row is best:
            cells[columns.index(key)] = f"**{cells[columns.index(key)]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a training workdir or an exported model")
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--tokenized-reference", help="*.lc.norm.tok.* references (Multi30k protocol)")
    parser.add_argument("--lang", help="target language code, for the Multi30k protocol")
    parser.add_argument("--checkpoint", help="a .weights.h5 file (workdirs only)")
    parser.add_argument("--average", type=int, help="average the last N epoch checkpoints (workdirs only)")
    parser.add_argument("--beam-size", type=int, help="default: the model config's")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.6, 1.0, 1.5, 2.0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output-prefix", help="write each alpha's translations to PREFIX<alpha>.txt")
    args = parser.parse_args(argv)
    rows = tune(args.model, args.source, args.reference, args.alphas, tokenized_reference=args.tokenized_reference,
                lang=args.lang, checkpoint=args.checkpoint, average=args.average, beam_size=args.beam_size,
                batch_size=args.batch_size, output_prefix=args.output_prefix)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
