"""CTranslate2 export: the same weights as a CTranslate2 model folder, and a translator that serves it.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is a C++ inference engine
for Transformers; on a CPU it decodes faster than the SavedModel and can run in
int8. It is an optional dependency (the ``ctranslate2`` extra,
``pip install ".[ctranslate2]"``): this module imports ``ctranslate2`` and ``sentencepiece`` inside the functions
that need them. Exporting reads a Keras model, so this module imports Keras (and
with it TensorFlow); serving does not: `CTranslate2Translator` lives in
`keras_transformer.engines.ctranslate2`, which imports neither, so a serving
process needs only ``ctranslate2``, ``sentencepiece`` and ``numpy`` (the export's
README names that module).

How the model's weights map onto CTranslate2's ``TransformerSpec``, and what CTranslate2 cannot hold, is
`exports.ctranslate2_spec`'s; this module adds the vocabularies (SentencePiece pieces as CTranslate2's
tokens; WordPiece vocabularies are refused), the decoding defaults and the checked, swapped-in folder.

Decoding with `CTranslate2Translator` follows `keras_transformer.decoding`:
CTranslate2 has no GNMT length penalty, so it is asked for its `beam_size` best
hypotheses with their plain log-probabilities (``length_penalty=0``), and they
are reranked by log P / ((5 + |Y|) / 6) ** alpha, |Y| counting the eos token, the
package's own rule. Each sentence may produce at most its source length (eos
included) + `max_extra` tokens, as in `decoding.output_limits`.
"""

import datetime
import json
import logging
import os
import shutil
from typing import Any

from keras_transformer.config import TransformerConfig
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.ctranslate2 import (
    FORMAT,
    FORMAT_VERSION,
    PRECISIONS,
    CTranslate2Translator,
    check_precision,
    is_ctranslate2_model,
    read_metadata,
)
from keras_transformer.errors import ConfigError
from keras_transformer.exports import Exporter
from keras_transformer.exports.ctranslate2_spec import build_spec, check_ctranslate2_support
from keras_transformer.exports.folder import export_lock, writing_export
from keras_transformer.files import atomic_write_text
from keras_transformer.workdir.checkpoints import load_models
from keras_transformer.workdir.layout import CTRANSLATE2_METADATA, check_export_destination
from keras_transformer.workdir.provenance import provenance_card, provenance_summary, read_provenance, write_provenance

README_FILE = "README.md"
PAD_TOKEN = "<blank>"  # CTranslate2's (and OpenNMT's) padding token
_TOKENIZER_FORMAT = "keras_transformer.SubwordTokenizer"  # tokenizer.json of keras_transformer.data.tokenizers
_TOKENIZER_CONFIG = "tokenizer.json"
_MAPPED_FORMAT = "keras_transformer.MappedTokenizer"  # tokenizer.json of an imported vocabulary (MappedTokenizer)
_RESERVED = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}


# ---------------------------------------------------------------------- vocabularies


def _tokenizer_folders(vocab_dir: str | os.PathLike[str]) -> dict[str, str]:
    """`{"source": folder, "target": folder}` of a `save_tokenizers` folder (shared or separate)."""
    vocab_dir = os.fspath(vocab_dir)
    if os.path.isfile(os.path.join(vocab_dir, _TOKENIZER_CONFIG)):
        return {"source": vocab_dir, "target": vocab_dir}
    folders = {side: os.path.join(vocab_dir, side) for side in ("source", "target")}
    if all(os.path.isfile(os.path.join(f, _TOKENIZER_CONFIG)) for f in folders.values()):
        return folders
    raise FileNotFoundError(f"No vocabulary at {vocab_dir}: expected {_TOKENIZER_CONFIG} (shared vocabulary) or "
                            f"source/ and target/ folders holding one, as keras_transformer.data.tokenizers."
                            "save_tokenizers writes them (an export keeps them in assets.extra/vocab).")


def _read_settings(folder: str | os.PathLike[str]) -> dict[str, Any]:
    with open(os.path.join(folder, _TOKENIZER_CONFIG), encoding="utf-8") as handle:
        return json.load(handle)


def _is_mapped(folder: str | os.PathLike[str]) -> bool:
    """Whether a tokenizer folder holds a `MappedTokenizer` (an imported vocabulary: pieces numbered by vocab.json)."""
    return _read_settings(folder).get("format") == _MAPPED_FORMAT


