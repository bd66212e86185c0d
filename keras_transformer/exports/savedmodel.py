"""SavedModel export: strings in, translations out, with tokenization and beam search in the graph.

An export directory is a plain TensorFlow SavedModel that loads in a process
importing only `tensorflow` and `tensorflow_text` (the SentencePiece ops):

```
saved_models/multi30k_en_de/
  saved_model.pb, variables/       the graph and its weights (float32, or bfloat16: `--precision`)
  assets/                          the tokenizer files (vocabulary), as SavedModel assets
  assets.extra/                    model.yaml, model.weights.h5, vocab/: rebuild the Keras model
                                   (attention maps, fine-tuning) without the graph; an ensemble has
                                   members/0/, members/1/, ... each with model.yaml and model.weights.h5;
                                   tf_serving_warmup_requests: requests TensorFlow Serving replays at
                                   load, compiling every XLA program a request can need (`warmup`)
  README.md                        the model card (shipped models; a bfloat16 export and an import write their
                                   own: its source and licence, its decoding and special ids)
  imported.json                    an imported model's record (`workdir.provenance`): source, licence, hashes
  manifest.json                    the size and SHA-256 of every other file and the precision (`exports.folder`;
                                   `keras-transformer verify` checks them all, every loader their sizes)
```

Signatures:

- `serving_default(inputs: string [N]) -> {translation: string [N], score: float32 [N]}`
- `n_best(inputs: string [N]) -> {translations: string [N, K], scores: float32 [N, K]}`
- `translate_ids(source_ids: int32 [N, S]) -> {tokens: int32 [N, T], score: float32 [N]}`
- `sample(inputs: string [N], seed: int32, temperature: float32, top_k: int32, top_p: float32)
  -> {translation: string [N], score: float32 [N]}` (one draw per input; the same seed, the same draws)
- `score(sources: string [N], targets: string [N]) -> {score: float32 [N]}` (forced decoding; one target per
  source, other counts fail naming both)
- `translate_prefix(inputs: string [N], target_prefix: string [N]) -> {translation: string [N], score: float32 [N]}`
  (`serving_default` with each translation starting with its target prefix, forced then continued; "" forces
  nothing; a prefix holding unk or leaving no room for a decoded token fails naming it)
- `translate_constrained(inputs: string [N], constraints: string [N, C], banned: string [N, B])
  -> {translation: string [N], score: float32 [N], met: bool [N, C]}` (`serving_default` held to terms,
  `Translator.translate_constrained`: row i's constraints must all appear in translation i, its banned phrases
  none; one term per slot, alternative forms separated by a tab, "" for an empty slot; `met` says which
  constraints the translation contains, True for an empty slot; over the limits of `engines.terms`, 16
  constraints a line, 4 forms, 8 tokens a form, 64 banned phrases, or holding unk fails naming it)

Scores are length-normalised log-probabilities (GNMT penalty with the export's alpha). An
ensemble (a `Translator` over several models) exports the same way, with every member's
weights in the one graph. Every signature works through its input in chunks of the
translator's `chunk_size` (`TRAINED_CHUNK_SIZE` for a translator built with 0), results
gathered once, so a request's memory does not grow with its size beyond its own ids and
results (docs/serving.md).

Precision (`export(..., precision=)`, `keras-transformer export --precision`): float32, or bfloat16, where every
weight is stored in bfloat16 and every matrix product runs in it while the attention softmax, the layer-norm
statistics, the logits and the beam search's scores stay float32 (`model.cast_model`), and the search runs on
TensorFlow's own (oneDNN) kernels, not XLA, whose CPU compiler converts bfloat16 products to float32. Faster than
float32 with AMX; with AVX512_BF16 alone it measured no faster, without either its products are emulated: the
export warns on both.
TensorFlow's int8 paths were slower than float32 on every CPU measured (docs/BENCHMARKS.md, "Low precision"), so
int8 is CTranslate2's (`--format ctranslate2 --precision int8`).
"""

