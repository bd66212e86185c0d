"""The `keras-transformer` command: one subcommand per library function.

```
keras-transformer train     --config FILE.yaml [--config MORE.yaml] [--set key=value ...] --workdir DIR
keras-transformer evaluate  --model DIR [--model DIR ...] --source FILE --reference FILE
                            [--tokenized-reference FILE --lang de]
keras-transformer translate --model DIR [--model DIR ...] "A man rides a bike." ...   (or sentences on stdin)
keras-transformer export    --workdir DIR [--workdir DIR ...] --out DIR [--average N]
keras-transformer average   --workdir DIR [--last N] [--output FILE]
keras-transformer pack      --config FILE.yaml [--set key=value ...] --workdir DIR   (token ids for other backends)
keras-transformer plot-attention --model DIR "A man rides a bike." --out DIR   (PNG heatmaps per layer and head)
keras-transformer serve     --model DIR [--port 8501] [--host H] [--name NAME]   (HTTP, TensorFlow Serving's REST API)
keras-transformer verify    PATH   (an export's files against its manifest; exit 0 whole, 3 damaged, 2 no manifest)
```

A repeated --model (or --workdir for export) decodes those models as one ensemble.

Each subcommand parses its arguments and calls one function of the library
(`training.train_and_evaluate`, `inference.evaluate`, `inference.translate`,
`export.export`, `workdir.average_workdir`, `training.pack_arrays`, `serving.serve`); everything they do can be
done from Python the same way. Errors that name a problem (a bad config key, a missing
checkpoint, a corrupt file, a full disk) are printed as one line and the command exits with the status
`errors.EXIT_CODES` gives that kind of fault (`keras-transformer --help` lists them).
"""

import argparse
import functools
import json
import logging
import math
import os
import pathlib
import re
import secrets
import sys

import keras_transformer
from keras_transformer.arguments import integer_at_least, number_at_least
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, CheckpointError, ConfigError, RunStopped,
                                     WorkdirBusyError, describe_fault, exit_codes_help, raise_on_sigterm)
from keras_transformer.tensorflow_logs import loud_tensorflow_import, tensorflow_logs_wanted, without_cpp_log_lines

# Each command imports its library module when it runs (the imports inside the functions below), so that
# `--help` and argument errors answer without importing TensorFlow, which takes seconds.


_EXAMPLES = """examples:
  keras-transformer train --config configs/tiny_copy.yaml --workdir runs/tiny_copy
  keras-transformer train --config configs/multi30k_en_de.yaml --set training.epochs=30 --workdir runs/en_de
  keras-transformer translate --model saved_models/multi30k_en_de "A man rides a bike."
  keras-transformer evaluate --model runs/en_de --average 5 --source test.en.gz --reference test.de.gz
  keras-transformer average --workdir runs/en_de --last 5
  keras-transformer export --workdir runs/en_de --average 5 --out saved_models/en_de
  keras-transformer verify saved_models/en_de
  keras-transformer evaluate --model runs/en_de --model runs/en_de_seed2 --average 5 --source test.en.gz ...
  keras-transformer serve --model saved_models/multi30k_en_de --port 8501
"""


_POSITIVE, _NON_NEGATIVE = integer_at_least(1), integer_at_least(0)
_ALPHA = number_at_least(0)  # the length-penalty exponent: 0 ranks by log-probability alone