def mapped_vocabulary(folder: str | os.PathLike[str]) -> tuple[str, list[str]]:
    """The SentencePiece model file and the tokens by id of an imported (`MappedTokenizer`) vocabulary folder.

    Its tokens are the CTranslate2 vocabulary as they are (the checkpoint's own, its ``<pad>`` included): the
    export gives CTranslate2 pieces, which it numbers by that list, as CTranslate2's own Marian converter does.

    Example:

    >>> model_file, tokens = mapped_vocabulary("runs/opus_en_de/data/vocab/source")  # doctest: +SKIP
    >>> tokens[:2]  # doctest: +SKIP
    ['</s>', '<unk>']
    """
    settings = _read_settings(folder)
    model_file = os.path.join(folder, settings["model_file"])
    vocabulary = os.path.join(folder, settings["vocabulary_file"])
    for path in (model_file, vocabulary):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Tokenizer file {path} named in {os.path.join(folder, _TOKENIZER_CONFIG)} is "
                                    "missing.")
    with open(vocabulary, encoding="utf-8") as handle:
        mapping = json.load(handle)
    tokens: list[Any] = [None] * len(mapping)
    for token, index in mapping.items():
        tokens[index] = token
    return model_file, tokens


def _language_settings(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """A `MappedTokenizer` folder's language tokens, its default language, the special tokens it drops and the
    tokens it cuts out of the text wherever they stand."""
    settings = _read_settings(folder)
    return {"languages": list(settings.get("languages", [])), "language": settings.get("language"),
            "special_tokens": list(settings.get("special_tokens", [])),
            "split_tokens": list(settings.get("split_tokens", [])),
            # mBART-large-cc25: tokens </s> [src_lang], the decoder started from the target prefix's language
            **({"language_last": True} if settings.get("language_last") else {})}


def _sentencepiece_file(folder: str | os.PathLike[str]) -> str:
    """The SentencePiece model file of a tokenizer folder, after checking its tokenizer.json."""
    path = os.path.join(folder, _TOKENIZER_CONFIG)
    settings = _read_settings(folder)
    if settings.get("format") != _TOKENIZER_FORMAT:
        raise ValueError(f"{path} does not describe a keras_transformer tokenizer (format={settings.get('format')!r}).")
    if settings.get("model_type") == "wordpiece":
        raise ValueError(f"CTranslate2 export: {path} is a WordPiece vocabulary; CTranslate2 export supports "
                         "SentencePiece vocabularies only (WordPiece output also needs post-processing).")
    reserved = {name: settings.get(name) for name in _RESERVED}
    if reserved != _RESERVED:
        raise ValueError(f"{path} has reserved ids {reserved}; keras_transformer needs {_RESERVED}.")
    model_file = os.path.join(folder, settings["model_file"])
    if not os.path.isfile(model_file):
        raise FileNotFoundError(f"Tokenizer file {model_file} named in {path} is missing.")
    return model_file


def vocabulary_tokens(sentencepiece_file: str | os.PathLike[str]) -> list[str]:
    """The CTranslate2 vocabulary of a SentencePiece model: its pieces by id, id 0 renamed ``<blank>``.

    Args:
        sentencepiece_file: path of a ``sentencepiece.model`` with the package's
            reserved ids (pad 0, unk 1, bos 2, eos 3).

    Returns:
        A list of str, one token per id.

    Example:

    >>> path = "saved_models/multi30k_en_de/assets.extra/vocab/sentencepiece.model"
    >>> tokens = vocabulary_tokens(path)  # doctest: +SKIP
    >>> tokens[:4]  # doctest: +SKIP
    ['<blank>', '<unk>', '<s>', '</s>']
    """
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=os.fspath(sentencepiece_file))
    tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    tokens[_RESERVED["pad_id"]] = PAD_TOKEN
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{sentencepiece_file}: the pieces are not unique once id 0 is named {PAD_TOKEN!r}.")
    return tokens


# ---------------------------------------------------------------------- export


