"""The arguments of `keras-transformer`: every subcommand's flags, each kind written once and shared.

`build_parser` is the command line's one parser (`cli.main` runs it). The decoding flags
(`--strategy`, `--beam-size`, ...), the weights flags (`--checkpoint`, `--average`) and the argument types
(`integer_at_least`, `number_at_least`) are defined once here and added to every subcommand that takes them;
`check_translate_arguments` refuses `translate`'s flags that do not go together. Standard library only (and the
decoding and export registries' names), so that `--help` answers at once.

Example:

>>> integer_at_least(1)("3"), number_at_least(0)("0.6")
(3, 0.6)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import keras_transformer
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.errors import ConfigError, exit_codes_help
from keras_transformer.exports import EXPORTERS
from keras_transformer.exports.folder import VERIFY_DAMAGED, VERIFY_NO_MANIFEST


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum`, refused by name otherwise (exit status 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def number_at_least(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number of at least `minimum` (nan and inf refused), refused by name otherwise."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value:g}")
        return value
    parse.__name__ = "number"
    return parse


_EXAMPLES = """examples:
  keras-transformer train --config configs/tiny_copy.yaml --workdir runs/tiny_copy
  keras-transformer train --config configs/multi30k_en_de.yaml --set training.epochs=30 --workdir runs/en_de
  keras-transformer translate --model saved_models/multi30k_en_de "A man rides a bike."
  keras-transformer translate --model saved_models/multi30k_en_de --input doc.txt --output doc.de.txt
  keras-transformer evaluate --model runs/en_de --average 5 --source test.en.gz --reference test.de.gz
  keras-transformer average --workdir runs/en_de --last 5
  keras-transformer export --workdir runs/en_de --average 5 --out saved_models/en_de
  keras-transformer verify saved_models/en_de
  keras-transformer evaluate --model runs/en_de --model runs/en_de_seed2 --average 5 --source test.en.gz ...
  keras-transformer serve --model saved_models/multi30k_en_de --port 8501
  KERAS_BACKEND=jax keras-transformer train-packed runs/packed --epochs 70 --average-last 10
"""


_POSITIVE, _NON_NEGATIVE = integer_at_least(1), integer_at_least(0)
_ALPHA = number_at_least(0)  # the length-penalty exponent: 0 ranks by log-probability alone


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _positive_number(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


# `translate --format`: a document's formats (`documents.document.FORMATS`), and one sentence per line.
DOCUMENT_FORMATS = ("text", "html", "xml", "lines")

# Each `DecodeOptions` field and the flag that sets it (`cli.commands` reads the flags' values by this table and
# names the flags in decoding errors by it).
DECODING_FLAGS = {"strategy": "--strategy", "beam_size": "--beam-size", "alpha": "--alpha", "max_extra": "--max-extra",
                  "early_exit": "--early-exit", "top_k": "--sampling-topk", "top_p": "--sampling-topp",
                  "temperature": "--sampling-temperature", "seed": "--seed", "n_best": "--n-best"}


def flag_dest(flag: str) -> str:
    """The attribute of parsed arguments that holds `flag`'s value (argparse's `dest`).

    Example:

    >>> flag_dest("--sampling-topk")
    'sampling_topk'
    """
    return flag.lstrip("-").replace("-", "_")


def _decoding_arguments(parser: argparse.ArgumentParser,
                        title: str = "decoding (default: the model's, from its model.yaml)", batch_size: bool = True,
                        fresh_seed: bool = True) -> None:
    """The `DecodeOptions` arguments, one set for every command that decodes (`cli._decode_settings` reads them).
    `fresh_seed`: sampling without --seed draws a fresh seed (`cli.draw_seed`); else the model's seed stands."""
    group = parser.add_argument_group(title)
    group.add_argument("--strategy", choices=tuple(STRATEGIES),
                       help="beam search (the paper), greedy, or sample (default: the model's; --beam-size, "
                            "--alpha or --early-exit alone means beam, a --sampling-* or --seed argument sample)")
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
    default = "a fresh one, printed" if fresh_seed else "the model's"
    group.add_argument("--seed", type=_NON_NEGATIVE,
                       help=f"sample: the draws' seed (same seed, same samples; default: {default})")
    if batch_size:
        group.add_argument("--batch-size", type=_POSITIVE, default=64,
                           help="sentences decoded together (default 64)")


