"""`SubwordTokenizer`: one subword vocabulary (SentencePiece BPE or unigram, or WordPiece), learned from
sentences or files, applied by tensorflow-text, saved and loaded (the package's docstring tells why these)."""

import hashlib
import io
import json
import os
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.python.ops import sentencepiece_tokenizer as _tf_text_sentencepiece

from keras_transformer.data.tokenizers.sampling import sample_files
from keras_transformer.errors import CorruptFileError
from keras_transformer.experiment import MODEL_TYPES

# SentencePiece's sampling seed is process-wide (`set_random_generator_seed`) and read by the worker thread an
# `encode` call starts: two seeded samples at once (the training pipeline samples source and target side by side)
# could each read the other's seed. Setting the seed and sampling under one lock makes each call repeatable.
_SEEDED_SAMPLING = threading.Lock()

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
CONFIG_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "sentencepiece.model"
WORDPIECE_FILE = "wordpiece.vocab"
WORDPIECE_RESERVED = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
_FORMAT = "keras_transformer.SubwordTokenizer"
_FORMAT_VERSION = 1


class SubwordTokenizer(tf.Module):
    """A subword tokenizer with fixed reserved ids, usable eagerly, in tf.function, tf.data and SavedModels.

    Build one with `SubwordTokenizer.train` (learn a vocabulary from
    sentences), `SubwordTokenizer.train_from_files` (from text files) or
    `SubwordTokenizer.load` (read a saved one). `tokenize` adds no bos/eos;
    the pipeline adds them. `detokenize` accepts model output as it comes
    (dense, padded, with bos/eos) and returns readable text.

    Args:
        model: a serialized SentencePiece model (bytes) for ``"bpe"`` and
            ``"unigram"``, or the list of WordPiece tokens for ``"wordpiece"``.
        model_type: ``"bpe"``, ``"unigram"`` or ``"wordpiece"``.
        lowercase: whether text is case-folded before tokenization (WordPiece
            only; a SentencePiece model carries its own normalization).
        name: the `tf.Module` name.

    Example:

    >>> tokenizer = SubwordTokenizer.train(["A man rides a bike.", "A dog runs."] * 20, vocab_size=290)
    >>> ids = tokenizer.tokenize(["A man runs."])
    >>> tokenizer.detokenize(ids).numpy()
    array([b'A man runs.'], dtype=object)
    >>> tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id
    (0, 1, 2, 3)
    """

    pad_id = PAD_ID
    unk_id = UNK_ID
    bos_id = BOS_ID
    eos_id = EOS_ID

    def __init__(self, model: bytes | Iterable[str], model_type: str = "bpe", lowercase: bool = False,
                 name: str = "subword_tokenizer") -> None:
        super().__init__(name=name)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
        self._model_type = model_type
        self._lowercase = bool(lowercase)
        if model_type == "wordpiece":
            vocabulary = [str(token) for token in model]
            if tuple(vocabulary[:4]) != WORDPIECE_RESERVED:
                raise ValueError(f"A WordPiece vocabulary must start with the reserved tokens {WORDPIECE_RESERVED} "
                                 f"(ids 0-3), got {vocabulary[:4]}.")
            self._model: Any = vocabulary  # the WordPiece tokens (list of str), or the SentencePiece model (bytes)
            self._vocab_size = len(vocabulary)
            self._tokenizer = tf_text.FastWordpieceTokenizer(
                vocab=vocabulary, token_out_type=tf.int32, unknown_token=WORDPIECE_RESERVED[UNK_ID],
                support_detokenization=True)
            self._vocabulary = tf.constant(vocabulary)
        else:
            if not isinstance(model, (bytes, bytearray)):
                raise TypeError(f"A SentencePiece tokenizer needs the serialized model as bytes, got {type(model)}.")
            self._model = bytes(model)
            self._vocab_size = _check_sentencepiece_ids(self._model)
            self._tokenizer = NamedSentencepieceTokenizer(self._model)

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """Number of ids, reserved ones included (use it as `TransformerConfig.vocab_size`)."""
        return self._vocab_size

    @property
    def model_type(self) -> str:
        """``"bpe"``, ``"unigram"`` or ``"wordpiece"``."""
        return self._model_type

    @property
    def lowercase(self) -> bool:
        """Whether text is case-folded before tokenization."""
        return self._lowercase

    # ------------------------------------------------------------------ tokenization
    def tokenize(self, strings: Any) -> Any:
        """Turns sentences into subword ids, without bos/eos.

        Args:
            strings: a string tensor ``[N]`` or a Python list of str (a scalar
                string gives a 1-D result).

        Returns:
            `tf.RaggedTensor` int32 ``[N, None]`` of ids in ``[0, vocab_size)``.

        Example:

        >>> tokenizer = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
        >>> tokenizer.tokenize(["a cat", "a hat"]).shape.as_list()
        [2, None]
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        if self._model_type == "wordpiece" and self._lowercase:
            strings = tf_text.case_fold_utf8(strings)
        ids = self._tokenizer.tokenize(strings)
        return tf.cast(ids, tf.int32)

    def detokenize(self, ids: Any) -> Any:
        """Turns ids back into text, reading each row up to its first eos.

        Pad and bos ids are dropped; everything from the first eos on is
        ignored; ids outside the vocabulary read as unk. So model output can
        be passed as it comes.

        Args:
            ids: int tensor ``[N, L]`` (dense, may hold pad/bos/eos), a
                `tf.RaggedTensor` ``[N, None]``, or a single sequence ``[L]``.

        Returns:
            string tensor ``[N]`` (a scalar for a single sequence).

        Example:

        >>> tokenizer = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
        >>> ids = tokenizer.tokenize(["a cat"]).to_tensor()
        >>> padded = tf.concat([[[tokenizer.bos_id]], ids, [[tokenizer.eos_id, 7, 0]]], axis=1)
        >>> tokenizer.detokenize(padded).numpy()
        array([b'a cat'], dtype=object)
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        single = ids.shape.rank == 1
        if single:
            ids = ids[tf.newaxis]
        before_eos = tf.math.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1) == 0
        keep = before_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
        ids = tf.where((ids < 0) | (ids >= self._vocab_size), UNK_ID, ids)
        tokens = tf.ragged.boolean_mask(ids, keep)
        text = self._tokenizer.detokenize(tokens)
        return text[0] if single else text

    def sample(self, texts: Iterable[str], dropout: float, seed: int | None = None) -> list[list[int]]:
        """BPE-dropout: tokenizes with each merge skipped at random, a regularizer for training.

        Provilkov et al. (2020): while a word is segmented, every merge that
        applies is dropped with probability `dropout`, so a word comes out in
        smaller pieces of the same vocabulary, differently on every call. The
        pieces always spell the text (``detokenize`` gives it back). Used by the
        training pipeline when `DataConfig.subword_dropout` > 0; inference
        always tokenizes deterministically (`tokenize`).

        Args:
            texts: a list of str.
            dropout: probability in ``[0, 1)`` of skipping a merge; 0 is `tokenize`.
            seed: seeds SentencePiece's sampler (process-wide) first; None keeps its state.

        Returns:
            list of lists of int ids, without bos/eos.

        Raises:
            ValueError: the tokenizer is not a SentencePiece BPE model, or `dropout` is outside ``[0, 1)``.

        Example:

        >>> tokenizer = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
        >>> [tokenizer.detokenize(ids).numpy() for ids in tokenizer.sample(["a cat"] * 2, 0.5, seed=1)]
        [b'a cat', b'a cat']
        """
        if self._model_type != "bpe":
            raise ValueError(f"BPE-dropout needs a SentencePiece 'bpe' tokenizer, this one is {self._model_type!r}.")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"BPE-dropout must be a probability in [0, 1), got {dropout!r}.")
        import sentencepiece  # the Python trainer, needed only when a vocabulary is learned or sampled
        processor = sentencepiece.SentencePieceProcessor(model_proto=self._model)  # a few ms; not kept on the module
        if dropout == 0:
            return processor.encode(list(texts))
        # One thread: SentencePiece's sampler is per thread, seeded when the thread first samples, so only a single
        # fresh worker makes a seeded call repeatable; the lock keeps another call's seed out meanwhile.
        with _SEEDED_SAMPLING:
            if seed is not None:
                sentencepiece.set_random_generator_seed(int(seed))
            return processor.encode(list(texts), enable_sampling=True, alpha=float(dropout), nbest_size=-1,
                                    num_threads=1)

    def id_to_piece(self, ids: Any) -> Any:
        """The subword string of each id (for inspecting tokenizations and labelling attention maps).

        Args:
            ids: int tensor of any shape, or a `tf.RaggedTensor` such as `tokenize` returns.

        Returns:
            string tensor of the same shape (ragged for ragged ids).

        Example:

        >>> tokenizer = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
        >>> tokenizer.id_to_piece([0, 1, 2, 3]).numpy().tolist()
        [b'<pad>', b'<unk>', b'<s>', b'</s>']
        >>> tokenizer.id_to_piece(tokenizer.tokenize(["a cat", "a"])).to_list()
        [[b'\xe2\x96\x81a', b'\xe2\x96\x81cat'], [b'\xe2\x96\x81a']]
        """
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(self.id_to_piece, ids)
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        if self._model_type == "wordpiece":
            return tf.gather(self._vocabulary, ids)
        return self._tokenizer.id_to_string(ids)

    # ------------------------------------------------------------------ learning
    @classmethod
    def train(cls, texts: Any, vocab_size: int, model_type: str = "bpe", lowercase: bool = False,
              byte_fallback: bool = True, character_coverage: float = 1.0, **options: Any) -> "SubwordTokenizer":
        """Learns a subword vocabulary from sentences in memory (`train_from_files` reads files).

        Args:
            texts: the sentences, a list of str or a `tf.data.Dataset` of
                strings. Each str is text, never a file name: one str, or a
                path object among the sentences, raises `TypeError`.
            vocab_size: number of ids including the 4 reserved ones; with
                SentencePiece byte fallback at least 4 + 256 + the number of
                distinct characters.
            model_type: ``"bpe"`` (default), ``"unigram"`` or ``"wordpiece"`` (keras-nlp's learner may
                return fewer ids than `vocab_size` on small text; check `vocab_size`).
            lowercase: case-fold the text (then detokenized text is lowercase).
            byte_fallback: SentencePiece only: spell characters outside the
                vocabulary as UTF-8 byte pieces instead of unk (exact
                reversibility). Adds 256 pieces to the vocabulary.
            character_coverage: SentencePiece only: share of characters that
                must be covered by single-character pieces (1.0: all seen).
            **options: further SentencePiece trainer options (for example
                ``input_sentence_size=2_000_000, shuffle_input_sentence=True``
                to learn from a sample of a large corpus).

        Returns:
            A new `SubwordTokenizer`.

        Raises:
            TypeError: `texts` is one str, or holds something other than str.
            ValueError: the text is too small for `vocab_size` (the message
                gives the largest size that works) or an option is invalid.

        Example:

        >>> tokenizer = SubwordTokenizer.train(["Ein Hund läuft.", "Ein Mann."] * 10, vocab_size=280)
        >>> tokenizer.vocab_size
        280
        """
        return cls.learn(sentence_list(texts, "SubwordTokenizer.train_from_files"), vocab_size, model_type=model_type,
                          lowercase=lowercase, byte_fallback=byte_fallback, character_coverage=character_coverage,
                          **options)

    @classmethod
    def train_from_files(cls, files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], vocab_size: int,
                         sample_size: int | None = None, seed: int = 0, **options: Any) -> "SubwordTokenizer":
        """Learns a subword vocabulary from text files, one sentence per line.

        Args:
            files: one path or a list of paths (str or `os.PathLike`), plain
                or gzip UTF-8; every line that is not blank is a sentence.
            vocab_size: as for `train`.
            sample_size: learn from at most this many sentences, drawn
                uniformly from all the files in one streaming pass
                (`reservoir_sample`); None: from every sentence.
            seed: the seed of that draw.
            **options: the options of `train` (``model_type``, ``lowercase``, ...).

        Returns:
            A new `SubwordTokenizer`.

        Raises:
            FileNotFoundError: a file does not exist (the message names it);
                checked for every file before any is read.
            ValueError: as for `train`.

        Example:

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "train.de"
        >>> _ = path.write_text("Ein Hund läuft.\\nEin Mann.\\n" * 10, encoding="utf-8")
        >>> SubwordTokenizer.train_from_files(path, vocab_size=280).vocab_size
        280
        >>> SubwordTokenizer.train_from_files([path, path.with_name("trian.de")], 280)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        FileNotFoundError: No such file: .../trian.de ...
        """
        return cls.learn(sample_files(files, sample_size, seed)[0], vocab_size, **options)

    @classmethod
    def learn(cls, sentences: list[str], vocab_size: int, model_type: str = "bpe", lowercase: bool = False,
              byte_fallback: bool = True, character_coverage: float = 1.0, **options: Any) -> "SubwordTokenizer":
        """`train` on a list of non-blank sentences, taken as they are (`train` checks and filters its texts;
        `train_tokenizers` learns from samples it has drawn).

        Example:

        >>> SubwordTokenizer.learn(["a cat", "a hat"] * 10, vocab_size=270).vocab_size
        270
        """
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
        if not sentences:
            raise ValueError("Cannot learn a vocabulary from no text: every sentence given is empty.")
        if model_type == "wordpiece":
            if options:
                raise ValueError(f"Unknown WordPiece options {sorted(options)}.")
            vocabulary = _learn_wordpiece(sentences, vocab_size, lowercase)
            return cls(vocabulary, model_type="wordpiece", lowercase=lowercase)
        proto = _learn_sentencepiece(sentences, vocab_size, model_type, lowercase, byte_fallback,
                                     character_coverage, options)
        return cls(proto, model_type=model_type, lowercase=lowercase)

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike[str]) -> list[str]:
        """Writes the tokenizer's files (its assets) into `directory`, creating it if needed.

        Writes ``tokenizer.json`` and ``sentencepiece.model`` (or
        ``wordpiece.vocab``); `SubwordTokenizer.load` reads them back.

        Args:
            directory: folder to write into, for example next to a checkpoint.

        Returns:
            The list of paths written.

        Example:

        >>> import tempfile
        >>> tokenizer = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270)
        >>> folder = tempfile.mkdtemp()
        >>> sorted(os.path.basename(p) for p in tokenizer.save(folder))
        ['sentencepiece.model', 'tokenizer.json']
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        if self._model_type == "wordpiece":
            model_file = WORDPIECE_FILE
            with open(os.path.join(directory, model_file), "w", encoding="utf-8") as handle:
                handle.write("".join(token + "\n" for token in self._model))
        else:
            model_file = SENTENCEPIECE_FILE
            with open(os.path.join(directory, model_file), "wb") as handle:
                handle.write(self._model)
        config = {"format": _FORMAT, "version": _FORMAT_VERSION, "model_type": self._model_type,
                  "model_file": model_file, "vocab_size": self._vocab_size, "lowercase": self._lowercase,
                  "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
        with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
            handle.write("\n")
        return [os.path.join(directory, model_file), os.path.join(directory, CONFIG_FILE)]

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "SubwordTokenizer":
        """Reads a tokenizer written by `save`.

        Args:
            directory: the folder `save` wrote.

        Returns:
            The `SubwordTokenizer`.

        Raises:
            FileNotFoundError: the folder or one of its files is missing (the
                message names the path and how to create it).
            ValueError: the files are not a keras_transformer tokenizer or
                disagree with each other.

        Example:

        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> _ = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270).save(folder)
        >>> SubwordTokenizer.load(folder).vocab_size
        270
        """
        directory = os.fspath(directory)
        config_path = os.path.join(directory, CONFIG_FILE)
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"No tokenizer at {directory}: the folder does not exist. Learn one with "
                "SubwordTokenizer.train(...).save(directory) or train_tokenizers(..., directory=...).")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(
                f"No tokenizer at {directory}: {CONFIG_FILE} is missing (found: "
                f"{sorted(os.listdir(directory)) or 'nothing'}). Learn one with "
                "SubwordTokenizer.train(...).save(directory).")
        with open(config_path, encoding="utf-8") as handle:
            try:
                config = json.load(handle)
            except json.JSONDecodeError as error:
                raise ValueError(f"{config_path} is not valid JSON: {error}.") from None
        if config.get("format") != _FORMAT:
            raise ValueError(f"{config_path} does not describe a keras_transformer tokenizer "
                             f"(format={config.get('format')!r}).")
        reserved = {name: config.get(name) for name in ("pad_id", "unk_id", "bos_id", "eos_id")}
        if reserved != {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}:
            raise ValueError(f"{config_path} has reserved ids {reserved}; keras_transformer needs pad=0, unk=1, "
                             "bos=2, eos=3.")
        model_path = os.path.join(directory, config["model_file"])
        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"Tokenizer file {model_path} named in {config_path} is missing.")
        model: list[str] | bytes
        if config["model_type"] == "wordpiece":
            with open(model_path, encoding="utf-8") as handle:
                model = handle.read().split("\n")[:-1]
        else:
            with open(model_path, "rb") as handle:
                model = handle.read()
        try:
            tokenizer = cls(model, model_type=config["model_type"], lowercase=config.get("lowercase", False))
        except ValueError as error:
            raise CorruptFileError(
                f"{model_path} is not a valid {config['model_type']} model (truncated or overwritten? "
                f"{' '.join(str(error).split())[:200]}): copy the folder {directory} again from where it was made "
                f"(a training workdir's data/vocab, an export's assets.extra/vocab), or learn the vocabulary "
                f"again.") from None
        if tokenizer.vocab_size != config["vocab_size"]:
            raise ValueError(f"{model_path} holds {tokenizer.vocab_size} ids but {config_path} says "
                             f"vocab_size={config['vocab_size']}.")
        return tokenizer


class _NamedSentencepieceResource(tf.saved_model.experimental.TrackableResource):
    """The SentencePiece model resource, created under a fixed shared name."""

    def __init__(self, model: bytes, shared_name: str) -> None:
        super().__init__()
        self._model = model
        self._shared_name = shared_name
        _ = self.resource_handle  # creates the resource now, as tensorflow-text does

    def _create_resource(self) -> Any:
        return _tf_text_sentencepiece.gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model, shared_name=self._shared_name)


class NamedSentencepieceTokenizer(tf_text.SentencepieceTokenizer):
    """``tensorflow_text.SentencepieceTokenizer`` whose model survives ``tf.random.set_seed``.

    tensorflow-text creates its model resource without a name, so it belongs
    to the op kernel and is deleted whenever the eager kernel cache is cleared:
    by ``tf.random.set_seed``, ``keras.utils.set_random_seed`` and
    ``keras.backend.clear_session`` (tensorflow/text#570). Every later call
    then fails with "Resource .../SentencepieceResource does not exist". A
    training script seeds after loading its tokenizers, so the resource is
    created here under a name derived from the model's bytes, which keeps it in
    the resource manager (also in SavedModels, whose resource initializer
    carries the name). `out_type` tf.string gives pieces instead of ids.

    Example:

    >>> import tempfile
    >>> model = SubwordTokenizer.train(["a cat", "a hat"] * 10, vocab_size=270).save(tempfile.mkdtemp())[0]
    >>> segmenter = NamedSentencepieceTokenizer(open(model, "rb").read(), out_type=tf.string)
    >>> segmenter.tokenize(["a cat"]).to_list()
    [[b'\xe2\x96\x81a', b'\xe2\x96\x81cat']]
    """

    def __init__(self, model: bytes, out_type: Any = tf.int32) -> None:
        super().__init__(model=model, out_type=out_type)
        name = "keras_transformer_sentencepiece_" + hashlib.sha256(model).hexdigest()[:32]
        self._model_resource = _NamedSentencepieceResource(model, name)


def sentence_list(texts: Any, files_function: str) -> list[str]:
    """The non-blank sentences of a list of str or a dataset of strings; `files_function` is named in errors.

    Raises:
        TypeError: `texts` is one str (or path), or holds something other than str.

    Example:

    >>> sentence_list(["A dog.", " ", "A cat."], "train_tokenizers_from_files")
    ['A dog.', 'A cat.']
    >>> sentence_list("train.en", "train_tokenizers_from_files")
    Traceback (most recent call last):
    ...
    TypeError: Sentences must be a list of str, got one str ('train.en'); to learn from files use ...
    """
    if isinstance(texts, tf.data.Dataset):
        return [text.decode("utf-8") for text in texts.as_numpy_iterator() if text.strip()]
    if isinstance(texts, (str, bytes, os.PathLike)):
        raise TypeError(f"Sentences must be a list of str, got one {type(texts).__name__} ({str(texts)[:80]!r}); "
                        f"to learn from files use {files_function}.")
    sentences = list(texts)
    for item in sentences:
        if not isinstance(item, str):
            raise TypeError(f"Sentences must be str, got {type(item).__name__} ({str(item)[:80]!r}); "
                            f"to learn from files use {files_function}.")
    return [item for item in sentences if item.strip()]


def _learn_sentencepiece(sentences: list[str], vocab_size: int, model_type: str, lowercase: bool, byte_fallback: bool,
                         character_coverage: float, options: dict[str, Any]) -> bytes:
    """Runs the SentencePiece trainer with keras_transformer's reserved ids; returns the serialized model."""
    import sentencepiece  # the trainer behind keras_nlp.tokenizers.compute_sentence_piece_proto

    writer = io.BytesIO()
    settings: dict[str, Any] = dict(vocab_size=vocab_size, model_type=model_type,
                                    normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                                    pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                                    byte_fallback=byte_fallback, character_coverage=character_coverage,
                                    num_threads=min(os.cpu_count() or 1, 16), minloglevel=2)
    settings.update(options)
    try:
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=writer,
                                                 **settings)
    except RuntimeError as error:
        message = str(error)
        limit = re.search(r"value <= (\d+)", message)
        if limit:
            raise ValueError(f"Cannot learn {vocab_size} {model_type} pieces from {len(sentences)} sentences: "
                             f"the text supports at most vocab_size={limit.group(1)}. Use a smaller vocab_size "
                             "or more text (strings are learned as sentences: to learn from files use "
                             "SubwordTokenizer.train_from_files or train_tokenizers_from_files).") from None
        raise ValueError(f"SentencePiece training failed: {message}") from None
    return writer.getvalue()


