"""The `keras-transformer` command: one subcommand per library function.

```
keras-transformer train     --config FILE.yaml [--config MORE.yaml] [--set key=value ...] --workdir DIR
keras-transformer evaluate  --model DIR [--model DIR ...] --source FILE --reference FILE
                            [--tokenized-reference FILE --lang de]
keras-transformer translate --model DIR [--model DIR ...] "A man rides a bike." ...   (or sentences on stdin)
keras-transformer translate --model DIR --input FILE [--output FILE] [--format text|html|xml|lines]   (a document)
keras-transformer export    --workdir DIR [--workdir DIR ...] --out DIR [--average N] [--format ctranslate2]
                            [--precision bfloat16|int8|...]
keras-transformer average   --workdir DIR [--last N] [--output FILE]
keras-transformer pack      --config FILE.yaml [--set key=value ...] --workdir DIR   (token ids for other backends)
keras-transformer train-packed WORKDIR [--epochs N] [--evaluate SOURCE REFERENCE]   (any backend, no TensorFlow)
keras-transformer distill-targets WORKDIR --member DIR CHECKPOINT [--member ...]   (teacher.npz, no TensorFlow)
keras-transformer plot-attention --model DIR "A man rides a bike." --out DIR   (PNG heatmaps per layer and head)
keras-transformer serve     --model DIR [--port 8501] [--host H] [--name NAME]   (HTTP, TensorFlow Serving's REST API)
keras-transformer verify    PATH   (an export's files against its manifest; exit 0 whole, 3 damaged, 2 no manifest)
keras-transformer import    SOURCE --workdir DIR   (a published checkpoint, OPUS-MT / Marian, as a workdir)
```

A repeated --model (or --workdir for export) decodes those models as one ensemble.

Each subcommand parses its arguments (`arguments.build_parser`) and calls one function of the library
(`training.train_and_evaluate`, `inference.evaluate`, `inference.translate`, the `--format`'s exporter
(`exports.make_exporter`), `workdir.average_workdir`, `training.pack_arrays`, `packed.training.train_arrays`,
`distillation.make_teacher`, `serving.serve`, `imports.importer.import_checkpoint`); everything they do can be
done from Python the same way. Errors that name a problem (a bad config key, a missing
checkpoint, a corrupt file, a full disk) are printed as one line and the command exits with the status
`errors.EXIT_CODES` gives that kind of fault (`keras-transformer --help` lists them).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any

from keras_transformer.cli.arguments import (
    DECODING_FLAGS,
    build_parser,
    check_translate_arguments,
    flag_dest,
    translate_format,
)
from keras_transformer.cli.terminal import (
    STDIN_CHUNK_BATCHES,
    ProgressBar,
    evaluation_report,
    is_terminal,
    stdin_chunks,
    term_output,
)
from keras_transformer.decoding.options import DecodeSettingsError, chosen_strategy
from keras_transformer.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    CheckpointError,
    ConfigError,
    DocumentError,
    RunStopped,
    WorkdirBusyError,
    describe_fault,
    raise_on_sigterm,
)
from keras_transformer.runtime.tensorflow_logs import (
    loud_tensorflow_import,
    tensorflow_logs_wanted,
    without_cpp_log_lines,
)

if TYPE_CHECKING:
    from keras_transformer.engines.interface import TranslatorInterface
    from keras_transformer.serving.requests import ServeSettings

# Each command imports its library module when it runs (the imports inside the functions below), so that
# `--help` and argument errors answer without importing TensorFlow, which takes seconds.

# The commands that run on any Keras backend without TensorFlow (a GPU machine with JAX): never imported for them.
WITHOUT_TENSORFLOW = ("train-packed", "distill-targets", "verify")


def _train(args: argparse.Namespace) -> int:
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


def _decode_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `DecodeOptions` fields given on the command line (None: not given, the model's stands)."""
    return {field: getattr(args, flag_dest(flag), None) for field, flag in DECODING_FLAGS.items()}