def _search_text(decoding: dict[str, Any], tokens: dict[str, str], limit: str) -> str:
    """The README's ctranslate2 call and what to do with its result, for the recorded strategy."""
    options = DecodeOptions.from_dict(decoding)
    eos = tokens["eos"]
    if options.strategy == "beam":
        return f"""```python
result = translator.translate_batch([tokens], beam_size={options.beam_size}, num_hypotheses={options.beam_size},
                                    length_penalty=0, return_scores=True, return_end_token=True,
                                    min_decoding_length=0, max_decoding_length={limit})
```

Rank the hypotheses as keras_transformer does: CTranslate2 has no GNMT length penalty, so ask for the
`{options.beam_size}` best with plain log-probabilities (`length_penalty=0`) and rescore each as
`score / ((5 + n) / 6) ** {options.alpha}`, where `n` counts the hypothesis tokens including the end token `{eos}`
(`return_end_token=True`). Decode the best with `sp.decode(...)` after dropping `{eos}`."""
    if options.strategy == "greedy":
        return f"""```python
result = translator.translate_batch([tokens], beam_size=1, return_end_token=True,
                                    min_decoding_length=0, max_decoding_length={limit})
```

Decode the hypothesis with `sp.decode(...)` after dropping `{eos}`."""
    return f"""```python
result = translator.translate_batch([tokens], beam_size=1, sampling_topk={options.top_k or 0},
                                    sampling_topp={options.top_p}, sampling_temperature={options.temperature},
                                    return_end_token=True, min_decoding_length=0, max_decoding_length={limit})
```

(`CTranslate2Translator` seeds the draws with the recorded seed.) Decode with `sp.decode(...)` after dropping
`{eos}`."""


def _readme(metadata: dict[str, Any], provenance: dict[str, Any] | None = None) -> str:
    precision = metadata.get("precision") or metadata["quantization"] or "float32"
    decoding = metadata["decoding"]
    files = metadata["sentencepiece"]
    tokens = metadata["special_tokens"]
    tokenizer = (f"`{files['source']}`" if files["source"] == files["target"]
                 else f"`{files['source']}` (source) and `{files['target']}` (target)")
    specials = ", ".join(f"{name} {metadata['special_ids'][f'{name}_id']} `{tokens[name]}`"
                         for name in ("pad", "bos", "eos", "unk"))
    limit = f"len(tokens) + 1 + {decoding['max_extra']}"
    origin = "" if provenance is None else f"\n{provenance_card(provenance)}\n"  # source, licence, hashes
    what = ("A Transformer trained with keras_transformer" if provenance is None else
            "A Transformer imported with keras_transformer" if not provenance.get("fine_tuned") else
            "A Transformer imported and fine-tuned with keras_transformer")
    return f"""# CTranslate2 model exported by keras_transformer

{what}, converted to the CTranslate2 format
(`model.bin`, `config.json`, vocabularies) by `keras_transformer.exports.ctranslate2.export_ctranslate2`
on {metadata['exported']} with ctranslate2 {metadata['ctranslate2_version']}. Precision: {precision} (weights stored
as CTranslate2's `{precision}` compute type, which `CTranslate2Translator` loads with; `manifest.json` records it too).
SentencePiece model: {tokenizer}. `{CTRANSLATE2_METADATA}` records the settings below.
{origin}
## Translate with keras_transformer

```python
from keras_transformer.engines.ctranslate2 import CTranslate2Translator
translator = CTranslate2Translator("this/folder")          # compute_type="int8", intra_threads=4, ...
translator(["A man rides a bike."])
```

That module imports neither TensorFlow nor Keras: `ctranslate2`, `sentencepiece` and `numpy` are all it needs.
It tokenizes with SentencePiece, decodes with {DecodeOptions.from_dict(decoding).describe()} (at most source length
with eos + {decoding['max_extra']} tokens), and returns one line per input (empty or whitespace-only input gives "").

## Translate with ctranslate2 alone

```python
import ctranslate2, sentencepiece
sp = sentencepiece.SentencePieceProcessor(model_file="this/folder/{files['source']}")
translator = ctranslate2.Translator("this/folder", device="cpu", compute_type="{precision}")
tokens = [sp.id_to_piece(i) for i in sp.encode("A man rides a bike.")]
```

{_search_text(decoding, tokens, limit)}

Special ids (the target vocabulary's, `special_ids` in `{CTRANSLATE2_METADATA}`): {specials}. The source end token
`{tokens['eos']}` is added by CTranslate2 (`add_source_eos`). A source keeps at most its first
{metadata['max_source_length'] - 1} pieces.
"""


