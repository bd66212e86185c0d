"""LiteRT (TensorFlow Lite) export: the whole cached search as one `model.tflite`, built-in operators only.

```
exports/en_de_litert/
  model.tflite           the search's signatures (below), LiteRT built-in operators only (no SELECT_TF_OPS)
  sentencepiece.model    the SentencePiece model (source.sentencepiece.model and target.sentencepiece.model for
                         separate vocabularies): the app tokenizes, the model takes and returns ids
  litert.json            format, precision, the decoding baked in, special ids, length limits, file names, the
                         model's config (`engines.litert.read_metadata`)
  README.md              the model card: where the model came from, its decoding and special ids
  imported.json          an imported model's record (`workdir.provenance`): source, licence, original hashes
  manifest.json          the size and SHA-256 of every other file (`keras-transformer verify`), and the
                         source and licence of an import
```

Signatures of `model.tflite` (N sentences, S source positions: pieces then eos, padded with pad 0):

- `beam_search(source_ids: int32 [N, S]) -> {tokens: int32 [N, K, T], score: float32 [N, K]}`: the package's
  beam search (`decoding.beam_search`) with the recorded beam size K, alpha, max_extra and early exit, the
  key/value cache, each sentence's length limit (its source length + max_extra) and the GNMT length penalty;
  the K hypotheses best first, each ending with eos then pad. Only where the recorded strategy is beam search.
- `greedy(source_ids: int32 [N, S]) -> {tokens: int32 [N, 1, T], score: float32 [N, 1]}`: greedy decoding.
- `score(source_ids: int32 [N, S], target_ids: int32 [N, T]) -> {score: float32 [N]}`: forced decoding, targets
  ending with eos: log P(target | source), which the caller divides by a length penalty if it wants one.

The search is the model's own (`keras_transformer.decoding`), traced in TensorFlow, its variables frozen into
constants and converted by `tf.lite.TFLiteConverter` with `TFLITE_BUILTINS` only. One Keras operation needs a
stand-in while tracing: `keras.ops.argmax` guards TensorFlow's flush-to-zero with a sign-bit test that becomes
`tf.BitwiseAnd`, which LiteRT has no built-in for; `tf.argmax` takes its place (they differ only between -0.0 and
0.0). Precision (`--precision`): float32; float16 (weights stored in float16, half the file); int8 (dynamic-range:
int8 weights, activations quantized on the fly by XNNPACK's kernels, a quarter of the file).

This module imports TensorFlow (it converts); serving does not: `engines.litert.LiteRTTranslator` reads the folder
with `ai-edge-litert` and `sentencepiece` alone.
"""

import contextlib
import copy
import datetime
import gc
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.config import TransformerConfig
from keras_transformer.data.tokenizers import read_vocabulary
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.litert import (
    FORMAT,
    FORMAT_VERSION,
    PRECISIONS,
    SCORE_SIGNATURE,
    SEARCH_SIGNATURES,
    LiteRTTranslator,
    is_litert_model,
    read_metadata,
)
from keras_transformer.errors import ConfigError
from keras_transformer.exports import Exporter
from keras_transformer.exports.folder import export_lock, writing_export
from keras_transformer.files import atomic_write_text
from keras_transformer.workdir.checkpoints import load_models
from keras_transformer.workdir.layout import (
    LITERT_METADATA,
    LITERT_MODEL,
    SENTENCEPIECE_MODELS,
    TOKENIZER_SETTINGS,
    check_export_destination,
    tokenizer_folders,
)
from keras_transformer.workdir.provenance import provenance_card, provenance_summary, read_provenance, write_provenance

README_FILE = "README.md"  # the model card

_SUBWORD_FORMAT = "keras_transformer.SubwordTokenizer"  # tokenizer.json of keras_transformer.data.tokenizers
_MAPPED_FORMAT = "keras_transformer.MappedTokenizer"  # an imported vocabulary's (data.tokenizers.mapped)
_IDS = tf.TensorSpec([None, None], tf.int32, name="source_ids")
_TARGET_IDS = tf.TensorSpec([None, None], tf.int32, name="target_ids")
_PREFIX = tf.TensorSpec([None, None], tf.int32, name="target_prefix")