def _decoding_flags(args: argparse.Namespace) -> dict[str, str]:
    """The `DecodeOptions` fields that `args`' command sets by a flag, each with its flag (errors name them)."""
    return {field: flag for field, flag in DECODING_FLAGS.items() if hasattr(args, flag_dest(flag))}


def draw_seed(args: argparse.Namespace) -> int | None:
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


def _weights(models: list[str], checkpoints: list[str] | None) -> tuple[Any, Any]:
    """Repeated `--model`/`--checkpoint` as `load_translator` takes them: one path, or lists for an ensemble."""
    if len(models) == 1:
        if checkpoints is not None and len(checkpoints) > 1:
            raise ValueError(f"One --model takes one --checkpoint, got {len(checkpoints)}.")
        return models[0], checkpoints[0] if checkpoints else None
    return models, checkpoints


def _evaluate(args: argparse.Namespace) -> int:
    from keras_transformer import inference
    draw_seed(args)
    model, checkpoint = _weights(args.model, args.checkpoint)
    scores, details = inference.evaluate(model, args.source, args.reference,
                                         tokenized_reference=args.tokenized_reference, lang=args.lang,
                                         checkpoint=checkpoint, average=args.average, batch_size=args.batch_size,
                                         output=args.output, details=True,
                                         **({"target_lang": args.target_lang} if args.target_lang else {}),
                                         **_decode_settings(args))
    if args.json:
        print(json.dumps({**scores, **details}))
    else:
        print(evaluation_report(scores, details))
    return 0


def _tensorflow_free(args: argparse.Namespace) -> bool:
    """Whether `args` translate with an engine that needs no TensorFlow (a CTranslate2 export, a packed workdir:
    `engines.loader.model_engine`): then TensorFlow is never imported (seconds saved)."""
    from keras_transformer.engines.loader import model_engine
    from keras_transformer.workdir.layout import model_kind
    return (args.command in ("translate", "serve") and len(args.model) == 1
            and model_kind(args.model[0]) is not None and model_engine(args.model[0]) != "tensorflow")


def _load_translator(args: argparse.Namespace) -> TranslatorInterface:
    """The translator of `--model`, `--checkpoint`, `--average` and the decoding arguments (`translate`, `serve`):
    `keras_transformer.load_translator`'s, which imports TensorFlow only for the TensorFlow engine. `precheck`
    checked the folders and the weights options."""
    from keras_transformer.engines.loader import load_translator
    model, checkpoint = _weights(args.model, args.checkpoint)
    return load_translator(model, checkpoint, args.average, checked=True, **_decode_settings(args))


def _translate_file(args: argparse.Namespace, translator: TranslatorInterface, format: str,
                    glossary: Any = None) -> int:
    """`translate --input FILE` (or a document on stdin): `inference.translate_file`, its output written to
    `--output` whole or printed."""
    from keras_transformer import inference
    details: list[dict[str, Any]] | None = [] if args.json else None
    bar = ProgressBar(sys.stderr) if format != "lines" and (args.progress or is_terminal(sys.stderr)) else None
    start = time.monotonic()
    translated = inference.translate_file(translator, args.input, args.output, format, source_lang=args.source_lang,
                                          target_lang=args.target_lang, batch_size=args.batch_size, progress=bar,
                                          details=details, glossary=glossary, banned=args.ban,
                                          constraints=args.constraint)
    if not translated.strip():  # said, so that an empty output is not taken for a failure
        print(f"{args.input or 'stdin'}: no text to translate; the output is the document as it was.", file=sys.stderr)
    if args.json:
        print(json.dumps({"format": format, "translation": translated, "sentences": details,
                          "decoding": translator.options.to_dict(), "seconds": round(time.monotonic() - start, 3)},
                         ensure_ascii=False))
    elif args.output is None:
        sys.stdout.write(translated)
        sys.stdout.flush()
    return 0