import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.data.tokenizers import save_tokenizers
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.tensorflow import TRAINED_CHUNK_SIZE, Translator
from keras_transformer.errors import CheckpointNotFoundError, ConfigError
from keras_transformer.exports import Exporter
from keras_transformer.exports.folder import MANIFEST, check_export_sizes, export_lock, writing_export
from keras_transformer.exports.warmup import warmup_requests, write_warmup_file
from keras_transformer.model import cast_model
from keras_transformer.trainer.precision import cpu_has_amx, cpu_has_native_bfloat16
from keras_transformer.workdir.checkpoints import load_models, read_model_file, write_model_file, write_weights_file
from keras_transformer.workdir.layout import (
    EXTRA_DIR,
    MEMBERS_DIR,
    MODEL_CONFIG,
    MODEL_WEIGHTS,
    VOCAB_DIR,
    check_export_destination,
    is_export,
)
from keras_transformer.workdir.provenance import (
    IMPORT_RECORD,
    models_provenance,
    provenance_card,
    write_provenance,
)

# The precisions a SavedModel export takes (`export --precision`), and why the others are not offered.
PRECISIONS = ("float32", "bfloat16")
_NOT_OFFERED = {
    "int8": "TensorFlow's int8 paths (Keras' quantize('int8'), int8 weights cast back, its quantized MatMul) "
            "were slower than float32 on every CPU measured (docs/BENCHMARKS.md, 'Low precision'): export "
            "--format ctranslate2 --precision int8",
    "float16": "TensorFlow has no fast float16 matrix products on CPUs: use bfloat16 (same size, float32's range)",
}