def _unit_interval(text):
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _positive_number(text):
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _decoding_arguments(parser, title="decoding (default: the model's, from its model.yaml)", batch_size=True):
    """The `DecodeOptions` arguments, one set for translate, evaluate and export (`_decode_settings` reads them)."""
    group = parser.add_argument_group(title)
    group.add_argument("--strategy", choices=tuple(STRATEGIES),
                       help="beam search (the paper), greedy, or sample (default: the model's; a --sampling-* "
                            "or --seed argument alone means sample)")
    group.add_argument("--beam-size", type=_POSITIVE, help="beam: beams per sentence")
    group.add_argument("--alpha", type=_ALPHA, help="beam: length penalty exponent, >= 0 (paper: 0.6)")
    group.add_argument("--max-extra", type=_NON_NEGATIVE,
                       help="a translation has at most source length + this many tokens")
    group.add_argument("--early-exit", action="store_true", default=None,
                       help="beam: also stop a sentence by OpenNMT's and CTranslate2's rule: about 15%% fewer "
                            "steps, a few translations change (docs/decoding.md)")
    group.add_argument("--sampling-topk", type=_NON_NEGATIVE, metavar="K",
                       help="sample: draw among the K most probable tokens (0: all)")
    group.add_argument("--sampling-topp", type=_unit_interval, metavar="P",
                       help="sample: draw within the nucleus of probability P (1: all)")
    group.add_argument("--sampling-temperature", type=_positive_number, metavar="T",
                       help="sample: divide the logits by T (below 1: closer to greedy)")
    group.add_argument("--seed", type=integer_at_least(0),
                       help="sample: the draws' seed (same seed, same samples; default: a fresh one, printed)")
    if batch_size:
        group.add_argument("--batch-size", type=_POSITIVE, default=64,
                           help="sentences decoded together (default 64)")


def _weights_arguments(parser, ensemble=False, models="--model"):
    group = parser.add_argument_group("weights (training workdirs only; --checkpoint or --average, not both)")
    if ensemble:
        group.add_argument("--checkpoint", action="append", help="a .weights.h5 file (default: the last epoch "
                           f"checkpoint); with several {models}, one --checkpoint per {models[2:]}, in the same "
                           "order")
    else:
        group.add_argument("--checkpoint", help="a .weights.h5 file (default: the last epoch checkpoint)")
    group.add_argument("--average", type=_POSITIVE, metavar="N",
                       help="average the last N epoch checkpoints (all of them, with a warning, if there are fewer)")


MODEL_HELP = ("a training workdir or an exported model; repeat it to decode several models sharing a vocabulary "
              "as one ensemble (the mean of their next-token distributions)")