def _translate(args: argparse.Namespace) -> int:
    from keras_transformer import evaluation
    from keras_transformer.decoding.glossary import Glossary  # a malformed glossary line named before loading
    glossary = Glossary.read(args.glossary) if args.glossary is not None else None
    draw_seed(args)
    translator = _load_translator(args)
    print(f"Decoding: {translator.options.describe()}", file=sys.stderr)
    if args.input is not None or translate_format(args) != "lines":
        return _translate_file(args, translator, translate_format(args), glossary)
    # Arguments are one chunk; stdin goes in chunks, so that output starts early and memory stays bounded.
    chunks = [args.sentences] if args.sentences else stdin_chunks(args.batch_size * STDIN_CHUNK_BATCHES)
    forced = {key: value for key, value in (("target_prefix", args.target_prefix),
                                            ("target_lang", args.target_lang)) if value is not None}
    prefixes = translator.target_prefixes(1, caller="translate", **forced) if forced else None
    if prefixes is not None:  # a bad prefix or language: one line, before any decoding
        translator.target_prefix_ids(prefixes)
    if args.source_lang is not None:  # a bad source language: one line, first
        translator.with_source_lang([], args.source_lang, "translate")
    index = 0
    for chunk in chunks:
        if args.source_lang is not None:
            chunk = translator.with_source_lang(chunk, args.source_lang, "translate")
        terms: dict[str, Any] = {} if not (args.constraint or glossary is not None or args.ban) else {
            "constraints": [list(args.constraint or ())] * len(chunk), "banned": args.ban, "glossary": glossary}
        if terms:  # each line's best translation, and a line on stderr for each that lacks a constraint
            found = translator.translate_terms(chunk, batch_size=args.batch_size, num_return=1 if args.n_best is None
                                               else translator.returned(), **forced, **terms)
            out, err = term_output(found, index + 1, args.n_best, args.json, evaluation.one_line,
                                   translator.scoring_alpha)
            print("\n".join(err), file=sys.stderr, end="\n" if err else "")
            print("\n".join(out), end="\n" if out else "")
            index += len(chunk)
        elif args.n_best is None:
            for line in translator.translate_lines(chunk, batch_size=args.batch_size, **forced, **terms):
                print(evaluation.one_line(line))  # one output line per input sentence
        else:
            for hypotheses in translator.n_best_detailed(chunk, batch_size=args.batch_size, **forced, **terms):
                for best in hypotheses[:args.n_best]:
                    print(f"{index}\t{best.score:.4f}\t{best.mean_log_prob:.4f}\t{evaluation.one_line(best.text)}")
                index += 1
        sys.stdout.flush()
    return 0