def _prefix_arguments(parser: argparse.ArgumentParser, prefix: bool = True, source_lang: bool = False) -> None:
    """The forced starts of the translations (`TranslatorInterface.translate_lines`' `target_prefix` and
    `target_lang`; docs/decoding.md, "Target prefixes")."""
    group = parser.add_argument_group("target prefix (the translations' forced start)")
    if prefix:
        group.add_argument("--target-prefix", metavar="TEXT",
                           help="every translation starts with this target-language text, forced, then continued "
                                "(it is part of the translation and of its score)")
    group.add_argument("--target-lang", metavar="LANG",
                       help="a multilingual model's target language (deu_Latn, or a code naming one: de): its "
                            "language token is forced first; refused, with the languages listed, for a model "
                            "without it or a code naming several")
    if not source_lang:
        return
    parser.add_argument_group("source language").add_argument(
        "--source-lang", metavar="LANG",
        help="a multilingual model's source language (fra_Latn, or a code naming one: fr): its language token "
             "opens every source, in "
             "place of the one its import set; refused, with the languages listed, for a model without it. For a "
             "document (--format text, html, xml), also the language whose sentence rules segment it, for any "
             "model (default: the model's source language, else English)")


def _weights_arguments(parser: argparse.ArgumentParser, ensemble: bool = False, models: str = "--model") -> None:
    group = parser.add_argument_group("weights (training workdirs only; --checkpoint or --average, not both)")
    if ensemble:
        group.add_argument("--checkpoint", action="append", help="a .weights.h5 file (default: the last epoch "
                           f"checkpoint); with several {models}, one --checkpoint per {models[2:]}, in the same "
                           "order")
    else:
        group.add_argument("--checkpoint", help="a .weights.h5 file (default: the last epoch checkpoint)")
    group.add_argument("--average", type=_POSITIVE, metavar="N",
                       help="average the last N epoch checkpoints (all of them, with a warning, if there are fewer)")


def _multi30k_arguments(parser: argparse._ActionsContainer) -> None:
    """The published Multi30k protocol's inputs, for the commands that score (`evaluation.evaluate_translations`)."""
    parser.add_argument("--tokenized-reference", help="*.lc.norm.tok.* references (Multi30k protocol)")
    parser.add_argument("--lang", help="target language code, for the Multi30k protocol")


MODEL_HELP = ("a training workdir or an exported model, or hf://owner/name (a Hugging Face Hub model, imported "
              "once into KERAS_TRANSFORMER_HOME); repeat it to decode several models sharing a vocabulary as one "
              "ensemble (the mean of their next-token distributions)")