def export_ctranslate2(model: Any, config: TransformerConfig, vocab_dir: str | os.PathLike[str],
                       directory: str | os.PathLike[str], *,
                       options: DecodeOptions | None = None, quantization: str | None = None,
                       precision: str | None = None, overwrite: bool = False,
                       provenance: dict[str, Any] | None = None, **settings: Any) -> str:
    """Writes `model` as a CTranslate2 model folder that `CTranslate2Translator` (or ctranslate2 alone) loads.

    The folder holds CTranslate2's ``model.bin``, ``config.json`` and
    vocabulary, the SentencePiece model(s), ``keras_transformer.json`` (format,
    decoding defaults, special ids, file names; `is_ctranslate2_model` reads
    it), a ``README.md`` on loading it and a ``manifest.json`` (the size and
    SHA-256 of every file). It is written into a temporary folder beside
    `directory`, loaded and asked to translate one sentence, and only then
    swapped in (`exports.folder.writing_export`, as a SavedModel export is): an
    export that fails or is killed on the way leaves the old one whole, and a
    second export to the same folder meanwhile is refused.

    Args:
        model: a `build_model(config)` model with its trained weights.
        config: its `TransformerConfig`.
        vocab_dir: the SentencePiece vocabulary folder as `save_tokenizers`
            writes it (a training run's ``data/vocab``, an export's ``assets.extra/vocab``).
        directory: the folder to create.
        options: the `DecodeOptions` recorded for the translator (default:
            `DecodeOptions()`); `settings` (`beam_size=5`, `alpha=1.0`, `strategy="sample"`, ...)
            replace its fields. CTranslate2's beam search stops by its own rule, so
            `early_exit` is recorded as true, with a warning where the options say false.
        precision: CTranslate2's compute type of the export (`engines.ctranslate2.PRECISIONS`; None: float32):
            the weights are quantized to it in ``model.bin`` (CTranslate2's converter ``quantization``),
            ``keras_transformer.json`` and ``manifest.json`` record it, and `CTranslate2Translator` loads with
            it. A type CTranslate2 cannot run on this CPU is refused (the export translates a sentence with it
            before it is swapped in). A float32 export can still run in int8 with ``compute_type="int8"``.
        quantization: the older name of `precision` (either one, or both the same).
        overwrite: replace an existing CTranslate2 export at `directory`.
        provenance: the model's import record (`workdir.provenance`; None: trained with this package), written as
            ``imported.json`` and named in ``keras_transformer.json``, the manifest and the README.

    Returns:
        `directory`.

    Raises:
        ValueError: a feature CTranslate2 cannot run, named; a vocabulary of the wrong size or kind.
        FileExistsError: `directory` exists and `overwrite` is False, or it is not an export of this kind.
        ConfigError: `directory` is or lies in a training workdir.

    Example:

    >>> from keras_transformer.inference import load_translator  # doctest: +SKIP
    >>> translator = load_translator("saved_models/multi30k_en_de")  # doctest: +SKIP
    >>> config = TransformerConfig.from_yaml("saved_models/multi30k_en_de/assets.extra/model.yaml")  # doctest: +SKIP
    >>> export_ctranslate2(translator.model, config, "saved_models/multi30k_en_de/assets.extra/vocab",
    ...                    "ct2/multi30k_en_de")  # doctest: +SKIP
    'ct2/multi30k_en_de'
    """
    precision = _precision(precision, quantization)
    import ctranslate2  # noqa: F401  (not installed: refused here, before the folder is looked at)

    directory = os.fspath(directory)
    check_export_destination(directory)
    with export_lock(os.path.abspath(directory)):  # one writer per export folder, for the whole export
        if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
            if not is_ctranslate2_model(directory):
                raise FileExistsError(f"{directory} exists and is not a keras_transformer CTranslate2 export "
                                      f"(no {CTRANSLATE2_METADATA}); not writing into it. Choose a new or empty "
                                      "folder.")
            if not overwrite:
                raise FileExistsError(f"{directory} already exists; replace it with overwrite=True (--overwrite).")
        check_ctranslate2_support(config)
        vocabulary = _Vocabulary(vocab_dir)
        spec = build_spec(model, config, vocabulary.tokens["source"], vocabulary.tokens["target"],
                          vocabulary.mapped and "language_last" in _language_settings(vocabulary.folders["target"]))
        spec.validate()
        spec.optimize(quantization=None if precision == "float32" else precision)
        models, names = vocabulary.models, vocabulary.names
        metadata = _metadata(config, vocabulary, _decoding_record(options, settings), precision, provenance)
        # Written and checked beside `directory`, then swapped in: the old export serves until the new one works.
        with writing_export(os.path.abspath(directory), precision=precision) as staging_folder:
            staging = os.fspath(staging_folder)
            spec.save(staging)
            for side, path in models.items():
                shutil.copyfile(path, os.path.join(staging, names[side]))
            atomic_write_text(os.path.join(staging, CTRANSLATE2_METADATA), json.dumps(metadata, indent=2) + "\n")
            atomic_write_text(os.path.join(staging, README_FILE), _readme(metadata, provenance))
            if provenance is not None:
                write_provenance(staging, provenance)
            CTranslate2Translator(staging).translate(["A check."])  # it loads and translates, or this raises
    return directory