def _serve(args: argparse.Namespace) -> int:
    from keras_transformer import serving
    from keras_transformer.serving.versions import ServedModel, is_version_base, parse_model_argument
    settings = _serve_settings(args)
    parsed = parse_model_argument(args.model)
    seeded = args.seed is not None
    if parsed[0][0] is None and not (len(parsed) == 1 and is_version_base(parsed[0][1])):
        name = args.name or os.path.basename(os.path.normpath(args.model[0]))  # one model, or an ensemble
        return serving.serve(functools.partial(_load_translator, args), name, host=args.host, port=args.port,
                             settings=settings, seeded=seeded)
    models = []
    for name, path in parsed:
        name = name or args.name or os.path.basename(os.path.normpath(path))
        if is_version_base(path):
            models.append(ServedModel(name, functools.partial(_load_folder, args), base=path))
        else:
            models.append(ServedModel(name, lambda _, folder=path: _load_folder(args, folder)))
    return serving.serve(models, None, host=args.host, port=args.port, settings=settings, seeded=seeded)


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The `ServeSettings` of `serve`'s batching and limit flags (checked together: a queue smaller than the
    largest request is refused by name)."""
    from keras_transformer.serving.requests import ServeSettings
    return ServeSettings(max_batch=args.max_batch, batch_wait=args.batch_wait_ms / 1000,
                         max_body_bytes=args.max_body_bytes, max_sentences=args.max_sentences,
                         max_sentence_chars=args.max_sentence_chars, max_queue=args.max_queue,
                         max_beam_size=args.max_beam_size, max_n_best=args.max_n_best,
                         max_extra_limit=args.max_extra_limit, max_top_k=args.max_top_k,
                         min_temperature=args.min_temperature, max_alpha=args.max_alpha,
                         poll_seconds=args.poll_seconds)


def _load_folder(args: argparse.Namespace, path: str) -> TranslatorInterface:
    """The translator of one model folder of `serve` (a version of a base folder, or a NAME=DIR model), with the
    weights and decoding arguments."""
    from keras_transformer.engines.loader import load_translator
    return load_translator(path, args.checkpoint[0] if args.checkpoint else None, args.average, checked=True,
                           **_decode_settings(args))


def _export(args: argparse.Namespace) -> int:
    from keras_transformer import exports, inference
    workdir, checkpoint = _weights(args.workdir, args.checkpoint)
    exporter = exports.make_exporter(args.format, quantization=args.quantization, precision=args.precision,
                                     jit_compile=False if args.no_xla else None)
    directory = exporter.export(workdir, args.out, checkpoint=checkpoint, average=args.average,
                                overwrite=args.overwrite, **_decode_settings(args))
    baked = exporter.recorded_decoding(directory)
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


def _average(args: argparse.Namespace) -> int:
    from keras_transformer.workdir.checkpoints import average_workdir
    output, paths = average_workdir(args.workdir, last=args.last, output=args.output, checkpoints=args.checkpoint)
    print(f"Averaged {len(paths)} checkpoint(s) ({os.path.basename(paths[0])} .. {os.path.basename(paths[-1])}) "
          f"into {output}")
    return 0


def _pack(args: argparse.Namespace) -> int:
    from keras_transformer import training
    from keras_transformer.experiment import load_experiment
    counts = training.pack_arrays(load_experiment(args.config, args.overrides), args.workdir)
    print(json.dumps(counts))
    return 0


def _train_packed(args: argparse.Namespace) -> int:
    from keras_transformer.packed import scoring
    from keras_transformer.packed import training as packed
    if args.evaluate:  # scoring instead of training
        average = None if args.checkpoint else args.average_last or None
        settings = {key: value for key, value in _decode_settings(args).items() if key != "n_best"}
        scores = scoring.evaluate_arrays(args.workdir, args.checkpoint, *args.evaluate, average=average,
                                         tokenized_reference=args.tokenized_reference, lang=args.lang,
                                         output=args.output, **settings)
        print(json.dumps({key: round(value, 2) for key, value in scores.items()}))
        return 0
    result = packed.train_arrays(args.workdir, args.epochs, jit_compile=False if args.no_jit else None,
                                 precision=args.precision, average_last=args.average_last,
                                 length_multiple=args.length_multiple, tokens_per_batch=args.tokens_per_batch,
                                 keep_checkpoints=args.keep_checkpoints, init_weights=args.init_weights,
                                 initial_updates=args.initial_updates, teacher=args.teacher,
                                 cooldown_epochs=args.cooldown_epochs, distill_weight=args.distill_weight)
    print(json.dumps({"backend": result["backend"], "updates": result["updates"], "batches": result["batches"],
                      "seconds": round(result["seconds"], 1), "target_tokens": result["target_tokens"],
                      "average": str(result["average"]) if result["average"] else None}))
    return 0


def _distill_targets(args: argparse.Namespace) -> int:
    from keras_transformer.trainer import distillation
    result = distillation.make_teacher(args.workdir, args.member, top_k=args.top_k,
                                       tokens_per_batch=args.tokens_per_batch, output=args.output)
    print(json.dumps(result))
    return 0


def _plot_attention(args: argparse.Namespace) -> int:
    from keras_transformer.attention import plotting
    maps, paths = plotting.plot_attention_for_path(args.model, args.sentence, args.out, checkpoint=args.checkpoint,
                                                   average=args.average, beam_size=args.beam_size,
                                                   translation=args.translation, layout=args.layout,
                                                   kinds=tuple(args.kinds))
    print(f"{maps.translation}\nWrote {len(paths)} picture(s) to {args.out}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from keras_transformer.errors import ExportDamagedError
    from keras_transformer.exports import folder as export_folder
    from keras_transformer.workdir import layout
    try:
        found = export_folder.verify_export(args.path)
    except ExportDamagedError as error:
        print(f"keras-transformer verify: {error}", file=sys.stderr)
        return export_folder.VERIFY_DAMAGED
    if found is None and layout.model_kind(args.path) not in ("export", "ctranslate2", "litert"):
        raise CheckpointError(f"{args.path} is not an export: it has no saved_model.pb (a SavedModel), "
                              "keras_transformer.json and model.bin (a CTranslate2 export) nor litert.json and "
                              "model.tflite (a LiteRT export), and no manifest.")
    if found is None:
        print(f"keras-transformer verify: {args.path} has no {export_folder.MANIFEST} (it was exported before "
              "exports carried one): there is nothing to check its files against. Export it again to give it one.",
              file=sys.stderr)
        return export_folder.VERIFY_NO_MANIFEST
    unlisted = (f"; {len(found.unlisted)} file(s) not in the manifest, added since: {', '.join(found.unlisted)}"
                if found.unlisted else "")
    precision = export_folder.export_precision(args.path)
    precision = f", precision {precision}" if precision else ""
    print(f"{args.path}: whole ({found.files} files, {found.size} bytes, SHA-256 checked{unlisted}{precision})")
    return 0


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow without its C++ log lines on stderr; anything else it writes there still shows.

    `keras_transformer.runtime.tensorflow_logs.without_cpp_log_lines` around the
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


def _import(args: argparse.Namespace) -> int:
    from keras_transformer.imports.importer import import_checkpoint
    workdir = import_checkpoint(args.source, args.workdir, dtype=args.dtype)  # logs what it imported, and where
    print(f"Translate with: keras-transformer translate --model {workdir}")
    return 0


_COMMANDS = {"train": _train, "evaluate": _evaluate, "translate": _translate, "export": _export,
             "average": _average, "pack": _pack, "train-packed": _train_packed, "distill-targets": _distill_targets,
             "plot-attention": _plot_attention, "serve": _serve, "verify": _verify,
             "import": _import}


def precheck(args: argparse.Namespace) -> None:
    """Checks what a command reads and writes before TensorFlow is imported (which takes seconds): the config (key
    names, values, data files) of `train` and `pack`, every model folder, input file and output path, the decoding
    flags that contradict each other, and `import`'s checkpoint and workdir. A typo then answers at once; the command
    itself checks everything again, and more.
    """
    from keras_transformer import files
    from keras_transformer.data import textfile
    from keras_transformer.workdir import layout

    if args.command in ("translate", "evaluate", "serve"):  # hf:// names as their cached workdirs
        args.model = [_hf_model(args, value) for value in args.model]

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
    if args.command in ("translate", "evaluate", "export", "serve"):  # flags that contradict each other
        chosen_strategy(_decode_settings(args))  # the rest depends on the model's defaults: checked as it loads
    if args.command == "evaluate" and args.tokenized_reference is not None and args.lang is None:
        raise ConfigError("--tokenized-reference (the Multi30k protocol) needs --lang, the target language.")
    groups = None
    if args.command == "serve":
        from keras_transformer import serving
        from keras_transformer.serving.versions import is_version_base, numbered_versions, parse_model_argument
        serving.check_installed()
        _serve_settings(args)
        if args.name is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", args.name):
            raise ConfigError(f"--name {args.name!r}: a model name in URLs takes letters, digits, '.', '_' and '-'.")
        parsed = parse_model_argument(args.model)
        if parsed[0][0] is not None and args.name is not None:
            raise ConfigError("serve: --name names the one model; with NAME=DIR models each --model names its own.")
        if parsed[0][0] is not None and len({name for name, _ in parsed}) != len(parsed):
            raise ConfigError("serve: each NAME=DIR model needs a name of its own.")
        ensemble = parsed[0][0] is None and len(parsed) > 1
        groups = [args.model] if ensemble else [
            [str(numbered_versions(path)[max(numbered_versions(path))])] if is_version_base(path) else [path]
            for _, path in parsed]
    if args.command == "translate":
        check_translate_arguments(args)
        if args.input is not None:
            textfile.open_binary(args.input).close()
        if args.output is not None:
            files.check_output_file(args.output)
            files.check_not_an_input(args.output, [args.input])
    if args.command in ("translate", "evaluate", "plot-attention", "serve"):
        groups = groups or [args.model if isinstance(args.model, list) else [args.model]]
        for models in groups:
            for model in layout.check_models(models, args.checkpoint, args.average):  # what every loader checks
                if layout.model_kind(model) is None:
                    raise layout.not_a_model(model)
                layout.check_vocabulary(model)  # text in, text out
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
    elif args.command == "import":
        from keras_transformer.imports import check_family
        from keras_transformer.imports.checkpoint import checked_source, read_checkpoint
        layout.check_new_workdir(args.workdir, "import")
        if checked_source(args.source) is not None:  # a local folder: its config, family and weights file
            checkpoint = read_checkpoint(args.source)
            check_family(checkpoint.config.get("model_type"), checkpoint.folder / "config.json")


def _hf_model(args: argparse.Namespace, value: str) -> str:
    """A `--model` value (serve's NAME=VALUE too) with an ``hf://`` name as its workdir in the package's cache,
    imported there first where it is not yet (TensorFlow imported quietly for that)."""
    from keras_transformer.engines.loader import hf_models
    name, equals, path = value.rpartition("=") if "=hf://" in value else ("", "", value)
    quiet = None if args.verbose or tensorflow_logs_wanted() else import_tensorflow_quietly
    return f"{name}{equals}{hf_models(path, before_import=quiet)}"


def main(argv: list[str] | None = None) -> int:
    """Runs `keras-transformer` with `argv` (default: the command line) and returns the exit status.

    Example:

    >>> main(["train", "--config", "configs/tiny_copy.yaml", "--workdir", "/tmp/kt", "--dry-run"])  # doctest: +SKIP
    """
    args = build_parser().parse_args(argv)
    # the training commands of other backends time their log lines, as train's Keras progress bar does not
    timed = args.command in ("train-packed", "distill-targets")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s" if timed else "%(message)s")
    if args.verbose:
        loud_tensorflow_import()
    with raise_on_sigterm():  # one line and status 143, wherever the command is
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """`main` after parsing: the command, and its faults as one line and a status."""
    try:
        precheck(args)  # before TensorFlow: a wrong key or path answers at once
        without_tensorflow = args.command in WITHOUT_TENSORFLOW or (args.command == "train" and args.dry_run)
        if (not without_tensorflow and not args.verbose and not tensorflow_logs_wanted()
                and not _tensorflow_free(args)):
            import_tensorflow_quietly()
            logging.getLogger("tensorflow").setLevel(logging.ERROR)
            logging.getLogger("absl").setLevel(logging.ERROR)
        return _COMMANDS[args.command](args)
    except (ValueError, OSError, RuntimeError, FloatingPointError, MemoryError, RunStopped) as error:
        message, status = describe_fault(error, args.command, _written_path(args))
        if message is None or args.verbose:
            raise
        if isinstance(error, DecodeSettingsError):  # the decoding settings named by their flags
            message = error.named(_decoding_flags(args))
        # the message says it all (NotImplementedError: a refusal)
        named = (ConfigError, CheckpointError, OSError, WorkdirBusyError, FloatingPointError, MemoryError,
                 RunStopped, NotImplementedError, DocumentError)
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


def _written_path(args: argparse.Namespace) -> str | None:
    """The folder or file a command writes, named by a fault whose error names none (a full disk)."""
    for name in ("out", "output", "workdir"):  # export's --workdir is what it reads
        value = getattr(args, name, None)
        if value:
            return value[0] if isinstance(value, list) else value
    return None