class _Untracked:
    """A plain holder: tf.Module tracks attributes that are trackable, not this."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator


class TranslatorModule(tf.Module):
    """The `tf.Module` written to a SavedModel: a `Translator` plus its assets and signatures.

    Every signature works through its input `chunk_size` sentences (or pairs) at a time: a
    server has no say over the size of a request. A translator built with `chunk_size=0`
    (one search per batch) is served by a copy with `TRAINED_CHUNK_SIZE`, whose outputs are
    the same.

    Args:
        translator: a `Translator` (model, tokenizers, beam settings).
        asset_files: files (the tokenizer's vocabulary) copied into the SavedModel's `assets/`.

    Example:

    >>> module = TranslatorModule(translator, ["vocab/sentencepiece.model"])  # doctest: +SKIP
    >>> tf.saved_model.save(module, "out", signatures=module.signatures())  # doctest: +SKIP
    """

    def __init__(self, translator: Translator, asset_files: Iterable[str | os.PathLike[str]] = (),
                 name: str = "translator_module") -> None:
        super().__init__(name=name)
        if not translator.chunk_size:  # the same models and settings, in bounded chunks
            translator = Translator.ensemble([translator], chunk_size=TRAINED_CHUNK_SIZE)
        # The translator is held where tf.Module does not track it: tracked, its Keras model would write
        # every weight a second time (the Keras variables beside the tf.Variables the graph reads).
        self._held = _Untracked(translator)
        # What the graph reads, tracked once: the weights as tf.Variables and the tokenizers' resources.
        self.model_variables = [v.value if hasattr(v, "value") else v
                                for model in translator.models for v in model.variables]
        self.source_tokenizer = translator.source_tokenizer
        self.target_tokenizer = translator.target_tokenizer
        self.vocabulary_assets = [tf.saved_model.Asset(path) for path in asset_files]
        self.beam_size = tf.constant(translator.options.beam_size)
        self.alpha = tf.constant(translator.options.alpha)
        self.early_exit = tf.constant(translator.options.early_exit)

    @property
    def translator(self) -> Translator:
        """The `Translator` the signatures run."""
        return self._held.translator

    # Signatures are traced without AutoGraph, as the Translator's methods are (see engines/tensorflow.py).
    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def serve(self, inputs: Any) -> dict[str, Any]:
        """Best translation and its score for each input string."""
        outputs = self.translator.translate(inputs)
        return {"translation": outputs["translation"], "score": outputs["score"]}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def n_best(self, inputs: Any) -> dict[str, Any]:
        """All beam hypotheses, best first."""
        return self.translator.n_best(inputs)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="inputs"),
                                                   tf.TensorSpec([], tf.int32, name="seed"),
                                                   tf.TensorSpec([], tf.float32, name="temperature"),
                                                   tf.TensorSpec([], tf.int32, name="top_k"),
                                                   tf.TensorSpec([], tf.float32, name="top_p")])
    def sample(self, inputs: Any, seed: Any, temperature: Any, top_k: Any, top_p: Any) -> dict[str, Any]:
        """One translation per input drawn at random (`Translator.sample`): the same seed gives the same draws."""
        return self.translator.sample(inputs, seed, temperature, top_k, top_p)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="inputs"),
                                                   tf.TensorSpec([None], tf.string, name="target_prefix")])
    def translate_prefix(self, inputs: Any, target_prefix: Any) -> dict[str, Any]:
        """Best translation per input starting with its target prefix (`Translator.translate_prefixed`)."""
        return self.translator.translate_prefixed(inputs, target_prefix)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")])
    def translate_ids(self, source_ids: Any) -> dict[str, Any]:
        """Token ids in (tokens then eos, pad 0), best hypothesis ids out."""
        tokens, scores = self.translator.translate_ids(source_ids, num_return=1)
        return {"tokens": tokens[:, 0], "score": scores[:, 0]}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="sources"),
                                  tf.TensorSpec([None], tf.string, name="targets")])
    def score(self, sources: Any, targets: Any) -> dict[str, Any]:
        """Forced decoding: the score of given translations."""
        return {"score": self.translator.score(sources, targets)}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="inputs"),
                                                   tf.TensorSpec([None, None], tf.string, name="constraints"),
                                                   tf.TensorSpec([None, None], tf.string, name="banned")])
    def translate_constrained(self, inputs: Any, constraints: Any, banned: Any) -> dict[str, Any]:
        """Best translation per input held to its terms (`Translator.translate_constrained`)."""
        return self.translator.translate_constrained(inputs, constraints, banned)

    def signatures(self) -> dict[str, Any]:
        """The signature map for `tf.saved_model.save`.

        The functions themselves, not their concrete functions: `save` traces them in its save
        context, and a concrete function traced before it would be traced a second time there.
        """
        return {"serving_default": self.serve, "n_best": self.n_best, "translate_ids": self.translate_ids,
                "score": self.score, "sample": self.sample, "translate_prefix": self.translate_prefix,
                "translate_constrained": self.translate_constrained}


def export_translator(translator: Translator, directory: str | os.PathLike[str], config: Any = None,
                      overwrite: bool = False, provenance: dict[str, Any] | None = None) -> str:
    """Writes `translator` as a SavedModel (see the module docstring for the layout).

    Args:
        translator: a `keras_transformer.engines.tensorflow.Translator`.
        directory: output folder.
        config: the model's `TransformerConfig` (an ensemble: a list, one per
            member); with it, `assets.extra/` also holds the Keras weights, config
            and vocabulary, so `inference.load_translator` can rebuild the model. The
            config written there carries the translator's decoding settings.
        overwrite: replace an existing export.
        provenance: the model's import record (`workdir.provenance`), None for a model trained with this package:
            written as `imported.json`, named in the manifest and in the model card (`README.md`).

    The export is written into a temporary folder beside `directory`, loaded and
    asked to translate one sentence, given its manifest (the size and SHA-256
    of every file), and only then swapped in (`exports.folder.writing_export`):
    an export that fails or is killed on the way leaves the old one whole, and
    a second export to the same folder meanwhile is refused.

    Returns:
        The export directory.

    Raises:
        FileExistsError: `directory` holds an export and `overwrite` is False, or
            it is a non-empty folder that is not a SavedModel export.
        ConfigError: `directory` is or lies in a training workdir.
        WorkdirBusyError: another process is exporting to `directory` (named).

    Example:

    >>> export_translator(translator, "saved_models/my_model", config)  # doctest: +SKIP
    """
    directory = pathlib.Path(directory)
    configs = None if config is None else (list(config) if isinstance(config, (list, tuple)) else [config])
    if configs is not None and len(configs) != len(translator.models):
        raise ValueError(f"export_translator: {len(configs)} config(s) for a translator of "
                         f"{len(translator.models)} model(s); give one config per model.")
    check_export_destination(directory)
    with export_lock(directory):  # one writer per export folder, for the whole export
        if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
            if not (directory / "saved_model.pb").is_file():
                raise FileExistsError(f"{directory} exists and is not a SavedModel export (no saved_model.pb); not "
                                      f"writing into it. Choose a new or empty --out folder.")
            if not overwrite:
                raise FileExistsError(f"{directory} already holds a SavedModel; replace it with --overwrite "
                                      "(overwrite=True in Python).")
        precision = translator_precision(translator)
        # Written and checked beside `directory`, then swapped in: the old export serves until the new one works.
        with writing_export(directory, precision=precision) as staging:
            _write_savedmodel(translator, staging, configs)
            check_saved_model(staging)
            if provenance is not None:  # the manifest (written last) and the card name the source and licence
                write_provenance(staging, provenance)
            # the card of a bfloat16 export or an import (a float32 export of a trained model keeps the folder's
            # own card, if any)
            if precision != "float32" or provenance is not None:
                (staging / MODEL_CARD).write_text(_model_card(translator, precision, provenance), encoding="utf-8")
            if directory.is_dir():  # what else the old folder held (a model card, say) stays
                for entry in directory.iterdir():
                    if entry.name not in SAVED_MODEL_PARTS and not (staging / entry.name).exists():
                        copy = shutil.copytree if entry.is_dir() else shutil.copy2
                        copy(entry, staging / entry.name)
    return os.fspath(directory)


# an export's own files
# an export's own files
SAVED_MODEL_PARTS = ("saved_model.pb", "fingerprint.pb", "variables", "assets", EXTRA_DIR, MANIFEST, IMPORT_RECORD)
MODEL_CARD = "README.md"


def translator_precision(translator: Translator) -> str:
    """The precision of a `Translator`'s weights: "bfloat16" where its models run under that policy, else
    "float32" (what the export records).

    Example:

    >>> translator_precision(Translator(model, tokenizer))  # doctest: +SKIP
    'float32'
    """
    names = {model.dtype_policy.name for model in translator.models}
    return "bfloat16" if names == {"bfloat16"} else "float32"


def special_tokens(tokenizer: Any) -> str:
    """The special ids of a target tokenizer and their tokens, for a model card: "pad 1 `<pad>`, ...".

    Example:

    >>> special_tokens(Translator(model, tokenizer).target_tokenizer)  # doctest: +SKIP
    'pad 58100 `<pad>`, bos 58100 `<pad>`, eos 0 `</s>`, unk 1 `<unk>`'
    """
    names = [name for name in ("pad", "bos", "eos", "unk") if getattr(tokenizer, f"{name}_id", None) is not None]
    ids = [int(getattr(tokenizer, f"{name}_id")) for name in names]
    pieces = tokenizer.id_to_piece(tf.constant(ids, tf.int32)).numpy()
    return ", ".join(f"{name} {index} `{piece.decode('utf-8')}`" for name, index, piece in zip(names, ids, pieces))


def _model_card(translator: Translator, precision: str, provenance: dict[str, Any] | None = None) -> str:
    options = translator.options
    xla = ", compiled with XLA" if translator.jit_compile else " (TensorFlow's own kernels, not XLA)"
    if precision == "float32":
        weights = "Precision: **float32**. `manifest.json` records it (`keras-transformer verify` prints it)."
    else:
        weights = f"""Precision: **{precision}**. Every weight is stored in {precision} and every matrix product runs in