def _experiment_arguments(parser: argparse.ArgumentParser, workdir_help: str) -> None:
    parser.add_argument("--config", action="append", required=True, metavar="FILE.yaml",
                        help="experiment config; repeat to layer files (later ones win)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                        help="override one config value (YAML syntax); repeatable, later ones win")
    parser.add_argument("--workdir", required=True, metavar="DIR", help=workdir_help)


def build_parser() -> argparse.ArgumentParser:
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

    _train_arguments(commands)
    _evaluate_arguments(commands)
    _translate_arguments(commands)
    _export_arguments(commands)
    _average_arguments(commands)
    _pack_arguments(commands)
    _train_packed_arguments(commands)
    _distill_targets_arguments(commands)
    _serve_arguments(commands)
    _plot_attention_arguments(commands)
    _verify_arguments(commands)
    _import_arguments(commands)
    return parser



def _train_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _evaluate_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    evaluate = commands.add_parser("evaluate", help="translate a test set and report sacreBLEU's BLEU and chrF",
                                   description="Translates --source and scores the output against --reference "
                                               "with sacreBLEU: BLEU (cased and lowercased) and chrF, each with "
                                               "its signature; with --tokenized-reference and --lang also the "
                                               "published Multi30k protocol.")
    evaluate.add_argument("--model", required=True, action="append", metavar="DIR", help=MODEL_HELP)
    evaluate.add_argument("--source", required=True, help="source sentences, one per line (plain or .gz)")
    evaluate.add_argument("--reference", required=True, help="reference translations, one per line")
    _multi30k_arguments(evaluate)
    evaluate.add_argument("--output", help="write the translations to this file (its folder must exist; checked, "
                                           "like the line counts of the references, before decoding)")
    evaluate.add_argument("--json", action="store_true",
                          help="print one JSON object (scores, sacreBLEU signatures, weights, decoding settings, "
                               "sentences, seconds) instead of the readable report")
    _weights_arguments(evaluate, ensemble=True)
    _decoding_arguments(evaluate)
    _prefix_arguments(evaluate, prefix=False)


def _translate_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    translate = commands.add_parser("translate", help="translate sentences (arguments or stdin) or a document",
                                    description="Translates the sentences given as arguments, or else each line "
                                                "of standard input (plain or gzip), and prints one translation per "
                                                "line (a line break inside a translation becomes a space). With "
                                                "--input FILE, translates the file as a document: sentence by "
                                                "sentence, its layout or markup kept (docs/documents.md).")
    translate.add_argument("--model", required=True, action="append", metavar="DIR", help=MODEL_HELP)
    translate.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    documents = translate.add_argument_group("documents (docs/documents.md)")
    documents.add_argument("--input", metavar="FILE", help="translate this file (plain or gzip) instead of stdin")
    documents.add_argument("--output", metavar="FILE",
                           help="write the translation to this file (with --input): under a temporary name in its "
                                "folder, renamed when complete (default: stdout)")
    documents.add_argument("--format", choices=DOCUMENT_FORMATS,
                           help="text: the input is one document, segmented into sentences, its paragraphs, line "
                                "breaks, indentation and bullets kept; html or xml: its markup kept; lines: one "
                                "sentence per line (default: text with --input, lines on stdin)")
    documents.add_argument("--progress", action="store_true",
                           help="show the progress bar (sentences done, sentences per second) on stderr even when "
                                "it is not a terminal (default: only on a terminal)")
    documents.add_argument("--json", action="store_true",
                           help="documents: print one JSON object (the translation, each sentence with its "
                                "translation, the decoding) instead of the translation; sentences with terms: one "
                                "object per sentence (line, translation, score, unmet)")
    _weights_arguments(translate, ensemble=True)
    _decoding_arguments(translate)
    _prefix_arguments(translate, source_lang=True)
    terms = translate.add_argument_group("terms (docs/decoding.md, \"Terminology\"; --constraint: sentences only)")
    terms.add_argument("--constraint", action="append", metavar="TERM",
                       help="a target-language term every translation must contain (repeat it for several)")
    terms.add_argument("--glossary", metavar="FILE",
                       help="a TSV glossary (source term<TAB>target term[<TAB>another form]): each sentence must "
                            "contain the target terms of the entries whose source term occurs in it")
    terms.add_argument("--ban", action="append", metavar="TERM",
                       help="a target-language term no translation may contain (repeat it for several)")
    translate.add_argument("--n-best", type=_POSITIVE, metavar="N",
                           help="print N hypotheses per sentence, best first, as 'INDEX<tab>SCORE<tab>MEAN_LOG_PROB"
                                "<tab>TRANSLATION' lines (INDEX: the sentence's, from 0; MEAN_LOG_PROB: its tokens' "
                                "mean log-probability); beam search needs N <= --beam-size")


def _export_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = commands.add_parser("export", help="write a SavedModel (strings in, translations out)",
                                 description="Exports a training workdir's model as a TensorFlow SavedModel with "
                                             "tokenization and beam search inside, or (--format ctranslate2) as a "
                                             "CTranslate2 model folder for the fastest CPU serving (docs/serving.md).")
    export.add_argument("--workdir", required=True, action="append", metavar="DIR",
                        help="the training workdir (or a SavedModel export, exported again with this version: the "
                             "same weights); repeat it to export several (sharing a vocabulary) as one ensemble. "
                             "With --format ctranslate2, one workdir or SavedModel export")
    export.add_argument("--format", choices=tuple(EXPORTERS), default="savedmodel",
                        help="savedmodel (default), ctranslate2 (needs the ctranslate2 extra: "
                             "`pip install '.[ctranslate2]'`) or litert (a .tflite for devices; the litert extra)")
    export.add_argument("--precision", metavar="TYPE",
                        help="the weights' and matrix products' precision (default float32): savedmodel takes "
                             "bfloat16 (faster than float32 on CPUs with AMX); ctranslate2 takes CTranslate2's "
                             "compute types: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, "
                             "bfloat16, float32, where this CPU runs them (docs/serving.md, 'Precision'); litert "
                             "takes float32, float16, int8 (docs/litert.md)")
    export.add_argument("--quantization", help="ctranslate2 only: the older name of --precision")
    export.add_argument("--out", required=True, metavar="DIR", help="the export folder")
    export.add_argument("--overwrite", action="store_true", help="replace an existing export")
    export.add_argument("--no-xla", action="store_true",
                        help="savedmodel only: do not compile the search with XLA (by default it is in float32, one "
                             "compilation per bucketed input shape on first use; a bfloat16 export never is: "
                             "docs/serving.md)")
    _weights_arguments(export, ensemble=True, models="--workdir")
    _decoding_arguments(export, "decoding of serving_default and n_best, recorded in the export (default: the "
                                "model's; the SavedModel's `sample` signature takes its settings as inputs)",
                        batch_size=False)


def _average_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _pack_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pack = commands.add_parser(
        "pack", help="tokenize a config's data into WORKDIR/arrays/ for training on another backend",
        description="Learns or loads the vocabulary as train does and writes the tokenized training and validation "
                    "pairs to WORKDIR/arrays/ with the experiment and model configs. Train the folder on any "
                    "Keras backend (JAX on a GPU machine without TensorFlow) with "
                    "`keras-transformer train-packed WORKDIR`; evaluate, translate and export read it here "
                    "(docs/gpu.md).")
    _experiment_arguments(pack, "the folder to write (vocabulary, configs, arrays/)")


def _serve_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve", help="serve a model over HTTP (TensorFlow Serving's REST API, /translate)",
        description="Serves the model over HTTP until SIGTERM: TensorFlow Serving's REST API (GET /v1/models/NAME, "
                    "POST /v1/models/NAME:predict with the export's signatures), POST /translate with per-request "
                    "decoding options, /healthz, /readyz (after loading and a warm-up translation) and /stats. "
                    "Concurrent requests asking for the same decoding are decoded in one batch. Needs "
                    "the serve extra, `pip install '.[serve]'` (docs/serving.md).")
    serve.add_argument("--model", required=True, action="append", metavar="DIR",
                       help=MODEL_HELP + "; or a base folder of numbered versions (DIR/1, DIR/2, ...: the highest "
                            "is served, a new one is loaded and switched to without a failed request); or "
                            "NAME=DIR, repeated, for several models in one server")
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
    limits.add_argument("--max-queue", type=_POSITIVE, metavar="SENTENCES",
                        help="sentences waiting for the engine at most, all requests together; a request past it "
                             "gets 503 with Retry-After at once (default 4 batches: 4 x --max-batch, at least "
                             "--max-sentences)")
    limits.add_argument("--max-beam-size", type=_POSITIVE, default=16,
                        help="a request's beam_size at most; more gets 400 (default 16)")
    limits.add_argument("--max-n-best", type=_POSITIVE, default=16,
                        help="a request's n_best (hypotheses or samples per sentence) at most (default 16)")
    limits.add_argument("--max-extra-limit", type=_NON_NEGATIVE, default=256, metavar="TOKENS",
                        help="a request's max_extra at most (default 256)")
    limits.add_argument("--max-top-k", type=_POSITIVE, default=1000, help="a request's top_k at most (default 1000)")
    limits.add_argument("--min-temperature", type=_positive_number, default=0.05,
                        help="a request's sampling temperature at least (default 0.05)")
    limits.add_argument("--max-alpha", type=_positive_number, default=10.0,
                        help="a request's length-penalty exponent at most (default 10)")
    limits.add_argument("--poll-seconds", type=_positive_number, default=1.0,
                        help="how often a base folder of versions is looked at for a new one (default 1 s)")
    _weights_arguments(serve, ensemble=True)
    _decoding_arguments(serve, "decoding (the requests' default: the model's, from its model.yaml; a request "
                               "changes it for itself)", batch_size=False)


def _plot_attention_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _verify_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = commands.add_parser(
        "verify", help="check an export's files against its manifest (sizes and SHA-256 digests)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Checks every file of an export (SavedModel or CTranslate2) against the manifest.json written "
                    "at export: present, of its size, with its SHA-256 digest (docs/serving.md).",
        epilog=f"exit status: 0 every file matches; {VERIFY_DAMAGED} a file is missing or damaged (named); "
               f"{VERIFY_NO_MANIFEST} the export has no manifest (exported before manifests existed: nothing to "
               "check against), or no such export; others as for every command (keras-transformer --help).")
    verify.add_argument("path", metavar="PATH", help="the export folder")


def _import_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    imported = commands.add_parser(
        "import", help="turn a published checkpoint (OPUS-MT / Marian, NLLB / M2M-100) into a workdir",
        description="Reads a checkpoint in the Hugging Face layout (config.json, model.safetensors or "
                    "pytorch_model.bin, whole or sharded, the tokenizer's files) from a folder, or a Hub id "
                    "(owner/name[@revision]) where the network allows, "
                    "and writes an ordinary workdir (model.yaml, data/vocab, one checkpoint, imported.json) that "
                    "translate, evaluate, export, serve and train (training.init_checkpoint) take "
                    "(docs/pretrained.md).")
    imported.add_argument("source", metavar="SOURCE", help="the checkpoint folder, or a Hub id (owner/name)")
    imported.add_argument("--workdir", required=True, help="the workdir to create (new or empty)")
    imported.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                          help="the weights' type, in memory and in the workdir (bfloat16: half the size, "
                               "rounded to nearest; the model then computes in bfloat16)")


