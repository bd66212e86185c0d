"""`MappedTokenizer`: a SentencePiece model whose pieces are mapped to ids through a vocabulary of their own.

Published checkpoints keep their ids apart from the SentencePiece model that
segments the text: OPUS-MT / Marian segments with ``source.spm`` (or
``target.spm``) and maps the pieces through ``vocab.json``, whose ids (eos 0,
unk 1, the pieces, pad last) are the model's; a piece missing from the
vocabulary is unk. This tokenizer does exactly that, eagerly and inside a
graph (``tensorflow_text.SentencepieceTokenizer`` with string output and a
static lookup table), so a SavedModel export still takes strings and returns
strings. It offers what `SubwordTokenizer` offers the rest of the package
(`tokenize`, `detokenize`, `id_to_piece`, `vocab_size`, the special ids,
`save` and `load`), with the special ids the vocabulary has.

A tag ``>>xx<<`` that opens a sentence (the target-language token of
multi-target OPUS-MT models) is kept as one token, looked up in the vocabulary
as it is, and the rest of the sentence is segmented, as Hugging Face's
``MarianTokenizer`` does.

Multilingual vocabularies with language tokens (M2M-100's ``__fr__``, NLLB's
``fra_Latn``) give them as `languages`: a sentence that opens with one of them
(then whitespace, or nothing) has it as its first token, and a sentence that
opens with none has the tokenizer's `language` first, where it has one (the
source language of an import: ``[src_lang] tokens </s>``, as Hugging Face's
``M2M100Tokenizer`` and ``NllbTokenizer`` encode). Detokenizing drops the
language tokens and the `special_tokens` (``<s>``, ``<mask>``), as their
``decode(..., skip_special_tokens=True)`` does. With `language_last` (mBART-large-cc25's
``MBartTokenizer``), `tokenize` still gives the language token first, and a source is
``tokens </s> [src_lang]`` (the engines put eos before the language); a target prefix's language
token starts the decoder (the searches' ``start_from_prefix``), as ``MBartTokenizer``'s
``tokens </s> [tgt_lang]`` targets do once shifted right.

A vocabulary's `split_tokens` (the added tokens of Hugging Face's tokenizers: T5's ``</s>``, ``<extra_id_0>``
and MADLAD-400's ``<2de>``) are cut out of the text wherever they stand, the longest first, and kept whole; the
text between them is segmented piece by piece, each as a sentence of its own (``"<2de>Hello"`` is ``<2de>``
then ``▁Hello``'s pieces), as ``T5Tokenizer`` (transformers 5) does.
"""

import json
import os
import re
from collections.abc import Iterable
from typing import Any

import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.data.tokenizers.subword import NamedSentencepieceTokenizer
from keras_transformer.engines.subwords import split_pattern
from keras_transformer.errors import CorruptFileError

FORMAT = "keras_transformer.MappedTokenizer"
FORMAT_VERSION = 1
MODEL_TYPE = "mapped"  # the `model_type` its tokenizer.json records
SETTINGS_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "sentencepiece.model"
VOCABULARY_FILE = "vocab.json"
SPECIAL = ("pad_id", "unk_id", "bos_id", "eos_id")
_TAG = r">>.*?<<"  # a leading language tag: `>>` up to the first `<<` (MarianTokenizer.remove_language_code)


def read_vocabulary(path: str | os.PathLike[str]) -> list[str]:
    """A ``vocab.json`` (token -> id, the ids 0..V-1 each once) as the list of tokens by id.

    Raises:
        CorruptFileError: not JSON, not a mapping of tokens to ids, or ids that are not 0..V-1 (the file named).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "vocab.json"
    >>> _ = path.write_text('{"</s>": 0, "<unk>": 1, "▁a": 2, "<pad>": 3}', encoding="utf-8")
    >>> read_vocabulary(path)
    ['</s>', '<unk>', '▁a', '<pad>']
    """
    try:
        with open(path, encoding="utf-8") as handle:
            mapping = json.load(handle)
    except (OSError, ValueError) as error:
        raise CorruptFileError(f"{path} is not a readable JSON vocabulary ({' '.join(str(error).split())[:160]}).") \
            from None
    if not isinstance(mapping, dict) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                for i in mapping.values()):
        raise CorruptFileError(f"{path} is not a vocabulary: expected a JSON mapping of tokens to integer ids.")
    tokens: list[Any] = [None] * len(mapping)  # each filled once below: the ids are 0..V-1
    for token, index in mapping.items():
        if not 0 <= index < len(tokens) or tokens[index] is not None:
            raise CorruptFileError(f"{path}: the ids must be 0..{len(tokens) - 1}, each once; {token!r} has {index}.")
        tokens[index] = token
    return tokens


