"""Validation BLEU of a shipped model in each export precision, against its float32 export.

For each model it writes, under `--workdir` (never into saved_models/), a SavedModel in bfloat16 and CTranslate2
exports in float32 and in each CTranslate2 precision asked for (`keras-transformer export --precision`), decodes
the 1,014-sentence validation split with each (the shipped float32 SavedModel as it is), and prints BLEU by the
published Multi30k protocol (output lowercased and Moses-tokenized, `*.lc.norm.tok.*` references) and cased
sacreBLEU, each precision's difference from the float32 export of its format, and how many translations are the
same as float32's. The acceptance bound of issue #65: every difference within 0.3 BLEU.

Each export decodes through `keras_transformer.load_translator`, with the decoding the export records: the
SavedModel's Python engine rebuilds a bfloat16 export in bfloat16 (the graph's weights and precision), CTranslate2
loads with the compute type the export records.

    python bench/precision_quality.py                                   # both shipped models, bfloat16 and int8
    python bench/precision_quality.py --models saved_models/multi30k_en_de:de --ct2 int8,int8_float32
"""

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_transformer import cli, evaluation, inference  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "multi30k"
SHIPPED = "saved_models/multi30k_en_de:de,saved_models/multi30k_en_fr:fr"
BOUND = 0.3  # BLEU: the largest difference from float32 issue #65 accepts


def export(model, out, *arguments):
    """`keras-transformer export` of `model` to `out` (replaced), or the error."""
    if cli.main(["export", "--workdir", str(model), "--out", str(out), "--overwrite", *arguments]) != 0:
        raise SystemExit(f"export of {model} to {out} failed")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=SHIPPED, help="MODEL:LANG,... (default: the two shipped models)")
    parser.add_argument("--workdir", default="/tmp/kt_precision_quality", help="where the exports are written")
    parser.add_argument("--ct2", default="int8", help="CTranslate2 precisions beside float32 (comma-separated)")
    parser.add_argument("--no-bfloat16", action="store_true", help="skip the bfloat16 SavedModel")
    parser.add_argument("--sentences", type=int, default=0, help="the first N validation sentences (0: all)")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for entry in args.models.split(","):
        model, lang = entry.rsplit(":", 1)
        name = pathlib.Path(model).name
        if pathlib.Path(model).resolve().parent == (REPO / "saved_models").resolve() and \
                workdir.resolve().is_relative_to((REPO / "saved_models").resolve()):
            raise SystemExit("--workdir lies in saved_models/: the shipped models are not exported again there.")
        variants = [("SavedModel", "float32", pathlib.Path(model))]
        if not args.no_bfloat16:
            variants.append(("SavedModel", "bfloat16", export(model, workdir / f"{name}_bfloat16", "--precision",
                                                              "bfloat16")))
        for precision in ["float32"] + [p for p in args.ct2.split(",") if p and p != "float32"]:
            variants.append(("CTranslate2", precision, export(model, workdir / f"{name}_ct2_{precision}", "--format",
                                                              "ctranslate2", "--precision", precision)))
        source = evaluation.read_lines(DATA / "val.en.gz")
        reference = evaluation.read_lines(DATA / f"val.{lang}.gz")
        tokenized = evaluation.read_lines(DATA / f"val.lc.norm.tok.{lang}.gz")
        if args.sentences:
            source, reference, tokenized = (lines[:args.sentences] for lines in (source, reference, tokenized))
        outputs = {}
        for kind, precision, folder in variants:
            hypotheses = workdir / f"{name}_{kind}_{precision}.txt"
            started = time.perf_counter()
            scores = inference.evaluate(str(folder), source, reference, tokenized_reference=tokenized, lang=lang,
                                        output=str(hypotheses))
            outputs[kind, precision] = hypotheses.read_text(encoding="utf-8").splitlines()
            rows.append([name, kind, precision, scores["bleu_multi30k"], scores["bleu"],
                         time.perf_counter() - started, outputs[kind, precision], outputs[kind, "float32"]])
            print(f"{name} {kind} {precision}: BLEU {scores['bleu_multi30k']:.2f} lc.tok / {scores['bleu']:.2f} "
                  f"cased ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    print(f"\nvalidation split, {len(rows[0][6])} sentences; decoding as each export records it\n")
    print("| model | export | precision | val BLEU lc.tok | cased | difference from float32 (lc.tok) | "
          "same translation as float32 | decoding s |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    base = {}
    within = True
    for name, kind, precision, lc, cased, seconds, lines, float32 in rows:
        base.setdefault((name, kind), lc)
        difference = lc - base[name, kind]
        within &= abs(difference) <= BOUND + 1e-9
        same = sum(a == b for a, b in zip(lines, float32))
        print(f"| {name} | {kind} | {precision} | {lc:.2f} | {cased:.2f} | {difference:+.2f} | {same:,} / "
              f"{len(lines):,} | {seconds:.0f} |")
    print(f"\nevery precision within {BOUND} BLEU of its float32 export: {'yes' if within else 'NO'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