def _train_packed_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    packed = commands.add_parser(
        "train-packed", help="train a packed workdir (keras-transformer pack) on any Keras backend, no TensorFlow",
        description="Train a packed workdir (keras-transformer pack) on any Keras backend (KERAS_BACKEND=jax on a "
                    "GPU machine without TensorFlow), resuming what an earlier run left; or, with --evaluate, "
                    "score it (docs/gpu.md). Prints one JSON line.")
    packed.add_argument("workdir", metavar="WORKDIR", help="the folder keras-transformer pack wrote")
    packed.add_argument("--epochs", type=_NON_NEGATIVE,
                        help="total epochs (default: the experiment's training.epochs; a finished or smaller count "
                             "trains nothing; 0 only averages)")
    packed.add_argument("--precision", help="training.mixed_precision, e.g. mixed_bfloat16 on a GPU "
                                            "(default: the experiment's)")
    packed.add_argument("--no-jit", action="store_true", help="do not compile steps with XLA (training.jit_compile)")
    packed.add_argument("--average-last", type=_NON_NEGATIVE,
                        help="average the last N epoch checkpoints into WORKDIR/averaged.weights.h5 at the end "
                             "(default: the experiment's decoding.average_last; 0: none)")
    packed.add_argument("--tokens-per-batch", type=_POSITIVE, help="default: the experiment's data.tokens_per_batch")
    packed.add_argument("--length-multiple", type=_POSITIVE, default=8, help="batch widths are multiples of it")
    packed.add_argument("--keep-checkpoints", type=_POSITIVE, help="keep only the newest N epoch checkpoints")
    packed.add_argument("--init-weights", help="start a new run from these weights (ignored when resuming; "
                                               "default: the experiment's training.init_checkpoint)")
    packed.add_argument("--initial-updates", type=_NON_NEGATIVE,
                        help="a new run's schedule starts at this update count (e.g. the init run's updates; "
                             "default: the experiment's training.initial_updates)")
    packed.add_argument("--teacher", help="distil from this teacher file (keras-transformer distill-targets)")
    packed.add_argument("--distill-weight", type=float, default=0.5,
                        help="the teacher term's weight in the loss (default 0.5)")
    packed.add_argument("--cooldown-epochs", type=_NON_NEGATIVE,
                        help="over the last K epochs the learning rate falls linearly to zero (default: the "
                             "experiment's training.cooldown_epochs; 0: none)")
    scoring = packed.add_argument_group("scoring instead of training (no TensorFlow needed)")
    scoring.add_argument("--evaluate", nargs=2, metavar=("SOURCE", "REFERENCE"),
                         help="translate SOURCE with --checkpoint and score it against REFERENCE")
    scoring.add_argument("--checkpoint", help="a .weights.h5 file (default: the mean of the last N epoch checkpoints "
                         "with --average-last N, else the newest epoch checkpoint)")
    _multi30k_arguments(scoring)
    scoring.add_argument("--output", help="write the translations to this file")
    _decoding_arguments(packed, "decoding of --evaluate (default: the model's, from its model.yaml)",
                        batch_size=False, fresh_seed=False)