def check_litert_precision(precision: str | None, flag: str = "--precision") -> str:
    """`precision` (None: float32) if a LiteRT export takes it, else a `ConfigError` naming what it takes.

    Example:

    >>> check_litert_precision("int8")
    'int8'
    >>> check_litert_precision("bfloat16")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: --precision bfloat16: a LiteRT export is float32, float16 or int8.
    """
    precision = precision or "float32"
    if precision not in PRECISIONS:
        raise ConfigError(f"{flag} {precision}: a LiteRT export is {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}.")
    return precision


def vocabulary_files(vocab_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Per side (`"source"`, `"target"`), what a LiteRT export copies of a vocabulary folder: `model` (the
    SentencePiece model file), `tokens` (an imported vocabulary's tokens by id, else None), `settings` (its
    ``tokenizer.json``) and `folder`; one folder for both sides where the vocabulary is shared.

    Takes the SentencePiece vocabularies the package learns (bpe, unigram) and imported ones
    (`data.tokenizers.MappedTokenizer`: OPUS-MT's separate source and target models, M2M-100's and NLLB's
    language tokens).

    Raises:
        ConfigError: a vocabulary of another kind (WordPiece), named.
        FileNotFoundError: a tokenizer file is missing.
        CorruptFileError: an imported vocabulary that is not one (named).
    """
    sides = {}
    folders = tokenizer_folders(vocab_dir)
    for side, folder in zip(("source", "target"), (folders[0], folders[-1])):
        settings_file = folder / TOKENIZER_SETTINGS
        if not settings_file.is_file():
            raise FileNotFoundError(f"No tokenizer at {folder}: expected {TOKENIZER_SETTINGS}.")
        settings = json.loads(settings_file.read_text(encoding="utf-8"))
        mapped = settings.get("format") == _MAPPED_FORMAT
        if not mapped and (settings.get("format") != _SUBWORD_FORMAT
                           or settings.get("model_type") not in SENTENCEPIECE_MODELS):
            raise ConfigError(f"LiteRT export: {settings_file} is a {settings.get('format')} "
                              f"{settings.get('model_type') or ''} vocabulary; this format takes SentencePiece "
                              "vocabularies (bpe, unigram: learned by the package, or imported).")
        model_file = folder / settings["model_file"]
        files = [model_file] + ([folder / settings["vocabulary_file"]] if mapped else [])
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"Tokenizer file {path} named in {settings_file} is missing.")
        sides[side] = {"folder": os.fspath(folder), "model": os.fspath(model_file), "settings": settings,
                       "tokens": read_vocabulary(files[1]) if mapped else None}
    return sides


@contextlib.contextmanager
def builtin_argmax() -> Iterator[None]:
    """While tracing: `keras.ops.argmax` as `tf.argmax`, whose LiteRT form is the built-in ARG_MAX (Keras'
    TensorFlow argmax adds a sign-bit test, `tf.BitwiseAnd`, that LiteRT has no built-in for)."""
    original = keras.ops.argmax

    def argmax(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        if axis is None or keepdims:
            return original(x, axis=axis, keepdims=keepdims)
        return tf.argmax(x, axis=axis, output_type=tf.int32)

    keras.ops.argmax = argmax
    try:
        yield
    finally:
        keras.ops.argmax = original


def _frozen(function: Any, *specs: tf.TensorSpec) -> Any:
    """`function` traced on `specs` as a concrete function with every variable a constant: the converter freezes
    no variable a `while` loop reads (LiteRT's READ_VARIABLE would then find it unset)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = tf.function(function, input_signature=list(specs), autograph=False).get_concrete_function()
    names = sorted(concrete.structured_outputs)  # a dict's outputs are flattened in the order of its keys
    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)

    def call(*inputs: Any) -> dict[str, Any]:
        outputs = frozen(*inputs)
        return outputs if isinstance(outputs, dict) else dict(zip(names, tf.nest.flatten(outputs)))
    return tf.function(call, input_signature=list(specs), autograph=False).get_concrete_function()


def signature_functions(model: Any, config: TransformerConfig, options: DecodeOptions,
                        start_from_prefix: bool = False) -> dict[str, Any]:
    """The concrete functions of `model.tflite`'s signatures, variables frozen (the module docstring lists them);
    `start_from_prefix`: the decoder starts from each prefix's first token (a `language_last` target tokenizer's)."""
    special = dict(pad_id=config.pad_id, bos_id=config.bos_id, eos_id=config.eos_id,
                   **({"start_from_prefix": True} if start_from_prefix else {}))
    strategies = {"greedy": options.replace(strategy="greedy", n_best=None)}
    if options.strategy == "beam":
        strategies["beam"] = options.replace(n_best=options.beam_size)
    functions = {}
    with builtin_argmax():
        for strategy, settings in strategies.items():
            def search(source_ids: Any, target_prefix: Any, strategy: str = strategy,
                       settings: DecodeOptions = settings) -> Any:
                tokens, score = decoding.strategy(strategy)([model], source_ids, settings, target_prefix=target_prefix,
                                                            **special)
                return {"tokens": tokens, "score": score}
            functions[SEARCH_SIGNATURES[strategy]] = _frozen(search, _IDS, _PREFIX)

        def score(source_ids: Any, target_ids: Any) -> Any:
            return {"score": decoding.score([model], source_ids, target_ids, alpha=0.0, pad_id=config.pad_id,
                                            bos_id=config.bos_id, start_from_prefix=start_from_prefix)}
        functions[SCORE_SIGNATURE] = _frozen(score, _IDS, _TARGET_IDS)
    return functions


def convert(model: Any, config: TransformerConfig, options: DecodeOptions,
            precisions: tuple[str, ...] = ("float32",), start_from_prefix: bool = False) -> dict[str, bytes]:
    """`model`'s search and scoring as the bytes of a `model.tflite` per precision, LiteRT built-in operators only:
    traced once, converted once per precision (`start_from_prefix` as in `signature_functions`).

    Raises:
        ConfigError: an operation the converter cannot express in built-in operators (named, as the converter
            names it), or a strategy the format does not hold (sampling).

    Example:

    >>> data = convert(model, config, DecodeOptions(beam_size=4), precisions=("int8",))["int8"]  # doctest: +SKIP
    """
    if options.strategy not in SEARCH_SIGNATURES:
        raise ConfigError(f"LiteRT export: strategy {options.strategy!r} is not exported; a LiteRT export decodes "
                          f"with {' or '.join(SEARCH_SIGNATURES)} search.")
    precisions = tuple(check_litert_precision(precision) for precision in precisions)
    converted = {}
    with tempfile.TemporaryDirectory(prefix="litert-") as folder, _quiet("absl"):
        signatures = _save_signatures(model, config, options, folder, start_from_prefix)
        gc.collect()  # traced graphs hold reference cycles: freed now, before the converter's own copies
        for precision in precisions:
            converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=signatures)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            if precision != "float32":
                converter.optimizations = [tf.lite.Optimize.DEFAULT]  # int8: dynamic-range weights
            if precision == "float16":
                converter.target_spec.supported_types = [tf.float16]
            try:
                converted[precision] = converter.convert()
            except Exception as error:  # the converter's errors carry the operations it could not express
                raise ConfigError(f"LiteRT export: the converter cannot express this model in LiteRT's built-in "
                                  f"operators: {_unconverted(str(error))}.") from None
            if precision == "int8":
                converted[precision] = share_int8_weights(converted[precision])
    return converted