class _Vocabulary:
    """The SentencePiece model(s) of a vocabulary folder as the export copies them: `models` (side -> file),
    `tokens` (side -> CTranslate2's token list), `names` (side -> file name in the export), `folders`, and
    `mapped` (an imported vocabulary, whose pieces are numbered by its own vocab.json)."""

    def __init__(self, vocab_dir: str | os.PathLike[str]) -> None:
        self.folders = _tokenizer_folders(vocab_dir)
        self.mapped = _is_mapped(self.folders["source"])
        if self.mapped:
            self.models, self.tokens = {}, {}
            for side, folder in self.folders.items():
                self.models[side], self.tokens[side] = mapped_vocabulary(folder)
            shared = self.models["source"] == self.models["target"]
        else:
            self.models = {side: _sentencepiece_file(folder) for side, folder in self.folders.items()}
            shared = self.folders["source"] == self.folders["target"]
            self.tokens = {side: vocabulary_tokens(path) for side, path in self.models.items()}
        self.names = ({"source": "sentencepiece.model", "target": "sentencepiece.model"} if shared
                      else {"source": "source.sentencepiece.model", "target": "target.sentencepiece.model"})


def _decoding_record(options: DecodeOptions | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The decoding options the export records (`options` with `settings` replaced), as a dict: a beam search
    with early_exit (CTranslate2's own stopping rule), with a warning where the options say otherwise."""
    decoding = (options or DecodeOptions()).replace(**settings)
    if decoding.strategy == "beam" and not decoding.early_exit:
        logging.getLogger(__name__).warning(
            "CTranslate2's beam search always stops by its own rule: the export records early_exit: true where "
            "the decoding options say false (the SavedModel keeps the exact rule; docs/serving.md, 'The "
            "rescoring rule').")
        decoding = decoding.replace(early_exit=True)
    return decoding.to_dict()


def _metadata(config: TransformerConfig, vocabulary: _Vocabulary, decoding: dict[str, Any],
              precision: str, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """``keras_transformer.json``: what `CTranslate2Translator` needs beside CTranslate2's own files."""
    import ctranslate2

    tokens, folders, mapped = vocabulary.tokens, vocabulary.folders, vocabulary.mapped
    return {
        "format": FORMAT, "version": FORMAT_VERSION,
        "exported": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "ctranslate2_version": ctranslate2.__version__,
        "quantization": None if precision == "float32" else precision,
        "precision": precision,
        "decoding": decoding,
        "length_penalty": "gnmt: score = log P / ((5 + n) / 6) ** alpha, n counting the eos token",
        "special_ids": {name: int(getattr(config, name)) for name in _RESERVED},
        # "mapped": SentencePiece pieces given to CTranslate2 as tokens (an imported vocabulary, a leading
        # >>xx<< tag one token); "ids": SentencePiece ids, the pieces of a vocabulary learned by the package
        "tokenization": "mapped" if mapped else "ids",
        "special_tokens": {"pad": tokens["target"][config.pad_id] if mapped else PAD_TOKEN,
                           "unk": tokens["target"][config.unk_id],
                           "bos": tokens["target"][config.bos_id], "eos": tokens["target"][config.eos_id]},
        "sentencepiece": vocabulary.names,
        # a multilingual imported vocabulary's language tokens: a sentence may open with one, one without
        # gets the side's language first; detokenizing drops them and the special tokens
        "languages": {side: _language_settings(folder) for side, folder in folders.items()} if mapped else {},
        "target_languages": _language_settings(folders["target"])["languages"] if mapped else [],
        "max_source_length": int(config.max_length),
        "max_target_length": int(config.max_length),
        "model_config": config.to_dict(),
        "provenance": provenance_summary(provenance),  # trained with this package, or imported from (licence)
    }


def _precision(precision: str | None, quantization: str | None,
               flags: tuple[str, str] = ("precision", "quantization")) -> str:
    """The one precision of `precision` and its older name `quantization` (float32 without either), checked."""
    if precision is not None and quantization is not None and precision != quantization:
        raise ConfigError(f"{flags[0]}={precision} and {flags[1]}={quantization} disagree: give one of them.")
    precision = precision or quantization or "float32"
    return check_precision(precision, flag=flags[0])


class CTranslate2Exporter(Exporter):
    """`keras-transformer export --format ctranslate2`: a workdir's or a SavedModel export's model as a
    CTranslate2 folder (`export_ctranslate2`), one model (CTranslate2 decodes no ensemble).

    Args:
        precision: CTranslate2's compute type of the export (`PRECISIONS`: "int8", "int8_float32", "bfloat16",
            ...; None: float32), checked against what CTranslate2 runs on this CPU at once.
        quantization: its older name (`--quantization`).

    Example:

    >>> CTranslate2Exporter(precision="int8").export("saved_models/multi30k_en_de", "exports/ct2")  # doctest: +SKIP
    'exports/ct2'
    """

    name = "ctranslate2"
    options = {"precision": "--precision", "quantization": "--quantization"}
    precisions = PRECISIONS

    def __init__(self, precision: str | None = None, quantization: str | None = None) -> None:
        self.precision = _precision(precision, quantization, ("--precision", "--quantization"))
        self.quantization = None if self.precision == "float32" else self.precision

    def export(self, model: str | os.PathLike[str] | list[str | os.PathLike[str]], directory: str | os.PathLike[str], *,
               checkpoint: Any = None, average: int | None = None, overwrite: bool = False,
               options: DecodeOptions | None = None, **settings: Any) -> str:
        """Loads `model`'s weights (`workdir.load_models`) and writes them with `export_ctranslate2`; the decoding
        recorded is `options` (default: the model folder's) with `settings` (None values change nothing).

        Raises:
            ConfigError: an ensemble, or a model the format cannot hold (the feature is named).
            WorkdirBusyError: another process is exporting to `directory` (named).
        """
        paths = list(model) if isinstance(model, (list, tuple)) else [model]
        if len(paths) != 1:
            raise ConfigError(f"CTranslate2 holds one model, and {len(paths)} were given: export an ensemble as a "
                              "SavedModel instead.")
        check_export_destination(directory)
        with export_lock(directory):  # held from the start: a second export to the same folder is refused at once
            loaded = load_models(paths[0], checkpoint, average, require_vocabulary=True)
            if len(loaded.models) != 1:
                raise ConfigError(f"{paths[0]} is an ensemble of {len(loaded.models)} models; CTranslate2 holds one "
                                  "model.")
            settings = {key: value for key, value in settings.items() if value is not None}
            assert loaded.vocab_dir is not None  # require_vocabulary
            return export_ctranslate2(loaded.models[0], loaded.configs[0], loaded.vocab_dir, directory,
                                      options=options or loaded.decoding, precision=self.precision,
                                      overwrite=overwrite, provenance=read_provenance(paths[0]), **settings)

    def recorded_decoding(self, directory: str | os.PathLike[str]) -> DecodeOptions:
        """The decoding `keras_transformer.json` records."""
        return DecodeOptions.from_dict(read_metadata(directory)["decoding"])


__all__ = ["CTranslate2Exporter", "export_ctranslate2", "mapped_vocabulary", "vocabulary_tokens"]