def _distill_targets_arguments(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    distill = commands.add_parser(
        "distill-targets", help="write an ensemble's next-token distributions for distillation, no TensorFlow",
        description="Write an ensemble's top-k next-token distributions over a packed workdir's training pairs "
                    "(WORKDIR/teacher.npz), for `keras-transformer train-packed WORKDIR --teacher ...` "
                    "(docs/distillation.md). Prints one JSON line.")
    distill.add_argument("workdir", metavar="WORKDIR", help="the student's packed workdir (keras-transformer pack)")
    distill.add_argument("--member", nargs=2, action="append", metavar=("WORKDIR", "CHECKPOINT"), required=True,
                         help="a teacher: its workdir and weights file; repeat for an ensemble")
    distill.add_argument("--top-k", type=_POSITIVE, default=8, help="ids kept per position (default 8)")
    distill.add_argument("--tokens-per-batch", type=_POSITIVE, default=8192, help="positions per forward batch")
    distill.add_argument("--output", help="default: WORKDIR/teacher.npz")


def translate_format(args: argparse.Namespace) -> str:
    """`translate`'s format: `--format`, else "text" for `--input FILE` (a document) and "lines" for stdin.

    Example:

    >>> translate_format(build_parser().parse_args(["translate", "--model", "m", "--input", "doc.txt"]))
    'text'
    """
    return args.format or ("text" if args.input is not None else "lines")


def check_translate_arguments(args: argparse.Namespace) -> None:
    """Refuses `translate` flags that do not go together, each in one line naming them.

    Example:

    >>> check_translate_arguments(build_parser().parse_args(["translate", "--model", "m", "--output", "x.txt"]))
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: --output needs --input FILE: the file to translate (stdin's lines ...
    """
    document = translate_format(args) != "lines"
    if args.output is not None and args.input is None:
        raise ConfigError("--output needs --input FILE: the file to translate (stdin's lines are printed on stdout).")
    if args.input is not None and args.sentences:
        raise ConfigError(f"--input {args.input} and sentences as arguments ({len(args.sentences)}): give one or "
                          "the other.")
    if args.sentences and document:
        raise ConfigError(f"--format {args.format} translates a document from --input FILE or stdin; sentences "
                          "given as arguments are translated as lines.")
    for flag, given in (("--n-best", args.n_best is not None), ("--target-prefix", args.target_prefix is not None)):
        if given and document:
            raise ConfigError(f"{flag} is for sentences (--format lines), not for a document (--format "
                              f"{translate_format(args)}).")
        if given and args.input is not None:
            raise ConfigError(f"{flag} is for sentences given as arguments or on stdin, not for --input FILE.")
    if args.constraint and document:
        raise ConfigError(f"--constraint is for sentences (--format lines), not for a document (--format "
                          f"{translate_format(args)}): each sentence needs its own terms; give a --glossary (its "
                          "entries found in a sentence become that sentence's constraints).")
    terms = bool(args.constraint or args.glossary is not None or args.ban)
    if args.json and not document and (args.input is not None or not terms):
        raise ConfigError("--json is for documents (--format text, html or xml) and for sentences with terms "
                          "(--constraint, --glossary, --ban) given as arguments or on stdin; --n-best N prints "
                          "lines' scores.")