def _save_signatures(model: Any, config: TransformerConfig, options: DecodeOptions, folder: str,
                     start_from_prefix: bool = False) -> list[str]:
    """Writes `signature_functions` as a SavedModel in `folder` and returns the signatures' names. The traced
    functions (each with its own frozen copy of the weights) are dropped on return: the converter reads the folder,
    and with them gone it adds a third of the memory it adds beside them (bench/litert_memory.py)."""
    functions = signature_functions(model, config, options, start_from_prefix)
    tf.saved_model.save(tf.Module(), folder, signatures=functions,
                        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
    return list(functions)


def share_int8_weights(data: bytes) -> bytes:
    """An int8 `model.tflite` whose constant matrices read through DEQUANTIZE (a tied embedding's lookup) use the
    per-channel int8 copy of the same matrix that a FULLY_CONNECTED (the tied softmax) reads, where there is one:
    the matrix stored once, not twice.

    The converter quantizes a matrix per tensor for its lookup and per row for the softmax, two copies that the
    buffer deduplication cannot merge; a row's scale serves the lookup as well (DEQUANTIZE takes per-channel
    scales), and is finer. The copies are matched by value: the same shape, and every entry within half a step
    of each quantization of the other (the same float matrix).
    """
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(data))
    codes = [code.builtinCode or code.deprecatedBuiltinCode for code in model.operatorCodes]
    operator, int8 = schema.BuiltinOperator, schema.TensorType.INT8

    def values(tensor: Any) -> Any:
        stored = model.buffers[tensor.buffer].data
        return None if stored is None or len(stored) == 0 else np.asarray(stored, np.uint8).view(np.int8).reshape(
            tensor.shape)

    def scales(tensor: Any) -> Any:
        quantization = tensor.quantization
        return None if quantization is None or quantization.scale is None else np.asarray(quantization.scale)

    rows: dict[int, Any] = {}  # buffer -> a per-row int8 weight of FULLY_CONNECTED
    for graph in model.subgraphs:
        for op in graph.operators:
            if codes[op.opcodeIndex] == operator.FULLY_CONNECTED and len(op.inputs) > 1 and op.inputs[1] >= 0:
                tensor = graph.tensors[op.inputs[1]]
                scale = scales(tensor)
                if (tensor.type == int8 and scale is not None and len(scale) > 1
                        and tensor.quantization.quantizedDimension == 0 and values(tensor) is not None):
                    rows.setdefault(tensor.buffer, tensor)
    for graph in model.subgraphs:
        for op in graph.operators:
            if codes[op.opcodeIndex] != operator.DEQUANTIZE:
                continue
            tensor = graph.tensors[op.inputs[0]]
            scale, quantized = scales(tensor), values(tensor)
            if tensor.type != int8 or scale is None or len(scale) != 1 or quantized is None:
                continue
            for buffer, other in rows.items():
                if list(other.shape) != list(tensor.shape):
                    continue
                step = scales(other).reshape((-1,) + (1,) * (len(tensor.shape) - 1))
                if np.all(np.abs(quantized * scale[0] - values(other) * step) <= (scale[0] + step) / 2 * 1.001):
                    tensor.buffer, tensor.quantization = buffer, copy.deepcopy(other.quantization)
                    break
    used = {tensor.buffer for graph in model.subgraphs for tensor in graph.tensors}
    used |= {entry.buffer for entry in model.metadata or []}  # the runtime version, the converter's record
    for index, buffer in enumerate(model.buffers):
        if index not in used:
            buffer.data = None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger `name` at ERROR for the block: the converter reloads the frozen functions, and TensorFlow warns on
    each that its gradients were not saved (none is ever asked for)."""
    logger = logging.getLogger(name)

    def errors_only(record: logging.LogRecord) -> bool:  # a filter: the converter resets the logger's level
        return record.levelno >= logging.ERROR

    logger.addFilter(errors_only)
    try:
        yield
    finally:
        logger.removeFilter(errors_only)


def _unconverted(message: str) -> str:
    """The operations a converter error names: its "TF Select ops" line, or the TensorFlow operations it could
    not legalize, or an operation it failed on inside (its type and the layer that made it, with its error), else
    its last line.

    Example:

    >>> _unconverted('loc(callsite(fused["Transpose:", "encoder_1/layer_0_1/self_attention_1/transpose@__inference_'
    ...              'pruned_5"] at fused["StatefulPartitionedCall:", "x"])): error: operand #1 does not dominate')
    'Transpose in encoder_1/layer_0_1/self_attention_1 (the converter failed: operand #1 does not dominate)'
    """
    found = re.findall(r"TF Select ops: ([^\n]+)", message) or re.findall(r"'(tf\.[A-Za-z0-9_]+)' op", message)
    if found:
        return ", ".join(sorted(set(found)))
    for line in message.splitlines():  # MLIR's form: "<unknown>:0: error: loc(... fused["Op:", "name@f"] ...): what"
        failed = re.search(r'fused\["(\w+):", "([^"@]+)@', line)
        if failed and "error:" in line:
            what = re.split(r"\)+: ", line.split("error:", 1)[1])[-1].replace("error: ", "")
            layer = failed.group(2).rsplit("/", 1)[0]
            return f"{failed.group(1)} in {layer} (the converter failed: {what.strip()[:120]})"
    return message.strip().splitlines()[-1][:200]


def _metadata(config: TransformerConfig, options: DecodeOptions, precision: str, files: dict[str, dict[str, str]],
              sides: dict[str, dict[str, Any]], signatures: list[str],
              provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """``litert.json``: what `LiteRTTranslator` (or an app) needs beside `model.tflite`."""
    mapped = sides["source"]["tokens"] is not None
    special = {name: int(getattr(config, name)) for name in ("pad_id", "unk_id", "bos_id", "eos_id")}
    metadata = {
        "format": FORMAT, "version": FORMAT_VERSION,
        "exported": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "tensorflow_version": tf.__version__,
        "precision": precision,
        "decoding": options.to_dict(),
        "length_penalty": "gnmt: score = log P / ((5 + n) / 6) ** alpha, n counting the eos token",
        "signatures": signatures,
        "special_ids": special,
        "special_tokens": {name[:-3]: _token(sides["target"], index) for name, index in special.items()},
        # "ids": SentencePiece's ids are the model's; "mapped": an imported vocabulary numbers the pieces
        "tokenization": "mapped" if mapped else "ids",
        "sentencepiece": {side: names["sentencepiece"] for side, names in files.items()},
        "max_source_length": int(config.max_length),
        "max_target_length": int(config.max_length),
        "model_config": config.to_dict(),
        "provenance": provenance_summary(provenance),
    }
    if mapped:
        metadata["vocabulary"] = {side: names["vocabulary"] for side, names in files.items()}
        # a multilingual vocabulary's language tokens: a sentence may open with one, one without gets the side's
        # language first; detokenizing drops them and the special tokens
        metadata["languages"] = {side: {key: sides[side]["settings"].get(key, default) for key, default in
                                        (("languages", []), ("language", None), ("special_tokens", []),
                                         ("split_tokens", []))}
                                 for side in ("source", "target")}
        for side in ("source", "target"):  # mBART-large-cc25: tokens </s> [src_lang], the decoder started from
            if sides[side]["settings"].get("language_last"):  # the target prefix's language token
                metadata["languages"][side]["language_last"] = True
        metadata["target_languages"] = metadata["languages"]["target"]["languages"]
    return metadata


def _token(side: dict[str, Any], index: int) -> str:
    """The token of id `index` on one side: an imported vocabulary's, else the SentencePiece model's piece."""
    if side["tokens"] is not None:
        return str(side["tokens"][index])
    import sentencepiece
    return str(sentencepiece.SentencePieceProcessor(model_file=side["model"]).id_to_piece(index))


def _readme(metadata: dict[str, Any], provenance: dict[str, Any] | None) -> str:
    """The model card: where the model came from, what each signature decodes with, the special ids."""
    options = DecodeOptions.from_dict(metadata["decoding"])
    ids = ", ".join(f"{name[:-3]} {index} `{metadata['special_tokens'][name[:-3]]}`"
                    for name, index in metadata["special_ids"].items())
    files = metadata["sentencepiece"]
    tokenizer = (f"`{files['source']}`" if files["source"] == files["target"]
                 else f"`{files['source']}` (source) and `{files['target']}` (target)")
    if metadata["tokenization"] == "mapped":
        vocabulary = metadata["vocabulary"]
        tokenizer += (f"; the model's ids are the positions of SentencePiece's pieces in `{vocabulary['source']}`"
                      + ("" if vocabulary["source"] == vocabulary["target"] else f" and `{vocabulary['target']}`")
                      + " (a piece not listed is unk)")
    languages = metadata.get("target_languages") or []
    shown = ", ".join(f"`{token}`" for token in languages[:12]) + (", ..." if len(languages) > 12 else "")
    prefix = (f" Target languages ({len(languages)}): {shown}; the one whose token opens the `target_prefix` input "
              "is forced first." if languages else "")
    return f"""# LiteRT model exported by keras_transformer