it; the attention softmax, the layer-norm statistics, the logits and the beam search's scores are float32. It is faster
than float32 on CPUs with AMX (Intel Xeon from Sapphire Rapids); with AVX512_BF16 alone (AMD Zen 4) it measured no
faster, and without either TensorFlow converts around every matrix product and the float32 export is faster.
`manifest.json` records the precision (`keras-transformer verify` prints it)."""
    return f"""# A keras_transformer SavedModel in {precision}

{provenance_card(provenance)}

{weights}

Decoding: {options.describe()}, in the graph with the SentencePiece tokenization{xla}. Special ids (target
vocabulary): {special_tokens(translator.target_tokenizer)}.

```python
import tensorflow as tf
import tensorflow_text  # registers the SentencePiece ops
translator = tf.saved_model.load("this/folder")
translator.signatures["serving_default"](tf.constant(["A man rides a bike."]))["translation"]
```
"""


def check_precision(precision: str, flag: str = "--precision", warn: bool = True) -> str:
    """Returns `precision` if a SavedModel export takes it ("float32", "bfloat16"); else raises naming why not.
    bfloat16 on a CPU without AMX is taken with a warning that names what the CPU lacks.

    Raises:
        ConfigError: another precision (int8, float16, ...), with the reason and what to use instead.

    Example:

    >>> check_precision("float32")
    'float32'
    >>> check_precision("int8")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: --precision int8 is not offered for --format savedmodel: ...
    """
    if precision not in PRECISIONS:
        reason = _NOT_OFFERED.get(precision, f"it takes {' or '.join(PRECISIONS)}")
        raise ConfigError(f"{flag} {precision} is not offered for --format savedmodel: {reason}.")
    if warn and precision == "bfloat16":
        if not cpu_has_native_bfloat16():
            logging.getLogger(__name__).warning(
                "%s bfloat16: this CPU has neither AVX512_BF16 nor AMX (no avx512_bf16 or amx_bf16 in /proc/cpuinfo), "
                "so TensorFlow converts bfloat16 around every matrix product and the export decodes slower than "
                "float32 here; serve it on a CPU with AMX (docs/serving.md, 'Precision').", flag)
        elif not cpu_has_amx():
            logging.getLogger(__name__).warning(
                "%s bfloat16: this CPU has AVX512_BF16 but not AMX (no amx_bf16 in /proc/cpuinfo); there the "
                "bfloat16 export (searched without XLA) decoded no faster than the float32 one "
                "(docs/BENCHMARKS.md, 'Low precision'), so serve it on a CPU with AMX (docs/serving.md, "
                "'Precision').", flag)
    return precision


def _write_savedmodel(translator: Translator, directory: str | os.PathLike[str],
                      configs: list[TransformerConfig] | None) -> None:
    """Writes the SavedModel and its `assets.extra/` into the new folder `directory`."""
    directory = os.fspath(directory)
    with tempfile.TemporaryDirectory() as scratch:
        vocab = os.path.join(scratch, VOCAB_DIR)
        files = save_tokenizers(vocab, translator.source_tokenizer, translator.target_tokenizer)
        module = TranslatorModule(translator, files)
        tf.saved_model.save(module, directory, signatures=module.signatures())
        extra = os.path.join(directory, EXTRA_DIR)
        os.makedirs(extra, exist_ok=True)
        shutil.copytree(vocab, os.path.join(extra, VOCAB_DIR), dirs_exist_ok=True)
    write_warmup_file(directory, warmup_requests(module.translator))  # what TensorFlow Serving replays at load
    if configs is not None:
        single = len(configs) == 1
        # The decoding options say what the graph does, so that `inference.load_translator` decodes alike.
        for index, (member_config, model) in enumerate(zip(configs, translator.models)):
            folder = extra if single else os.path.join(extra, MEMBERS_DIR, str(index))
            os.makedirs(folder, exist_ok=True)
            write_model_file(os.path.join(folder, MODEL_CONFIG), member_config, translator.options)
            write_weights_file(model, os.path.join(folder, MODEL_WEIGHTS))  # a full disk: one plain OSError


def check_saved_model(directory: str | os.PathLike[str]) -> None:
    """Loads an export and translates one sentence through `serving_default`; raises if it cannot.

    `export_translator` calls it on the new export before it replaces the old one.
    """
    loaded = tf.saved_model.load(os.fspath(directory))
    outputs = loaded.signatures["serving_default"](tf.constant(["A check."]))
    if outputs["translation"].shape != (1,) or outputs["translation"].dtype != tf.string:
        raise RuntimeError(f"The new export in {directory} loads but does not translate: serving_default gave "
                           f"{outputs}.")


def export(workdir: str | os.PathLike[str] | list[str | os.PathLike[str]], directory: str | os.PathLike[str],
           checkpoint: Any = None, average: int | None = None, options: DecodeOptions | None = None,
           jit_compile: bool | None = None, overwrite: bool = False, precision: str = "float32",
           **settings: Any) -> str:
    """Exports a training workdir's model: the library function behind `keras-transformer export`.

    Args:
        workdir: the folder `keras-transformer train` wrote (model.yaml, data/vocab, checkpoints/);
            a list of workdirs sharing a vocabulary exports them as one ensemble. A SavedModel export is
            exported again with this version's code (the same weights; its options unless given).
        directory: output folder for the SavedModel.
        checkpoint: a `.weights.h5` file; default: the last checkpoint (or the average below).
            An ensemble takes a list, one per workdir (or None).
        average: average the last `average` checkpoints (paper: 5 base, 20 big).
        options: the `DecodeOptions` baked into the graph's `serving_default` and `n_best` (default: the
            workdir's model.yaml's); the exported `assets.extra/model.yaml` records them, so that
            `inference.load_translator` decodes as the graph does. The `sample` signature takes its sampling
            settings as inputs.
        jit_compile: compile the search with XLA (`Translator`'s `jit_compile`): a serving process
            compiles one program per bucketed input shape on first use, then decodes the shipped model
            1.5-1.8x faster on the 2-core development CPU (docs/BENCHMARKS.md). None: True in float32, False in
            bfloat16, whose products XLA's CPU compiler in TensorFlow's wheels converts to float32 (it keeps
            bfloat16 dots only in builds with oneDNN inside XLA), where TensorFlow's own kernels run them in
            bfloat16 (oneDNN, AMX).
        overwrite: replace an existing export.
        precision: "float32", or "bfloat16": weights and matrix products in bfloat16, softmax, layer norms and
            search scores in float32 (the module docstring; `check_precision`).
        **settings: `DecodeOptions` fields replacing those of `options` (`beam_size=5`, `alpha=1.0`, ...).

    Returns:
        The export directory.

    Example:

    >>> export("runs/multi30k_en_de", "saved_models/multi30k_en_de", average=10)  # doctest: +SKIP
    """
    check_precision(precision)
    check_export_destination(directory)  # before the models load
    workdirs = list(workdir) if isinstance(workdir, (list, tuple)) else [workdir]
    for path in workdirs:
        if not (os.path.isfile(os.path.join(os.fspath(path), MODEL_CONFIG)) or is_export(path)):
            raise CheckpointNotFoundError(f"{path} is not a training workdir: "
                                          f"{os.path.join(os.fspath(path), MODEL_CONFIG)} is missing (nor a "
                                          "SavedModel export, which is re-exported with this version's code).")
    with export_lock(directory):  # held from the start: a second export to the same folder is refused at once
        loaded = load_models(workdirs if len(workdirs) > 1 else workdirs[0], checkpoint, average,
                             require_vocabulary=True)
        models = [cast_model(model, config, precision) for model, config in zip(loaded.models, loaded.configs)]
        jit_compile = precision != "bfloat16" if jit_compile is None else jit_compile
        translator = Translator.from_models(models, loaded.vocab_dir, options or loaded.decoding,
                                            jit_compile=jit_compile, **settings)
        return export_translator(translator, directory, config=loaded.configs, overwrite=overwrite,
                                 provenance=models_provenance(workdirs))


def load_exported(directory: str | os.PathLike[str]) -> Any:
    """`tf.saved_model.load` with a clear error when the folder is not an export.

    Example:

    >>> loaded = load_exported("saved_models/multi30k_en_de")  # doctest: +SKIP
    >>> loaded.signatures["serving_default"](tf.constant(["A man rides a bike."]))  # doctest: +SKIP
    """
    directory = os.fspath(directory)
    if not os.path.isfile(os.path.join(directory, "saved_model.pb")):
        raise FileNotFoundError(f"No SavedModel at {directory} (saved_model.pb is missing).")
    check_export_sizes(directory)  # a truncated variables file is named here, not by TensorFlow
    return tf.saved_model.load(directory)


class SavedModelExporter(Exporter):
    """`keras-transformer export --format savedmodel` (the default): `export` above, and the decoding it records.

    Args:
        jit_compile: compile the search with XLA (`--no-xla`: False; None: `export`'s choice for the precision).
        precision: "float32" (None) or "bfloat16" (`--precision`; `check_precision`).

    Example:

    >>> SavedModelExporter(jit_compile=False).jit_compile
    False
    """

    name = "savedmodel"
    options = {"jit_compile": "--no-xla", "precision": "--precision"}
    precisions = PRECISIONS

    def __init__(self, jit_compile: bool | None = None, precision: str | None = None) -> None:
        self.jit_compile = jit_compile
        self.precision = check_precision(precision or "float32", warn=False)  # `export` warns

    def export(self, model: str | os.PathLike[str] | list[str | os.PathLike[str]], directory: str | os.PathLike[str], *,
               checkpoint: Any = None, average: int | None = None, overwrite: bool = False,
               options: DecodeOptions | None = None, **settings: Any) -> str:
        """`export(model, directory, ...)` with this exporter's `jit_compile` (`Exporter.export`)."""
        settings = {key: value for key, value in settings.items() if value is not None}
        return export(model, directory, checkpoint=checkpoint, average=average, options=options,
                      jit_compile=self.jit_compile, overwrite=overwrite, precision=self.precision, **settings)

    def recorded_decoding(self, directory: str | os.PathLike[str]) -> DecodeOptions | None:
        """The decoding of the export's `assets.extra/model.yaml` (None without one)."""
        written = pathlib.Path(directory) / EXTRA_DIR / MODEL_CONFIG
        return read_model_file(written)[1] if written.is_file() else None