def _learn_wordpiece(sentences: list[str], vocab_size: int, lowercase: bool) -> list[str]:
    """Learns a WordPiece vocabulary with keras-nlp, reserved tokens first."""
    from keras_nlp.tokenizers import compute_word_piece_vocabulary  # heavy to import; WordPiece learning only

    data = tf.data.Dataset.from_tensor_slices(tf.constant(sentences)).batch(1024)
    return compute_word_piece_vocabulary(data, vocab_size, lowercase=lowercase,
                                         reserved_tokens=list(WORDPIECE_RESERVED))


def _check_sentencepiece_ids(model: bytes) -> int:
    """Checks a serialized SentencePiece model's reserved ids; returns its vocabulary size."""
    import sentencepiece  # the Python trainer, needed only when a vocabulary is learned

    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"Not a SentencePiece model: {error}") from None
    ids = {"pad": processor.pad_id(), "unk": processor.unk_id(), "bos": processor.bos_id(),
           "eos": processor.eos_id()}
    if ids != {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}:
        raise ValueError(f"This SentencePiece model has reserved ids {ids}; keras_transformer needs pad=0, unk=1, "
                         "bos=2, eos=3. Learn it with SubwordTokenizer.train (or the SentencePiece trainer with "
                         "pad_id=0 unk_id=1 bos_id=2 eos_id=3).")
    return processor.vocab_size()