{provenance_card(provenance)}

Precision: {metadata['precision']}. Signatures: {', '.join(f'`{name}`' for name in metadata['signatures'])}. The
recorded decoding (`{LITERT_METADATA}`, what `LiteRTTranslator` runs): {options.describe()}. Special ids: {ids};
a source is its token ids then eos, padded with pad. SentencePiece: {tokenizer}.{prefix}
"""


def export_litert(model: Any, config: TransformerConfig, vocab_dir: str | os.PathLike[str],
                  directory: str | os.PathLike[str], *, options: DecodeOptions | None = None,
                  precision: str | None = None, overwrite: bool = False, provenance: dict[str, Any] | None = None,
                  **settings: Any) -> str:
    """Writes `model` as a LiteRT export folder (the module docstring lists its files and signatures):
    `convert`, then `write_litert`.

    Args:
        model: a `build_model` model with its trained weights.
        config: its `TransformerConfig`.
        vocab_dir: its SentencePiece vocabulary folder (`save_tokenizers`'s: a workdir's ``data/vocab``).
        directory: the folder to create.
        options: the `DecodeOptions` baked into the search (default `DecodeOptions()`); `settings` replace fields.
        precision: "float32" (default), "float16" or "int8" (`PRECISIONS`).
        overwrite: replace an existing LiteRT export at `directory`.
        provenance: the model's import record (`workdir.provenance`; None: trained with this package), written as
            `imported.json` and named in `litert.json`, the manifest and the card.

    Returns:
        `directory`.

    Raises:
        ConfigError: a precision, vocabulary or operation the format cannot hold (named).
        FileExistsError: `directory` exists and `overwrite` is False, or it is not a LiteRT export.

    Example:

    >>> export_litert(model, config, "runs/en_de/data/vocab", "exports/litert", precision="int8")  # doctest: +SKIP
    'exports/litert'
    """
    precision = check_litert_precision(precision)
    options = (options or DecodeOptions()).replace(**settings)
    with export_lock(os.path.abspath(directory)):  # one writer, refused before the (long) conversion
        _check_destination(directory, overwrite)
        target = vocabulary_files(vocab_dir)["target"]  # refused before the conversion
        data = convert(model, config, options, (precision,), bool(target["settings"].get("language_last")))[precision]
        return write_litert(data, config, options, precision, vocab_dir, directory, overwrite=overwrite,
                            provenance=provenance)


def _check_destination(directory: str | os.PathLike[str], overwrite: bool) -> None:
    check_export_destination(directory)
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        if not is_litert_model(directory):
            raise FileExistsError(f"{directory} exists and is not a LiteRT export (no {LITERT_METADATA}); not "
                                  "writing into it. Choose a new or empty folder.")
        if not overwrite:
            raise FileExistsError(f"{directory} already exists; replace it with overwrite=True (--overwrite).")


def write_litert(data: bytes, config: TransformerConfig, options: DecodeOptions, precision: str,
                 vocab_dir: str | os.PathLike[str], directory: str | os.PathLike[str], *,
                 overwrite: bool = False, provenance: dict[str, Any] | None = None) -> str:
    """Writes the folder of a converted `model.tflite` (`convert`'s bytes): written beside `directory`, loaded by
    `LiteRTTranslator` and asked to translate one sentence, and only then swapped in with its manifest
    (`exports.folder.writing_export`): an export that fails leaves the old one whole.

    Returns:
        `directory`.

    Raises:
        FileExistsError: `directory` exists and `overwrite` is False, or it is not a LiteRT export.
    """
    directory = os.fspath(directory)
    sides = vocabulary_files(vocab_dir)
    source, target = sides["source"], sides["target"]
    shared = source["folder"] == target["folder"] or (  # NLLB's two tokenizers: one model, two default languages
        pathlib.Path(source["model"]).read_bytes() == pathlib.Path(target["model"]).read_bytes()
        and source["tokens"] == target["tokens"])
    files = {side: {"sentencepiece": "sentencepiece.model" if shared else f"{side}.sentencepiece.model",
                    "vocabulary": "vocabulary.json" if shared else f"{side}.vocabulary.json"} for side in sides}
    signatures = [SEARCH_SIGNATURES["greedy"], SCORE_SIGNATURE] + (
        [SEARCH_SIGNATURES["beam"]] if options.strategy == "beam" else [])
    with export_lock(os.path.abspath(directory)):
        _check_destination(directory, overwrite)
        with writing_export(os.path.abspath(directory), precision=precision) as staging:
            (staging / LITERT_MODEL).write_bytes(data)
            for side, names in files.items():
                shutil.copyfile(sides[side]["model"], staging / names["sentencepiece"])
                if sides[side]["tokens"] is not None:  # an imported vocabulary: its tokens by id, a JSON list
                    atomic_write_text(staging / names["vocabulary"],
                                      json.dumps(sides[side]["tokens"], ensure_ascii=False) + "\n")
            metadata = _metadata(config, options, precision, files, sides, sorted(signatures), provenance)
            atomic_write_text(staging / LITERT_METADATA, json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
            atomic_write_text(staging / README_FILE, _readme(metadata, provenance))
            if provenance is not None:
                write_provenance(staging, provenance)
            LiteRTTranslator(staging, intra_threads=1).translate(["A check."])  # it loads and translates
    return directory


class LiteRTExporter(Exporter):
    """`keras-transformer export --format litert`: one model as a LiteRT folder (`export_litert`).

    Args:
        precision: "float32" (None), "float16" or "int8".

    Example:

    >>> LiteRTExporter(precision="int8").export("saved_models/multi30k_en_de", "exports/litert")  # doctest: +SKIP
    'exports/litert'
    """

    name = "litert"
    options = {"precision": "--precision"}

    def __init__(self, precision: str | None = None) -> None:
        self.precision = check_litert_precision(precision)

    def export(self, model: str | os.PathLike[str] | list[str | os.PathLike[str]], directory: str | os.PathLike[str], *,
               checkpoint: Any = None, average: int | None = None, overwrite: bool = False,
               options: DecodeOptions | None = None, **settings: Any) -> str:
        """Loads `model`'s weights (`workdir.load_models`) and writes them with `export_litert`; the decoding
        baked in is `options` (default: the model folder's) with `settings` (None values change nothing).

        Raises:
            ConfigError: an ensemble, or a model the format cannot hold (named).
        """
        paths = list(model) if isinstance(model, (list, tuple)) else [model]
        if len(paths) != 1:
            raise ConfigError(f"A LiteRT export holds one model, and {len(paths)} were given: export an ensemble as "
                              "a SavedModel instead.")
        check_export_destination(directory)
        with export_lock(directory):
            loaded = load_models(paths[0], checkpoint, average, require_vocabulary=True)
            if len(loaded.models) != 1:
                raise ConfigError(f"{paths[0]} is an ensemble of {len(loaded.models)} models; a LiteRT export holds "
                                  "one model.")
            assert loaded.vocab_dir is not None  # require_vocabulary
            settings = {key: value for key, value in settings.items() if value is not None}
            return export_litert(loaded.models[0], loaded.configs[0], loaded.vocab_dir, directory,
                                 options=options or loaded.decoding, precision=self.precision, overwrite=overwrite,
                                 provenance=read_provenance(paths[0]), **settings)

    def recorded_decoding(self, directory: str | os.PathLike[str]) -> DecodeOptions:
        """The decoding `litert.json` records."""
        return DecodeOptions.from_dict(read_metadata(directory)["decoding"])


__all__ = ["LiteRTExporter", "builtin_argmax", "check_litert_precision", "convert", "export_litert",
           "share_int8_weights",
           "signature_functions", "vocabulary_files", "write_litert"]