class MappedTokenizer(tf.Module):
    """SentencePiece segmentation, then a vocabulary lookup: ids as a published model's vocabulary numbers them.

    Args:
        model: the serialized SentencePiece model (bytes) that segments the text.
        vocabulary: the tokens by id (a list of str); a piece not in it reads as `unk_id`.
        pad_id, unk_id, bos_id, eos_id: the special ids (bos may be the pad id or the eos id: the decoder's start).
        languages: tokens of the vocabulary that name a language; a sentence may open with one (then it is its
            first token), and detokenizing drops them.
        language: one of `languages`, put first in a sentence that opens with none (None: nothing is).
        special_tokens: more tokens of the vocabulary that detokenizing drops (pad, unk and bos always are).
        split_tokens: tokens of the vocabulary cut out of the text wherever they stand and kept whole (the
            longest first); the text around them is segmented as separate sentences.
        language_last: a source ends with its language token, after eos, and a target prefix's language token is
            the decoder's start (mBART-large-cc25); False: the language opens a sentence.
        name: the `tf.Module` name.

    Example:

    >>> import io, sentencepiece
    >>> writer = io.BytesIO()
    >>> sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(["a cat", "a hat"] * 10),
    ...     model_writer=writer, vocab_size=9, model_type="char", minloglevel=2, bos_id=-1)
    >>> pieces = ["</s>", "<unk>", "▁a", "▁", "c", "a", "t", "h", ">>fr<<", "<pad>"]
    >>> tokenizer = MappedTokenizer(writer.getvalue(), pieces, pad_id=9, unk_id=1, bos_id=9, eos_id=0)
    >>> tokenizer.tokenize([">>fr<< a cat"]).to_list()
    [[8, 3, 5, 3, 4, 5, 6]]
    >>> tokenizer.detokenize([[9, 3, 5, 3, 4, 5, 6, 0, 9]]).numpy()
    array([b'a cat'], dtype=object)
    >>> pieces = ["<s>", "<pad>", "</s>", "<unk>", "▁a", "▁", "c", "a", "t", "h", "en", "fr"]
    >>> multilingual = MappedTokenizer(writer.getvalue(), pieces, pad_id=1, unk_id=3, bos_id=2, eos_id=2,
    ...                                languages=["en", "fr"], language="en", special_tokens=["<s>"])
    >>> multilingual.tokenize(["a cat", "fr a hat"]).to_list()
    [[10, 5, 7, 5, 6, 7, 8], [11, 5, 7, 5, 9, 7, 8]]
    >>> multilingual.detokenize([[11, 5, 7, 5, 9, 7, 8, 2]]).numpy()
    array([b'a hat'], dtype=object)
    """

    def __init__(self, model: bytes, vocabulary: Iterable[str], *, pad_id: int, unk_id: int, bos_id: int, eos_id: int,
                 languages: Iterable[str] = (), language: str | None = None, special_tokens: Iterable[str] = (),
                 split_tokens: Iterable[str] = (), language_last: bool = False,
                 name: str = "mapped_tokenizer") -> None:
        super().__init__(name=name)
        if not isinstance(model, (bytes, bytearray)):
            raise TypeError(f"MappedTokenizer needs the serialized SentencePiece model as bytes, got {type(model)}.")
        self._model = bytes(model)
        self._tokens = [str(token) for token in vocabulary]
        if len(set(self._tokens)) != len(self._tokens):
            raise ValueError("MappedTokenizer: the vocabulary holds a token twice.")
        self._special = {"pad_id": int(pad_id), "unk_id": int(unk_id), "bos_id": int(bos_id), "eos_id": int(eos_id)}
        for key, value in self._special.items():
            if not 0 <= value < len(self._tokens):
                raise ValueError(f"MappedTokenizer: {key}={value} is outside the vocabulary of {len(self._tokens)}.")
        self._languages = tuple(str(token) for token in languages)
        self._language = None if language is None else str(language)
        self._special_tokens = tuple(str(token) for token in special_tokens)
        self._split_tokens = tuple(str(token) for token in split_tokens)
        index = {token: i for i, token in enumerate(self._tokens)}
        for token in self._languages + self._special_tokens + self._split_tokens:
            if token not in index:
                raise ValueError(f"MappedTokenizer: the language or special token {token!r} is not in the vocabulary.")
        if self._language is not None and self._language not in self._languages:
            raise ValueError(f"MappedTokenizer: language {self._language!r} is not one of its languages.")
        if language_last and not self._languages:
            raise ValueError("MappedTokenizer: language_last needs language tokens (languages).")
        self._language_last = bool(language_last)
        dropped = {self._special["pad_id"], self._special["bos_id"], self._special["unk_id"]}
        dropped |= {index[token] for token in self._languages + self._special_tokens}
        self._dropped = tf.constant(sorted(dropped), tf.int32)
        # a leading language token: one of `languages`, then whitespace or the end
        self._language_pattern = "(" + "|".join(re.escape(token) for token in sorted(
            self._languages, key=len, reverse=True)) + r")(\s|$)" if self._languages else None
        self._split_pattern = split_pattern(self._split_tokens) if self._split_tokens else None
        self._segmenter = NamedSentencepieceTokenizer(self._model, out_type=tf.string)
        self._vocabulary = tf.constant(self._tokens)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(self._vocabulary, tf.range(len(self._tokens), dtype=tf.int32)),
            default_value=self._special["unk_id"])

    # ------------------------------------------------------------------ properties
    pad_id = property(lambda self: self._special["pad_id"], doc="The padding id.")
    unk_id = property(lambda self: self._special["unk_id"], doc="The unknown-token id.")
    bos_id = property(lambda self: self._special["bos_id"], doc="The decoder's start id (may be the pad id).")
    eos_id = property(lambda self: self._special["eos_id"], doc="The end-of-sequence id.")

    @property
    def language_last(self) -> bool:
        """Whether a source ends with its language token (after eos) and a target prefix's starts the decoder."""
        return self._language_last

    @property
    def languages(self) -> tuple[str, ...]:
        """The language tokens a sentence may open with (a multilingual vocabulary's; () for others)."""
        return self._languages

    @property
    def language(self) -> str | None:
        """The language token put first in a sentence that opens with none, or None."""
        return self._language

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The tokens besides pad, unk, bos and the languages that detokenizing drops."""
        return self._special_tokens

    @property
    def split_tokens(self) -> tuple[str, ...]:
        """The tokens cut out of the text wherever they stand and kept whole (() for most vocabularies)."""
        return self._split_tokens

    @property
    def vocab_size(self) -> int:
        """Number of ids (use it as `TransformerConfig.vocab_size`)."""
        return len(self._tokens)

    @property
    def model_type(self) -> str:
        """``"mapped"``: SentencePiece pieces numbered by a vocabulary of their own."""
        return MODEL_TYPE

    @property
    def lowercase(self) -> bool:
        """False: the SentencePiece model carries its own normalization."""
        return False

    @property
    def tokens(self) -> list[str]:
        """The vocabulary: the token of each id, as a list of str."""
        return list(self._tokens)

    # ------------------------------------------------------------------ tokenization
    def tokenize(self, strings: Any) -> Any:
        """Sentences -> ids (a leading ``>>xx<<`` tag or language token, and each of `split_tokens`, as one token),
        without eos: `tf.RaggedTensor` int32 ``[N, None]``.

        A scalar string gives a 1-D result, as `SubwordTokenizer.tokenize` does.
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        single = strings.shape.rank == 0
        if single:
            strings = strings[tf.newaxis]
        if self._language_pattern is not None:  # a leading language token, or the tokenizer's language
            tagged = tf.strings.regex_full_match(strings, "(?s)" + self._language_pattern + ".*")  # (N,)
            rest = tf.strings.regex_replace(strings, "^" + self._language_pattern, "", replace_global=False)
            tags = tf.strings.regex_replace(strings, "(?s)^" + self._language_pattern + ".*$", r"\1")
            if self._language is not None:
                tags = tf.where(tagged, tags, self._language)
                tagged = tf.ones_like(tagged)
            rest = tf.where(tf.strings.regex_full_match(strings, "(?s)" + self._language_pattern + ".*"), rest,
                            strings)
        elif self._split_pattern is not None:  # no leading tag but the split tokens
            tagged, rest, tags = tf.zeros_like(strings, tf.bool), strings, strings
        else:
            tagged = tf.strings.regex_full_match(strings, "(?s)" + _TAG + ".*")  # (N,)
            rest = tf.strings.regex_replace(strings, "^" + _TAG, "", replace_global=False)
            tag_lengths = tf.strings.length(strings) - tf.strings.length(rest)  # bytes
            tags = tf.strings.substr(strings, tf.zeros_like(tag_lengths), tag_lengths)
        pieces = self._segment(rest)  # ragged (N, None) strings
        ids = tf.ragged.map_flat_values(self._table.lookup, pieces)
        tag_ids = tf.ragged.boolean_mask(self._table.lookup(tags)[:, tf.newaxis], tagged[:, tf.newaxis])
        ids = tf.concat([tf.cast(tag_ids, tf.int32), tf.cast(ids, tf.int32)], axis=1)
        return ids[0] if single else ids

    def _segment(self, strings: Any) -> Any:
        """SentencePiece's pieces of each string `(N,)`, each of `split_tokens` whole: ragged `(N, None)`."""
        if self._split_pattern is None:
            return self._segmenter.tokenize(strings)
        segments = tf_text.regex_split(strings, self._split_pattern, self._split_pattern)  # ragged (N, S)
        flat = segments.flat_values  # (M,): split tokens and the text between them
        whole = tf.strings.regex_full_match(flat, self._split_pattern)  # (M,)
        pieces = self._segmenter.tokenize(tf.where(whole, "", flat))  # ragged (M, None): none for a split token
        pieces = tf.concat([tf.ragged.boolean_mask(flat[:, tf.newaxis], whole[:, tf.newaxis]), pieces], axis=1)
        return segments.with_flat_values(pieces).merge_dims(1, 2)  # (N, None)

    def detokenize(self, ids: Any) -> Any:
        """Ids -> text, each row read up to its first eos; pad, bos, unk, the languages and `special_tokens` dropped.

        The tokens are joined and each ``▁`` read as a space, as ``MarianTokenizer.decode(...,
        skip_special_tokens=True)`` does (SentencePiece's ``decode_pieces``, which keeps a piece it does not know as
        it is); ids outside the vocabulary read as unk.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=self.pad_id)
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        single = ids.shape.rank == 1
        if single:
            ids = ids[tf.newaxis]
        before_eos = tf.math.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32), axis=1) == 0
        ids = tf.where((ids < 0) | (ids >= self.vocab_size), self.unk_id, ids)
        keep = before_eos & tf.logical_not(tf.reduce_any(tf.equal(ids[..., tf.newaxis], self._dropped), axis=-1))
        pieces = tf.gather(self._vocabulary, tf.ragged.boolean_mask(ids, keep))  # ragged (N, None)
        text = tf.strings.strip(tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=-1), "▁", " "))
        return text[0] if single else text

    def id_to_piece(self, ids: Any) -> Any:
        """The token of each id (any shape, or ragged), as strings."""
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(self.id_to_piece, ids)
        return tf.gather(self._vocabulary, tf.cast(tf.convert_to_tensor(ids), tf.int32))

    def sample(self, texts: Iterable[str], dropout: float, seed: int | None = None) -> list[list[int]]:
        """Subword regularization is not offered for a mapped vocabulary (its pieces are the published model's).

        Raises:
            ValueError: always, unless `dropout` is 0 (then this is `tokenize`, as lists).
        """
        if dropout:
            raise ValueError("Subword dropout (data.subword_dropout) needs a tokenizer learned by keras_transformer; "
                             "an imported vocabulary segments as its model did: set data.subword_dropout to 0.")
        return self.tokenize(list(texts)).to_list()

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike[str]) -> list[str]:
        """Writes ``tokenizer.json``, ``sentencepiece.model`` and ``vocab.json`` into `directory`; returns the paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = [os.path.join(directory, name) for name in (SENTENCEPIECE_FILE, VOCABULARY_FILE, SETTINGS_FILE)]
        with open(paths[0], "wb") as handle:
            handle.write(self._model)
        with open(paths[1], "w", encoding="utf-8") as handle:
            json.dump({token: index for index, token in enumerate(self._tokens)}, handle, ensure_ascii=False,
                      indent=0)
            handle.write("\n")
        settings = {"format": FORMAT, "version": FORMAT_VERSION, "model_type": MODEL_TYPE,
                    "model_file": SENTENCEPIECE_FILE, "vocabulary_file": VOCABULARY_FILE,
                    "vocab_size": self.vocab_size, "lowercase": False, **self._special}
        if self._languages or self._special_tokens:
            settings.update(languages=list(self._languages), language=self._language,
                            special_tokens=list(self._special_tokens))
        if self._split_tokens:
            settings.update(split_tokens=list(self._split_tokens))
        if self._language_last:
            settings["language_last"] = True
        with open(paths[2], "w", encoding="utf-8") as handle:
            json.dump(settings, handle, indent=2)
            handle.write("\n")
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "MappedTokenizer":
        """Reads what `save` wrote.

        Raises:
            FileNotFoundError: a file is missing (named).
            CorruptFileError: a file is not what it should be (named).
        """
        directory = os.fspath(directory)
        settings_path = os.path.join(directory, SETTINGS_FILE)
        try:
            with open(settings_path, encoding="utf-8") as handle:
                settings = json.load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(f"No tokenizer at {directory}: {SETTINGS_FILE} is missing.") from None
        except ValueError as error:
            raise CorruptFileError(f"{settings_path} is not valid JSON: {error}.") from None
        if settings.get("format") != FORMAT:
            raise CorruptFileError(f"{settings_path} does not describe a {FORMAT} (format={settings.get('format')!r}).")
        model_path = os.path.join(directory, settings["model_file"])
        vocabulary_path = os.path.join(directory, settings["vocabulary_file"])
        for path in (model_path, vocabulary_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"Tokenizer file {path} named in {settings_path} is missing.")
        with open(model_path, "rb") as handle:
            model = handle.read()
        tokens = read_vocabulary(vocabulary_path)
        if len(tokens) != settings.get("vocab_size"):
            raise CorruptFileError(f"{vocabulary_path} holds {len(tokens)} tokens but {settings_path} says "
                                   f"vocab_size={settings.get('vocab_size')}.")
        return cls(model, tokens, **{key: settings[key] for key in SPECIAL}, languages=settings.get("languages", ()),
                   language=settings.get("language"), special_tokens=settings.get("special_tokens", ()),
                   split_tokens=settings.get("split_tokens", ()),
                   language_last=bool(settings.get("language_last", False)))


def is_mapped_tokenizer(directory: str | os.PathLike[str]) -> bool:
    """Whether `directory`'s tokenizer.json describes a `MappedTokenizer`.

    Example:

    >>> import tempfile
    >>> is_mapped_tokenizer(tempfile.mkdtemp())
    False
    """
    try:
        with open(os.path.join(os.fspath(directory), SETTINGS_FILE), encoding="utf-8") as handle:
            return json.load(handle).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False