def _experiment_arguments(parser, workdir_help):
    parser.add_argument("--config", action="append", required=True, metavar="FILE.yaml",
                        help="experiment config; repeat to layer files (later ones win)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                        help="override one config value (YAML syntax); repeatable, later ones win")
    parser.add_argument("--workdir", required=True, metavar="DIR", help=workdir_help)


def build_parser():
    """The argument parser of `keras-transformer` (all subcommands).

    Example:

    >>> build_parser().parse_args(["average", "--workdir", "runs/x", "--last", "3"]).last
    3
    """
    parser = argparse.ArgumentParser(
        prog="keras-transformer", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EXAMPLES + "\n" + exit_codes_help() + "\n",
        description="Train, evaluate, translate with, average and export Transformer models "
                    "(Vaswani et al., 2017).")
    parser.add_argument("--verbose", "-v", action="store_true", help="show TensorFlow's own log lines too")
    parser.add_argument("--version", action="version", version=f"%(prog)s {keras_transformer.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    train = commands.add_parser(
        "train", help="train (or resume) from a YAML experiment config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trains the experiment in --config, resuming whatever an earlier run left in --workdir "
                    "(run the same command again after any interruption). If the config names test data, "
                    "the finished model is then evaluated on it.",
        epilog="The YAML has sections model (TransformerConfig fields or preset:), data, training and decoding; "
               "docs/config.md lists every key with its type, default and accepted values (recipes: configs/).\n"
               "  --set training.epochs=20 --set model.dropout=0.3 --set training.strategy=mirrored")
    _experiment_arguments(train, "folder for checkpoints, logs, history.csv and the vocabulary")
    train.add_argument("--dry-run", action="store_true",
                       help="check the config (the model section, that the data files exist and their line counts "
                            "agree) and print it resolved: presets expanded, every default filled in")

    evaluate = commands.add_parser("evaluate", help="translate a test set and report sacreBLEU",
                                   description="Translates --source and scores the output against --reference "
                                               "with sacreBLEU (cased and lowercased); with --tokenized-reference "
                                               "and --lang also the published Multi30k protocol.")
    evaluate.add_argument("--model", required=True, action="append", metavar="DIR", help=MODEL_HELP)
    evaluate.add_argument("--source", required=True, help="source sentences, one per line (plain or .gz)")
    evaluate.add_argument("--reference", required=True, help="reference translations, one per line")
    evaluate.add_argument("--tokenized-reference", help="*.lc.norm.tok.* references (Multi30k protocol)")
    evaluate.add_argument("--lang", help="target language code, for the Multi30k protocol")
    evaluate.add_argument("--output", help="write the translations to this file (its folder must exist; checked, "
                                           "like the line counts of the references, before decoding)")
    evaluate.add_argument("--json", action="store_true",
                          help="print one JSON object (scores, sacreBLEU signatures, weights, decoding settings, "
                               "sentences, seconds) instead of the readable report")
    _weights_arguments(evaluate, ensemble=True)
    _decoding_arguments(evaluate)

    translate = commands.add_parser("translate", help="translate sentences (arguments or stdin)",
                                    description="Translates the sentences given as arguments, or else each line "
                                                "of standard input (plain or gzip), and prints one translation per "
                                                "line (a line break inside a translation becomes a space).")
    translate.add_argument("--model", required=True, action="append", metavar="DIR", help=MODEL_HELP)
    translate.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    _weights_arguments(translate, ensemble=True)
    _decoding_arguments(translate)
    translate.add_argument("--n-best", type=_POSITIVE, metavar="N",
                           help="print N hypotheses per sentence, best first, as 'INDEX<tab>SCORE<tab>TRANSLATION' "
                                "lines (INDEX: the sentence's, from 0); beam search needs N <= --beam-size")

    export = commands.add_parser("export", help="write a SavedModel (strings in, translations out)",
                                 description="Exports a training workdir's model as a TensorFlow SavedModel with "
                                             "tokenization and beam search inside, or (--format ctranslate2) as a "
                                             "CTranslate2 model folder for the fastest CPU serving (docs/serving.md).")
    export.add_argument("--workdir", required=True, action="append", metavar="DIR",
                        help="the training workdir (or a SavedModel export, exported again with this version: the "
                             "same weights); repeat it to export several (sharing a vocabulary) as one ensemble. "
                             "With --format ctranslate2, one workdir or SavedModel export")
    export.add_argument("--format", choices=("savedmodel", "ctranslate2"), default="savedmodel",
                        help="savedmodel (default) or ctranslate2 (needs the ctranslate2 extra: "
                             "`pip install '.[ctranslate2]'`)")
    export.add_argument("--quantization", help="ctranslate2 only: the stored weight type, e.g. int8 (default float32)")
    export.add_argument("--out", required=True, metavar="DIR", help="the export folder")
    export.add_argument("--overwrite", action="store_true", help="replace an existing export")
    export.add_argument("--no-xla", action="store_true",
                        help="savedmodel only: do not compile the search with XLA (by default it is, one "
                             "compilation per bucketed input shape on first use; docs/serving.md)")
    _weights_arguments(export, ensemble=True, models="--workdir")
    _decoding_arguments(export, "decoding of serving_default and n_best, recorded in the export (default: the "
                                "model's; the SavedModel's `sample` signature takes its settings as inputs)",
                        batch_size=False)

    average = commands.add_parser("average", help="average the last N checkpoints into one weights file",
                                  description="Averages the last N epoch checkpoints of a workdir (the paper: 5 "
                                              "for base models, 20 for big ones), or the weights files given "
                                              "with --checkpoint (e.g. a run and its continuation in another "
                                              "workdir).")
    average.add_argument("--workdir", required=True, metavar="DIR", help="the training workdir (its model.yaml)")
    average.add_argument("--last", type=_POSITIVE, metavar="N", help="how many checkpoints (default 5)")
    average.add_argument("--checkpoint", action="append", metavar="FILE",
                         help="a .weights.h5 file of the workdir's architecture to average instead (one option per "
                              "file)")
    average.add_argument("--output", metavar="FILE", help="default: WORKDIR/averaged.weights.h5")

    pack = commands.add_parser(
        "pack", help="tokenize a config's data into WORKDIR/arrays/ for training on another backend",
        description="Learns or loads the vocabulary as train does and writes the tokenized training and validation "
                    "pairs to WORKDIR/arrays/ with the experiment and model configs. Train the folder on any "
                    "Keras backend (JAX on a GPU machine without TensorFlow) with "
                    "`python -m keras_transformer.arrays WORKDIR`; evaluate, translate and export read it here "
                    "(docs/gpu.md).")
    _experiment_arguments(pack, "the folder to write (vocabulary, configs, arrays/)")

    serve = commands.add_parser(
        "serve", help="serve a model over HTTP (TensorFlow Serving's REST API, /translate)",
        description="Serves the model over HTTP until SIGTERM: TensorFlow Serving's REST API (GET /v1/models/NAME, "
                    "POST /v1/models/NAME:predict with the export's signatures), POST /translate with per-request "
                    "decoding options, /healthz, /readyz (after loading and a warm-up translation) and /stats. "
                    "Concurrent requests asking for the same decoding are decoded in one batch. Needs "
                    "the serve extra, `pip install '.[serve]'` (docs/serving.md).")
    serve.add_argument("--model", required=True, action="append", metavar="DIR", help=MODEL_HELP)
    serve.add_argument("--name", help="the model's name in the URLs (default: the --model folder's name)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; 0.0.0.0: "
                                                           "every interface)")
    serve.add_argument("--port", type=_POSITIVE, default=8501,
                       help="the port (default 8501, TensorFlow Serving's REST port)")
    limits = serve.add_argument_group("batching and limits")
    limits.add_argument("--max-batch", type=_POSITIVE, default=64,
                        help="sentences decoded together at most (default 64)")
    limits.add_argument("--batch-wait-ms", type=number_at_least(0), default=5.0,
                        help="how long a request waits for others to share its batch (default 5 ms)")
    limits.add_argument("--max-body-bytes", type=_POSITIVE, default=1 << 20,
                        help="larger request bodies get 413 (default 1 MiB)")
    limits.add_argument("--max-sentences", type=_POSITIVE, default=256,
                        help="more sentences in one request get 413 (default 256)")
    limits.add_argument("--max-sentence-chars", type=_POSITIVE, default=2000,
                        help="a longer sentence gets 413 (default 2000 characters)")
    _weights_arguments(serve, ensemble=True)
    _decoding_arguments(serve, "decoding (the requests' default: the model's, from its model.yaml; a request "
                               "changes it for itself)", batch_size=False)

    plot = commands.add_parser("plot-attention", help="translate a sentence and draw its attention maps",
                               description="Translates the sentence and writes PNG heatmaps of encoder "
                                           "self-attention, decoder self-attention and cross-attention per layer "
                                           "and head, with the subword tokens on the axes (docs/attention.md).")
    plot.add_argument("--model", required=True, metavar="DIR", help="a training workdir or an exported model")
    plot.add_argument("sentence", help="the source sentence")
    plot.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    plot.add_argument("--translation", help="draw the maps for this target instead of the model's translation")
    plot.add_argument("--layout", choices=("grid", "heads"), default="grid",
                      help="grid: one PNG per layer with all heads; heads: one PNG per layer and head")
    plot.add_argument("--kinds", nargs="+", choices=("encoder_self", "decoder_self", "cross"),
                      default=["encoder_self", "decoder_self", "cross"], help="which attention to draw")
    plot.add_argument("--beam-size", type=_POSITIVE,
                      help="beams for the translation; 1 is greedy (default: the model's)")
    _weights_arguments(plot)

    verify = commands.add_parser(
        "verify", help="check an export's files against its manifest (sizes and SHA-256 digests)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Checks every file of an export (SavedModel or CTranslate2) against the manifest.json written "
                    "at export: present, of its size, with its SHA-256 digest (docs/serving.md).",
        epilog="exit status: 0 every file matches; 1 a file is missing or damaged (named); 3 the export has no "
               "manifest (exported before manifests existed: nothing to check against); 2 another error (no such "
               "folder, say).")
    verify.add_argument("path", metavar="PATH", help="the export folder")
    return parser


def _train(args):
    from keras_transformer.experiment import load_experiment
    experiment = load_experiment(args.config, args.overrides)  # checks the model section too
    experiment.check_files()  # also for --dry-run: a wrong path shows now, not after the vocabulary is learned
    if args.dry_run:  # needs no TensorFlow (main does not import it)
        print(experiment.dry_run(args.workdir), end="")
        return 0
    from keras_transformer import training
    _, scores = training.train_and_evaluate(experiment, args.workdir)
    if scores:
        print(json.dumps(scores))
    return 0


def _decode_settings(args):
    """The `DecodeOptions` fields given on the command line (None: not given, the model's stands)."""
    return {"strategy": args.strategy, "beam_size": args.beam_size, "alpha": args.alpha, "max_extra": args.max_extra,
            "early_exit": args.early_exit, "top_k": args.sampling_topk, "top_p": args.sampling_topp,
            "temperature": args.sampling_temperature, "seed": args.seed, "n_best": getattr(args, "n_best", None)}


def draw_seed(args):
    """Sampling asked for on the command line without `--seed`: a fresh seed in `args.seed`, printed on stderr
    so that the same samples can be drawn again. Other strategies, and a given seed, change nothing.

    Example:

    >>> args = build_parser().parse_args(["translate", "--model", "m", "--sampling-topp", "0.9", "A dog."])
    >>> draw_seed(args) == args.seed and args.seed >= 0
    True
    """
    sampling = args.strategy == "sample" or (args.strategy is None and any(
        value is not None for value in (args.sampling_topk, args.sampling_topp, args.sampling_temperature)))
    if sampling and args.seed is None:
        args.seed = secrets.randbelow(2 ** 31)
        print(f"Sampling with seed {args.seed} (--seed {args.seed} draws these samples again).", file=sys.stderr)
    return args.seed


def _weights(models, checkpoints):
    """Repeated `--model`/`--checkpoint` as `load_translator` takes them: one path, or lists for an ensemble."""
    if len(models) == 1:
        if checkpoints is not None and len(checkpoints) > 1:
            raise ValueError(f"One --model takes one --checkpoint, got {len(checkpoints)}.")
        return models[0], checkpoints[0] if checkpoints else None
    return models, checkpoints


def _evaluate(args):
    from keras_transformer import inference
    draw_seed(args)
    model, checkpoint = _weights(args.model, args.checkpoint)
    scores, details = inference.evaluate(model, args.source, args.reference,
                                         tokenized_reference=args.tokenized_reference, lang=args.lang,
                                         checkpoint=checkpoint, average=args.average, batch_size=args.batch_size,
                                         output=args.output, details=True, **_decode_settings(args))
    if args.json:
        print(json.dumps({**scores, **details}))
    else:
        print(evaluation_report(scores, details))
    return 0


def evaluation_report(scores, details):
    """The readable report of `evaluate`: each score with its sacreBLEU signature, the weights, the decoding.

    Example:

    >>> print(evaluation_report({"bleu": 38.1, "length_ratio": 0.97}, {
    ...     "signatures": {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3"},
    ...     "models": [{"model": "runs/a", "weights": ["runs/a/checkpoints/ckpt-0009.weights.h5",
    ...                                                "runs/a/checkpoints/ckpt-0010.weights.h5"]}],
    ...     "decoding": {"beam_size": 4, "alpha": 0.6}, "sentences": 1000, "seconds": 12.34}))
    bleu            38.10  nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3
    length_ratio    0.9700
    model           runs/a: average of ckpt-0009.weights.h5, ckpt-0010.weights.h5
    decoding        beam: beam_size 4, alpha 0.6, max_extra 50
    sentences       1000 in 12.3 s
    """
    lines = []
    for key, value in scores.items():
        figure = f"{value:.4f}" if key == "length_ratio" else f"{value:.2f}"
        signature = details.get("signatures", {}).get(key)
        lines.append(f"{key:<15} {figure}" + (f"  {signature}" if signature else ""))
    for entry in details.get("models", []):
        weights = entry["weights"]
        named = (os.fspath(weights[0]) if len(weights) == 1 else
                 "average of " + ", ".join(os.path.basename(os.fspath(w)) for w in weights))
        lines.append(f"{'model':<15} {entry['model']}: {named}")
    decoding = details.get("decoding") or {}
    try:  # the translator's DecodeOptions: the settings its strategy uses
        decoding = DecodeOptions.from_dict(decoding).describe() if decoding else ""
    except (ConfigError, TypeError):
        decoding = ", ".join(f"{key} {value}" for key, value in decoding.items())
    if decoding:
        lines.append(f"{'decoding':<15} {decoding}")
    lines.append(f"{'sentences':<15} {details.get('sentences')} in {details.get('seconds', 0):.1f} s")
    return "\n".join(lines)


STDIN_CHUNK_BATCHES = 32  # translate reads stdin this many batches at a time and prints each chunk's lines


def _stdin_chunks(size):
    """stdin's lines in lists of `size`, split as files are (`data.textfile`: gzip is decompressed as it comes);
    bytes that are not UTF-8 become U+FFFD, whatever error handler the locale gives `sys.stdin`."""
    from keras_transformer.data import textfile
    if hasattr(sys.stdin, "buffer"):
        stream = sys.stdin.buffer
        stream = textfile.open_stream(stream) if hasattr(stream, "read") else stream
        lines = (line for line, _ in textfile.iter_stream(stream, "stdin", errors="replace"))
    else:  # a text stream put in its place (embedding)
        lines = (line.rstrip("\n") for line in sys.stdin)
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _ctranslate2_only(args):
    """Whether `args` translate with one CTranslate2 export: then TensorFlow is never imported (seconds saved)."""
    from keras_transformer.layout import model_kind
    return (args.command in ("translate", "serve") and len(args.model) == 1
            and model_kind(args.model[0]) == "ctranslate2"
            and not args.checkpoint and args.average is None)


def _load_translator(args):
    """The translator of `--model`, `--checkpoint`, `--average` and the decoding arguments (`translate`, `serve`)."""
    if _ctranslate2_only(args):  # what inference.load_translator gives, without importing TensorFlow
        from keras_transformer.ctranslate2_translator import CTranslate2Translator
        settings = {key: value for key, value in _decode_settings(args).items() if value is not None}
        return CTranslate2Translator(args.model[0], None, **settings)
    from keras_transformer import inference
    model, checkpoint = _weights(args.model, args.checkpoint)
    return inference.load_translator(model, checkpoint, args.average, **_decode_settings(args))


def _translate(args):
    from keras_transformer import evaluation
    draw_seed(args)
    translator = _load_translator(args)
    if _ctranslate2_only(args):  # without TensorFlow
        translate = translator.translate_lines
    else:
        from keras_transformer import inference
        translate = functools.partial(inference.translate, translator)
    # Arguments are one chunk; stdin goes in chunks, so that output starts early and memory stays bounded.
    chunks = [args.sentences] if args.sentences else _stdin_chunks(args.batch_size * STDIN_CHUNK_BATCHES)
    index = 0
    for chunk in chunks:
        if args.n_best is None:
            for line in translate(chunk, batch_size=args.batch_size):
                print(evaluation.one_line(line))  # one output line per input sentence
        else:
            for hypotheses in translator.n_best_lines(list(chunk), batch_size=args.batch_size):
                for text, score in hypotheses[:args.n_best]:
                    print(f"{index}\t{score:.4f}\t{evaluation.one_line(text)}")
                index += 1
        sys.stdout.flush()
    return 0


def _serve(args):
    from keras_transformer import serving
    settings = serving.ServeSettings(max_batch=args.max_batch, batch_wait=args.batch_wait_ms / 1000,
                                     max_body_bytes=args.max_body_bytes, max_sentences=args.max_sentences,
                                     max_sentence_chars=args.max_sentence_chars)
    name = args.name or os.path.basename(os.path.normpath(args.model[0]))
    return serving.serve(functools.partial(_load_translator, args), name, host=args.host, port=args.port,
                         settings=settings, seeded=args.seed is not None)


def _export(args):
    from keras_transformer import ctranslate2_translator, export, inference
    from keras_transformer.workdir import read_model_file
    workdir, checkpoint = _weights(args.workdir, args.checkpoint)
    if args.format == "ctranslate2":
        if args.no_xla:
            raise ConfigError("--no-xla applies to --format savedmodel (CTranslate2 does not use XLA).")
        directory = inference.export_ctranslate2(workdir, args.out, checkpoint=checkpoint, average=args.average,
                                                 quantization=args.quantization, overwrite=args.overwrite,
                                                 **_decode_settings(args))
        baked = DecodeOptions.from_dict(ctranslate2_translator.read_metadata(directory)["decoding"])
    else:
        if args.quantization:
            raise ConfigError("--quantization applies to --format ctranslate2.")
        settings = {key: value for key, value in _decode_settings(args).items() if value is not None}
        directory = export.export(workdir, args.out, checkpoint=checkpoint, average=args.average,
                                  jit_compile=not args.no_xla, overwrite=args.overwrite, **settings)
        written = pathlib.Path(directory) / "assets.extra" / "model.yaml"
        baked = read_model_file(written)[1] if written.is_file() else None
    # The path alone on stdout (scripts take it); what went into it on stderr.
    print(directory)
    try:
        described = inference.describe_weights(workdir, checkpoint, args.average)
    except (ValueError, OSError):  # the export is written; only its description is missing
        described = []
    for entry in described:
        weights = entry["weights"]
        named = weights[0] if len(weights) == 1 else "the average of " + ", ".join(
            os.path.basename(w) for w in weights)
        print(f"Exported {entry['model']}: {named}", file=sys.stderr)
    if baked:
        print(f"Decoding baked in: {baked.describe()}", file=sys.stderr)
    return 0


def _average(args):
    from keras_transformer.workdir import average_workdir
    output, paths = average_workdir(args.workdir, last=args.last, output=args.output, checkpoints=args.checkpoint)
    print(f"Averaged {len(paths)} checkpoint(s) ({os.path.basename(paths[0])} .. {os.path.basename(paths[-1])}) "
          f"into {output}")
    return 0


def _pack(args):
    from keras_transformer import training
    from keras_transformer.experiment import load_experiment
    counts = training.pack_arrays(load_experiment(args.config, args.overrides), args.workdir)
    print(json.dumps(counts))
    return 0


def _plot_attention(args):
    from keras_transformer import plotting
    maps, paths = plotting.plot_attention_for_path(args.model, args.sentence, args.out, checkpoint=args.checkpoint,
                                                   average=args.average, beam_size=args.beam_size,
                                                   translation=args.translation, layout=args.layout,
                                                   kinds=tuple(args.kinds))
    print(f"{maps.translation}\nWrote {len(paths)} picture(s) to {args.out}")
    return 0


def _verify(args):
    from keras_transformer import export_folder, layout
    from keras_transformer.errors import ExportDamagedError
    try:
        found = export_folder.verify_export(args.path)
    except ExportDamagedError as error:
        print(f"keras-transformer verify: {error}", file=sys.stderr)
        return export_folder.VERIFY_DAMAGED
    if found is None and layout.model_kind(args.path) not in ("export", "ctranslate2"):
        raise CheckpointError(f"{args.path} is not an export: it has no saved_model.pb (a SavedModel) nor "
                              "keras_transformer.json and model.bin (a CTranslate2 export), and no manifest.")
    if found is None:
        print(f"keras-transformer verify: {args.path} has no {export_folder.MANIFEST} (it was exported before "
              "exports carried one): there is nothing to check its files against. Export it again to give it one.",
              file=sys.stderr)
        return export_folder.VERIFY_NO_MANIFEST
    unlisted = (f"; {len(found.unlisted)} file(s) not in the manifest, added since: {', '.join(found.unlisted)}"
                if found.unlisted else "")
    print(f"{args.path}: whole ({found.files} files, {found.size} bytes, SHA-256 checked{unlisted})")
    return 0


def import_tensorflow_quietly():
    """Imports TensorFlow without its C++ log lines on stderr; anything else it writes there still shows.

    `keras_transformer.tensorflow_logs.without_cpp_log_lines` around the
    import; later C++ lines below ERROR are off through `TF_CPP_MIN_LOG_LEVEL=3`
    unless the user set that variable.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
    with without_cpp_log_lines():
        try:
            import tensorflow  # noqa: F401  (imported here for its side effect: the log lines go to the file)
        except ImportError:
            pass  # the command that needs it names the problem


_COMMANDS = {"train": _train, "evaluate": _evaluate, "translate": _translate, "export": _export,
             "average": _average, "pack": _pack, "plot-attention": _plot_attention, "serve": _serve,
             "verify": _verify}


def precheck(args):
    """Checks what a command reads and writes before TensorFlow is imported (which takes seconds): the config (key
    names, values, data files) of `train` and `pack`, every model folder, input file and output path. A typo
    then answers at once; the command itself checks everything again, and more.
    """
    from keras_transformer import files, layout
    from keras_transformer.data import textfile

    if args.command in ("train", "pack"):
        from keras_transformer.experiment import load_experiment
        experiment = load_experiment(args.config, args.overrides)
        experiment.check_files()
        if args.command == "train":
            experiment.check_memory()  # a model this machine cannot hold, refused before anything is written
        # A workdir another run holds is refused now, not after the import (the workers of one multi-worker
        # cluster share the command's --workdir and lock their own folders inside it, later).
        cluster = experiment.training.strategy == "multi_worker" or os.environ.get("TF_CONFIG")
        if not getattr(args, "dry_run", False) and not cluster:
            files.check_unlocked(args.workdir)
    if args.command in ("translate", "evaluate", "export", "serve"):  # settings that cannot go together
        DecodeOptions().replace(**_decode_settings(args))
    if args.command == "serve":
        from keras_transformer import serving
        serving.check_installed()
        if args.name is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", args.name):
            raise ConfigError(f"--name {args.name!r}: a model name in URLs takes letters, digits, '.', '_' and '-'.")
    if args.command in ("translate", "evaluate", "plot-attention", "serve"):
        models = args.model if isinstance(args.model, list) else [args.model]
        for model in models:
            layout.check_model_path(model)
        layout.check_weights_choice(models, args.checkpoint, args.average)
        if args.command == "evaluate":
            inputs = [args.source, args.reference, args.tokenized_reference]
            for path in inputs:
                if path is not None:
                    textfile.open_binary(path).close()
            if args.output is not None:
                files.check_output_file(args.output)
                files.check_not_an_input(args.output, inputs)
    elif args.command == "export":
        for workdir in args.workdir:
            layout.check_model_path(workdir)
        layout.check_export_destination(args.out)
        files.check_unlocked(args.out, beside=True)  # another export to --out is running: refused now
    elif args.command == "average":
        layout.check_average_output(args.workdir, args.output)
        files.check_unlocked(args.workdir)


def main(argv=None):
    """Runs `keras-transformer` with `argv` (default: the command line) and returns the exit status.

    Example:

    >>> main(["train", "--config", "configs/tiny_copy.yaml", "--workdir", "/tmp/kt", "--dry-run"])  # doctest: +SKIP
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.verbose:
        loud_tensorflow_import()
    with raise_on_sigterm():  # one line and status 143, wherever the command is
        return _run(args)


def _run(args):
    """`main` after parsing: the command, and its faults as one line and a status."""
    try:
        precheck(args)  # before TensorFlow: a wrong key or path answers at once
        without_tensorflow = args.command == "verify" or (args.command == "train" and args.dry_run)
        if (not without_tensorflow and not args.verbose and not tensorflow_logs_wanted()
                and not _ctranslate2_only(args)):
            import_tensorflow_quietly()
            logging.getLogger("tensorflow").setLevel(logging.ERROR)
            logging.getLogger("absl").setLevel(logging.ERROR)
        return _COMMANDS[args.command](args)
    except (ValueError, OSError, RuntimeError, FloatingPointError, MemoryError, RunStopped) as error:
        message, status = describe_fault(error, args.command, _written_path(args))
        if message is None or args.verbose:
            raise
        named = (ConfigError, CheckpointError, OSError, WorkdirBusyError, FloatingPointError, MemoryError,
                 RunStopped)  # the message says it all
        hint = "" if isinstance(error, named) or status != EXIT_BAD_INPUT else " (-v shows the traceback)"
        print(f"keras-transformer {args.command}: error: {message}{hint}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted; run the same command again to resume.",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - TensorFlow's errors (a full disk, exhausted memory) are not OSErrors
        message, status = describe_fault(error, args.command, _written_path(args))
        if message is None or args.verbose:
            raise
        print(f"keras-transformer {args.command}: error: {message}", file=sys.stderr)
        return status


def _written_path(args):
    """The folder or file a command writes, named by a fault whose error names none (a full disk)."""
    for name in ("out", "output", "workdir"):  # export's --workdir is what it reads
        value = getattr(args, name, None)
        if value:
            return value[0] if isinstance(value, list) else value
    return None


if __name__ == "__main__":
    sys.exit(main())
