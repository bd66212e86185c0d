"""`DataConfig`, the data pipeline's settings (files, vocabulary, batching), and its training corpora.

The `data:` section of an experiment (`DataSection`) holds these fields flat beside its own for text and TFDS
data; the pipeline (`keras_transformer.data.pipeline`) takes the config itself.
"""

import dataclasses
import typing

from keras_transformer.data.textfile import ERROR_MODES
from keras_transformer.experiment.validation import MODEL_TYPES, SUBWORD_DROPOUT_SIDES, is_integer


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the parallel text is and how it becomes batches.

    Every field has a default; unknown or invalid fields raise `ValueError`
    naming the field.

    Example:

    >>> config = DataConfig(train_source="train.en.gz", train_target="train.de.gz", tokens_per_batch=4096)
    >>> config.vocab_size, config.shared_vocab, config.max_length
    (10000, True, 128)
    >>> DataConfig.from_dict(config.to_dict()) == config
    True
    """

    # --- files ----------------------------------------------------------------
    train_source: typing.Optional[str] = None  # training source file, one sentence per line (plain or .gz UTF-8)
    train_target: typing.Optional[str] = None  # training target file, line-aligned with train_source
    corpora: typing.Optional[list] = None  # instead of train_source/train_target: several training corpora, each
                                           # {name, source, target, weight, max_pairs}, drawn in proportion to the
                                           # weights (max_pairs: that corpus's first N line pairs only)
    max_train_pairs: typing.Optional[int] = None  # read only the first N line pairs of train_source/train_target
                                                  # (vocabulary and training); None reads them all
    valid_source: typing.Optional[str] = None  # validation source file (optional)
    valid_target: typing.Optional[str] = None  # validation target file
    source_language: str = "en"  # language code of the source side (TFDS: its feature name; reports)
    target_language: str = "de"  # language code of the target side (TFDS: its feature name; Multi30k BLEU)
    errors: str = "strict"  # invalid UTF-8: "strict" fails with file and line, "replace" uses U+FFFD
    # --- vocabulary -----------------------------------------------------------
    tokenizer_dir: typing.Optional[str] = None  # saved tokenizers, learned from the training files if absent;
                                                # train and pack keep theirs in WORKDIR/data/vocab instead
    model_type: str = "bpe"  # SentencePiece "bpe" (joint BPE, reversible), "unigram", or "wordpiece"
    vocab_size: int = 10000  # ids incl. pad/unk/bos/eos; ~10k joint BPE is the best published Multi30k setting
    shared_vocab: bool = True  # one vocabulary for both languages (needed for tie_embeddings="all")
    lowercase: bool = False  # case-fold text before learning and tokenizing (output is then lowercase)
    vocab_sample_size: typing.Optional[int] = 1_000_000  # sentences the vocabulary is learned from, drawn uniformly
                                                         # in one pass (half per side when shared); null: every one
    subword_dropout: float = 0.0  # BPE-dropout in training: each merge skipped with this probability, anew each
                                  # pass (SentencePiece "bpe" only; 0 is off; validation and inference never sample)
    subword_dropout_sides: str = "both"  # which sides BPE-dropout samples: "both", "source" or "target"
    # --- batching -------------------------------------------------------------
    tokens_per_batch: int = 4096  # GLOBAL budget per step: <= this many source and target positions, padding incl.
    max_length: int = 128  # longest sequence in positions (tokens + bos/eos); longer pairs dropped in training
    bucket_width: int = 1  # lengths sorted as one (mixed at random in training); 1 gives the least padding
    window: int = 262144  # lines read, shuffled, sorted by length and batched together: the memory held
    cache: bool = True  # keep the padded batches of inference (validation) datasets in memory
    seed: typing.Optional[int] = None  # shuffle seed; None: a different order every run

    def __post_init__(self) -> None:
        for name in ("vocab_size", "tokens_per_batch", "max_length", "bucket_width", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"DataConfig.{name} must be a positive integer, got {value!r}.")
        if self.vocab_sample_size is not None and (not is_integer(self.vocab_sample_size)
                                                   or self.vocab_sample_size < 2):
            raise ValueError(f"DataConfig.vocab_sample_size must be an integer of at least 2 or None (every "
                             f"sentence), got {self.vocab_sample_size!r}.")
        if self.max_length < 2:
            raise ValueError(f"DataConfig.max_length must be at least 2 (bos/eos plus a token), got {self.max_length}.")
        if self.tokens_per_batch < self.max_length:
            raise ValueError(f"DataConfig.tokens_per_batch={self.tokens_per_batch} is smaller than max_length="
                             f"{self.max_length}: the longest pair would not fit in a batch.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"DataConfig.seed must be a non-negative integer or None, got {self.seed!r}.")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"DataConfig.model_type must be one of {MODEL_TYPES}, got {self.model_type!r}.")
        if (isinstance(self.subword_dropout, bool) or not isinstance(self.subword_dropout, (int, float))
                or not 0 <= self.subword_dropout < 1):
            raise ValueError("DataConfig.subword_dropout must be a probability in [0, 1), "
                             f"got {self.subword_dropout!r}.")
        if self.subword_dropout and self.model_type != "bpe":
            raise ValueError("DataConfig.subword_dropout (BPE-dropout) needs model_type 'bpe', "
                             f"got {self.model_type!r}.")
        if self.subword_dropout_sides not in SUBWORD_DROPOUT_SIDES:
            raise ValueError(f"DataConfig.subword_dropout_sides must be one of {SUBWORD_DROPOUT_SIDES}, "
                             f"got {self.subword_dropout_sides!r}.")
        if self.errors not in ERROR_MODES:
            raise ValueError(f"DataConfig.errors must be one of {ERROR_MODES}, got {self.errors!r}.")
        if (self.train_source is None) != (self.train_target is None):
            raise ValueError("DataConfig.train_source and train_target must be given together.")
        if self.max_train_pairs is not None and (not is_integer(self.max_train_pairs) or self.max_train_pairs < 1):
            raise ValueError(f"DataConfig.max_train_pairs must be a positive integer or None (every pair), got "
                             f"{self.max_train_pairs!r}.")
        if self.corpora is not None:
            if self.train_source is not None:
                raise ValueError("DataConfig.corpora replaces train_source/train_target: give one or the other.")
            if self.max_train_pairs is not None:
                raise ValueError("DataConfig.max_train_pairs caps train_source/train_target; with corpora, give "
                                 "each corpus its own max_pairs.")
            object.__setattr__(self, "corpora", _checked_corpora(self.corpora))
        if (self.valid_source is None) != (self.valid_target is None):
            raise ValueError("DataConfig.valid_source and valid_target must be given together.")

    @classmethod
    def from_dict(cls, values: dict[str, typing.Any]) -> "DataConfig":
        """Builds a config from a mapping (a YAML section), rejecting unknown keys by name.

        Example:

        >>> DataConfig.from_dict({"tokens_per_batch": 2048}).tokens_per_batch
        2048
        """
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown DataConfig fields {unknown}; known fields: {sorted(known)}.")
        return cls(**values)

    def to_dict(self) -> dict[str, typing.Any]:
        """The fields as a plain dict (for YAML).

        Example:

        >>> DataConfig().to_dict()["model_type"]
        'bpe'
        """
        return dataclasses.asdict(self)

    def training_corpora(self) -> list[dict[str, typing.Any]]:
        """The training corpora as dicts `{name, source, target, weight, max_pairs}`: `corpora`, or
        `train_source` and `train_target` as one corpus named "train" (capped by `max_train_pairs`); `[]` without
        either.

        Example:

        >>> DataConfig(train_source="a.en", train_target="a.de", max_train_pairs=5000).training_corpora()
        [{'name': 'train', 'source': 'a.en', 'target': 'a.de', 'weight': 1, 'max_pairs': 5000}]
        """
        if self.corpora is not None:
            return [dict(corpus) for corpus in self.corpora]
        if self.train_source is None:
            return []
        return [{"name": "train", "source": self.train_source, "target": self.train_target, "weight": 1,
                 "max_pairs": self.max_train_pairs}]


CORPUS_KEYS = ("name", "source", "target", "weight", "max_pairs")


def _checked_corpora(corpora: typing.Any) -> typing.Optional[list[dict[str, typing.Any]]]:
    """`data.corpora` with each corpus's weight filled in (1), or a `ValueError` naming what is wrong."""
    if not isinstance(corpora, (list, tuple)) or not corpora:
        raise ValueError(f"DataConfig.corpora must be a non-empty list of {{name, source, target, weight}} "
                         f"mappings, got {corpora!r}.")
    checked, names = [], set()
    for number, corpus in enumerate(corpora, start=1):
        where = f"DataConfig.corpora[{number - 1}]"
        if not isinstance(corpus, dict):
            raise ValueError(f"{where} must be a mapping with keys {list(CORPUS_KEYS)}, got {corpus!r}.")
        unknown = sorted(set(corpus) - set(CORPUS_KEYS))
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; a corpus has {list(CORPUS_KEYS)}.")
        for key in ("name", "source", "target"):
            if not isinstance(corpus.get(key), str) or not corpus[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string, got {corpus.get(key)!r}.")
        weight = corpus.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            raise ValueError(f"{where} ({corpus['name']}): weight must be a positive number, got {weight!r}.")
        if corpus["name"] in names:
            raise ValueError(f"{where}: the name {corpus['name']!r} is taken by an earlier corpus; names must "
                             "differ.")
        max_pairs = corpus.get("max_pairs")
        if max_pairs is not None and (not is_integer(max_pairs) or max_pairs < 1):
            raise ValueError(f"{where} ({corpus['name']}): max_pairs must be a positive integer or null (every "
                             f"pair), got {max_pairs!r}.")
        names.add(corpus["name"])
        checked.append({"name": corpus["name"], "source": corpus["source"], "target": corpus["target"],
                        "weight": weight, "max_pairs": max_pairs})
    return checked
