"""`TransformerConfig`: the architecture of a model, all that `build_model` needs to build the same network.

Presets are data (`PRESETS`); YAML files load into the same dataclass and are
validated with messages that name the offending field. How a model is trained
(optimizer, schedule, loss) is not its architecture: those settings are the
experiment's `training:` section (`keras_transformer.experiment.TrainingSection`),
and a field of theirs given here is refused with its new place named
(`TRAINING_FIELDS`).
"""

import dataclasses
import os
import re
import typing

import yaml

from keras_transformer.errors import ConfigError, CorruptFileError
from keras_transformer.files import atomic_write_text

POSITION_KINDS = ("sinusoidal", "learned", "relative", "relative_bias")
TIE_MODES = ("all", "embeddings", "decoder", "none")
NORMALIZATIONS = ("layer", "rms")
SINUSOID_LAYOUTS = ("interleaved", "concatenated", "fairseq")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swish")
# Decoding settings that a model.yaml held among the architecture's fields until they moved to its own `decoding:`
# mapping (`keras_transformer.decoding.DecodeOptions`, `workdir.read_model_file`): `from_yaml` leaves them there.
DECODING_FIELDS = ("beam_size", "length_penalty", "max_decode_extra", "early_exit")
# Training settings that were fields of TransformerConfig until they moved to the experiment's training section
# (`experiment.TrainingSection`): refused by name wherever a model's fields are read (`refuse_training_fields`).
TRAINING_FIELDS = ("label_smoothing", "warmup_steps", "learning_rate_scale", "beta_1", "beta_2", "epsilon")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The architecture of a Transformer (Vaswani et al., 2017): all that `build_model` needs.

    Every field has a default, so a config can be written with only the fields
    that matter. Unknown fields, bad sizes and bad options raise `ValueError`
    naming the field; a training setting (`TRAINING_FIELDS`: label smoothing,
    the schedule, Adam's) raises `ConfigError` naming its place in the
    experiment's training section.

    Example:

    >>> config = TransformerConfig(vocab_size=8000, num_layers=3, d_model=256,
    ...                            num_heads=4, d_ff=1024, dropout=0.1)
    >>> config.head_dim
    64
    >>> TransformerConfig.preset("base", vocab_size=37000).d_model
    512
    """

    # --- vocabulary -----------------------------------------------------------
    vocab_size: int = 37000  # shared source/target vocabulary size (the paper's BPE has 37k)
    source_vocab_size: typing.Optional[int] = None  # separate source vocabulary; None -> vocab_size
    target_vocab_size: typing.Optional[int] = None  # separate target vocabulary; None -> vocab_size
    pad_id: int = 0  # padding id; never attended to, never in the loss
    unk_id: int = 1  # unknown-token id
    bos_id: int = 2  # the decoder's start id, its first input; never produced. May be pad_id (Marian starts from
                     # padding) or eos_id (M2M-100 / NLLB start from </s>, which the search still produces)
    eos_id: int = 3  # end-of-sequence id; decoding stops on it
    # --- architecture ---------------------------------------------------------
    num_layers: int = 6  # N, layers in the encoder and in the decoder
    num_encoder_layers: typing.Optional[int] = None  # override N for the encoder
    num_decoder_layers: typing.Optional[int] = None  # override N for the decoder
    d_model: int = 512  # width of every sub-layer output and of the embeddings
    num_heads: int = 8  # h, attention heads; d_k = d_v = d_model / h unless given below
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    key_dim: typing.Optional[int] = None  # d_k per head (Table 3 row B); None -> d_model / h
    value_dim: typing.Optional[int] = None  # d_v per head; None -> key_dim
    max_length: int = 256  # longest sequence (positions) the model accepts
    position: str = "sinusoidal"  # "sinusoidal" (paper), "learned" (Table 3 row E), "relative" (Shaw et al. 2018)
                                  # or "relative_bias" (T5's bucketed per-head biases on the self-attention logits)
    max_relative_position: int = 20  # k of position "relative": distances clipped to [-k, k] (OpenNMT-tf's 20)
    relative_attention_num_buckets: int = 32  # buckets of position "relative_bias" (T5's 32)
    relative_attention_max_distance: int = 128  # distances beyond it share the last bucket (T5's 128)
    sinusoid_layout: str = "interleaved"  # sinusoids: "interleaved" sin/cos (paper), "concatenated" (all sines,
                                          # then all cosines: Marian) or "fairseq" (sines then cosines, frequencies
                                          # 10000^(-i/(d/2-1)): tensor2tensor, fairseq, M2M-100 / NLLB)
    position_offset: int = 0  # the first token's position number (M2M-100 / NLLB count from pad_id + 1 = 2)
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (section 3.4)
    activation: str = "relu"  # FFN activation: "relu" (paper), "gelu" (erf), "gelu_tanh" or "swish" (SiLU)
    output_bias: bool = False  # a learned bias added to the logits (Marian's final_logits_bias)
    gated_feed_forward: bool = False  # FFN (act(x W1) * x V) W2: gated GELU (T5 v1.1) or ReLU
    use_bias: bool = True  # biases in the attention and feed-forward projections (T5 has none)
    norm_first: bool = False  # False: post-norm LayerNorm(x + Sublayer(x)) as the paper; True: pre-norm
    normalization: str = "layer"  # "layer" (LayerNorm) or "rms" (RMS norm: no mean, no bias; T5)
    embedding_norm: bool = False  # a LayerNorm on embeddings + positions, before their dropout (mBART's
                                  # layernorm_embedding)
    layer_norm_epsilon: float = 1e-6  # LayerNorm epsilon
    tie_embeddings: str = "all"  # "all" (src+tgt+softmax, shared vocab), "embeddings" (src+tgt), "decoder"
                                 # (tgt+softmax), "none"
    scale_decoder_output: bool = False  # multiply the decoder output by d_model ** -0.5 (T5's tied softmax)
    use_rezero: bool = False  # ReZero: scale each sub-layer output by a learned scalar that starts at 0
    scale_attention_logits: bool = True  # divide QK^T by sqrt(d_k) (the "scaled" in scaled dot-product)
    attention_window: typing.Optional[int] = None  # restricted self-attention: attend within +-r positions
    # --- regularization -------------------------------------------------------
    dropout: float = 0.1  # P_drop on embeddings+PE and on every sub-layer output
    attention_dropout: float = 0.0  # dropout on attention weights
    ffn_dropout: float = 0.0  # dropout on the ReLU activations inside the FFN

    def __new__(cls, *args: typing.Any, **fields: typing.Any) -> "TransformerConfig":
        refuse_training_fields(fields, "TransformerConfig")  # before the dataclass's __init__ names it "unexpected"
        return super().__new__(cls)

    def __post_init__(self) -> None:
        # Accept booleans for tie_embeddings: True -> "all", False -> "none".
        if isinstance(self.tie_embeddings, bool):
            object.__setattr__(self, "tie_embeddings", "all" if self.tie_embeddings else "none")
        self.validate()

    # ------------------------------------------------------------------ derived
    @property
    def encoder_layers(self) -> int:
        """Number of encoder layers."""
        return self.num_encoder_layers if self.num_encoder_layers is not None else self.num_layers

    @property
    def decoder_layers(self) -> int:
        """Number of decoder layers."""
        return self.num_decoder_layers if self.num_decoder_layers is not None else self.num_layers

    @property
    def src_vocab_size(self) -> int:
        """Source vocabulary size."""
        return self.source_vocab_size if self.source_vocab_size is not None else self.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        """Target vocabulary size."""
        return self.target_vocab_size if self.target_vocab_size is not None else self.vocab_size

    @property
    def head_dim(self) -> int:
        """d_k, the per-head key (and query) size."""
        return self.key_dim if self.key_dim is not None else self.d_model // self.num_heads

    @property
    def head_value_dim(self) -> int:
        """d_v, the per-head value size."""
        return self.value_dim if self.value_dim is not None else self.head_dim

    # --------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raises `ValueError` naming the first invalid field."""
        positive = ["vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_length",
                    "max_relative_position", "relative_attention_num_buckets", "relative_attention_max_distance"]
        optional_positive = ["source_vocab_size", "target_vocab_size", "num_encoder_layers",
                             "num_decoder_layers", "key_dim", "value_dim", "attention_window"]
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}.")
        if isinstance(self.position_offset, bool) or not isinstance(self.position_offset, int) or \
                self.position_offset < 0:
            raise ValueError(f"TransformerConfig.position_offset must be an integer >= 0, got "
                             f"{self.position_offset!r}.")
        if self.position_offset and self.position != "sinusoidal":
            raise ValueError(f"TransformerConfig.position_offset numbers sinusoids; position {self.position!r} has "
                             "none: leave it 0.")
        for name in optional_positive:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(
                    f"TransformerConfig.{name} must be a positive integer or None, got {value!r}.")
        if self.key_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerConfig: d_model={self.d_model} is not divisible by num_heads="
                f"{self.num_heads}; choose sizes with d_model % num_heads == 0 or set key_dim.")
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"TransformerConfig.{name} must be in [0, 1), got {value!r}.")
        if self.position not in POSITION_KINDS:
            raise ValueError(f"TransformerConfig.position must be one of {POSITION_KINDS}, "
                             f"got {self.position!r}.")
        for name, kinds in (("sinusoid_layout", SINUSOID_LAYOUTS), ("activation", ACTIVATIONS),
                            ("normalization", NORMALIZATIONS)):
            if getattr(self, name) not in kinds:
                raise ValueError(f"TransformerConfig.{name} must be one of {kinds}, got {getattr(self, name)!r}.")
        for name in ("scale_embeddings", "output_bias", "embedding_norm", "gated_feed_forward", "use_bias",
                     "scale_decoder_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TransformerConfig.{name} must be true or false, got {getattr(self, name)!r}.")
        if self.tie_embeddings not in TIE_MODES:
            raise ValueError(f"TransformerConfig.tie_embeddings must be one of {TIE_MODES} "
                             f"(or a bool), got {self.tie_embeddings!r}.")
        buckets, distance = self.relative_attention_num_buckets, self.relative_attention_max_distance
        if self.position == "relative_bias" and (buckets < 4 or distance <= buckets // 4):
            raise ValueError(f"TransformerConfig: relative_attention_num_buckets={buckets} and "
                             f"relative_attention_max_distance={distance} leave no logarithmic buckets; give at "
                             "least 4 buckets and a max distance beyond a quarter of them.")
        if self.tie_embeddings in ("all", "embeddings") and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"TransformerConfig.tie_embeddings={self.tie_embeddings!r} shares one matrix between source and "
                "target, "
                f"but source_vocab_size={self.src_vocab_size} != target_vocab_size={self.tgt_vocab_size}.")
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id,
                   "eos_id": self.eos_id}
        for name, value in special.items():
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < min(
                    self.src_vocab_size, self.tgt_vocab_size):
                raise ValueError(f"TransformerConfig.{name}={value!r} is outside the vocabulary.")
        # A vocabulary without a begin-of-sequence token starts the decoder from padding (bos_id == pad_id, as
        # Marian does; the decoder's first position is then never masked as padding, `build_model`) or from eos
        # (bos_id == eos_id, as M2M-100 and NLLB do; the searches still produce eos, and only a produced one ends).
        distinct = {name: value for name, value in special.items()
                    if name != "bos_id" or value not in (self.pad_id, self.eos_id)}
        if len(set(distinct.values())) != len(distinct):
            raise ValueError(f"TransformerConfig: special ids must differ (only bos_id may equal pad_id or eos_id), "
                             f"got {special}.")
        value = self.layer_norm_epsilon
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"TransformerConfig.layer_norm_epsilon must be a number, got {value!r}.")
        if value <= 0:
            raise ValueError(f"TransformerConfig.layer_norm_epsilon must be > 0, got {value!r}.")

    # ------------------------------------------------------------ construction
    @classmethod
    def preset(cls, name: str, **overrides: typing.Any) -> "TransformerConfig":
        """Returns the preset `name` ("tiny", "small", "base", "big") with `overrides` applied.

        Example:

        >>> TransformerConfig.preset("big", vocab_size=37000).num_heads
        16
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls.from_dict({**PRESETS[name], **overrides})

    @classmethod
    def from_dict(cls, values: dict[str, typing.Any]) -> "TransformerConfig":
        """Builds a config from a dict, rejecting unknown keys by name.

        Example:

        >>> TransformerConfig.from_dict({"vocab_size": 100, "d_model": 64, "num_heads": 4}).d_ff
        2048
        >>> TransformerConfig.from_dict({"vocab_size": 100, "warmup_steps": 400})
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: warmup_steps is a training setting now: write it as \
training.warmup_steps (experiment.TrainingSection).
        """
        known = {f.name for f in dataclasses.fields(cls)}
        decoding = [name for name in DECODING_FIELDS if name in values]
        if decoding:
            raise ValueError(f"{', '.join(decoding)}: decoding settings are not part of TransformerConfig; give them "
                             "in the decoding section (keras_transformer.decoding.DecodeOptions).")
        refuse_training_fields(values, "TransformerConfig")
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown TransformerConfig field(s): {', '.join(unknown)}. "
                             f"Known fields: {', '.join(sorted(known))}.")
        return cls(**values)

    def to_dict(self) -> dict[str, typing.Any]:
        """Returns the fields as a plain dict (YAML- and JSON-friendly)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: typing.Any) -> "TransformerConfig":
        """Returns a copy with `changes` applied (and validated)."""
        return self.from_dict({**self.to_dict(), **changes})

    def save_yaml(self, path: str | os.PathLike[str]) -> None:
        """Writes the config to a YAML file.

        Example:

        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "model.yaml")
        >>> TransformerConfig.preset("tiny", vocab_size=100).save_yaml(path)
        >>> TransformerConfig.from_yaml(path).d_model
        64
        """
        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> "TransformerConfig":
        """Reads a config written by `save_yaml` (or by hand), or a model folder's `model.yaml`.

        A model.yaml's decoding settings (its `decoding:` mapping) are not the architecture's:
        `workdir.checkpoints.read_model_file` reads them.
        """
        values = {key: value for key, value in read_yaml_file(path, "TransformerConfig fields").items()
                  if key != "decoding"}
        if not any(name in values for name in DECODING_FIELDS):  # those first: `from_dict` names them
            refuse_training_fields(values, str(path))
        return cls.from_dict(values)


def refuse_training_fields(values: typing.Mapping[str, typing.Any], where: str = "model") -> None:
    """Refuses the first of `TRAINING_FIELDS` in `values`, a model's fields, naming its place in the experiment's
    training section; `where` names what holds them ("model" for an experiment's section, a model.yaml's path).

    Raises:
        ConfigError: one line, e.g. "model.label_smoothing is a training setting now: write it as
            training.label_smoothing".

    Example:

    >>> refuse_training_fields({"d_model": 64})
    >>> refuse_training_fields({"d_model": 64, "beta_2": 0.98})
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: model.beta_2 is a training setting now: write it as training.beta_2.
    """
    moved = [name for name in TRAINING_FIELDS if name in values]
    if not moved:
        return
    name = moved[0]
    if where == "model":
        raise ConfigError(f"model.{name} is a training setting now: write it as training.{name}.")
    if where == "TransformerConfig":
        raise ConfigError(f"{name} is a training setting now: write it as training.{name} "
                          "(experiment.TrainingSection).")
    raise ConfigError(f"{where}: {name} is a training setting now, not the model's: remove it from this file (an "
                      f"experiment gives it as training.{name}).")


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers such as `1e-9` and `5e-4` as floats (YAML 1.2), not as strings."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def read_yaml_file(path: str | os.PathLike[str], what: str = "settings") -> dict[str, typing.Any]:
    """The mapping a YAML file written by the package holds (a model.yaml, an experiment.yaml).

    Raises:
        CorruptFileError: the file is not YAML, or not a mapping (the message names it and what to do).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.yaml"
    >>> _ = path.write_text("d_model: [64")
    >>> read_yaml_file(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_transformer.errors.CorruptFileError: .../model.yaml is not valid YAML (...): ...
    """
    try:
        with open(path, encoding="utf-8") as f:
            values = load_yaml(f)
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        problem = " ".join(str(error).split())[:200]
        raise CorruptFileError(f"{path} is not valid YAML ({problem}): {_RESTORE}") from None
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise CorruptFileError(f"{path} does not hold a mapping of {what} (it holds a {type(values).__name__}): "
                               f"{_RESTORE}")
    return values


_RESTORE = ("restore it from a copy, or write it again: a training workdir's model.yaml is the model section of "
            "its experiment.yaml (`TransformerConfig.save_yaml`), an export's comes with the export (export again).")


def load_yaml(stream: typing.Any) -> typing.Any:
    """Reads YAML as `yaml.safe_load` does, except that `1e-9` is a float, as a config author means it.

    PyYAML follows YAML 1.1, whose floats need a dot (`1.0e-9`); `1e-9` would
    arrive as the string "1e-9". Every config file and `--set` value goes through here.

    Example:

    >>> load_yaml("learning_rate_scale: 1e-9\\nepsilon: 1.0e-09\\nname: 1e9x")
    {'learning_rate_scale': 1e-09, 'epsilon': 1e-09, 'name': '1e9x'}
    """
    return yaml.load(stream, Loader=_YamlLoader)


# The paper's Table 3 "base" and "big", plus two sizes that train on a laptop CPU.
PRESETS = {
    "tiny": dict(num_layers=2, d_model=64, num_heads=4, d_ff=256, dropout=0.1, max_length=128),
    "small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1),
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
    "big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
}
# The warm-up each preset is trained with: an experiment's training.warmup_steps when it leaves it null
# (`recommended_warmup_steps`). The tiny model's few updates peak sooner; the others take the paper's 4000.
PAPER_WARMUP_STEPS = 4000
PRESET_WARMUP_STEPS = {"tiny": 400, "small": PAPER_WARMUP_STEPS, "base": PAPER_WARMUP_STEPS,
                       "big": PAPER_WARMUP_STEPS}


def recommended_warmup_steps(preset: str | None = None) -> int:
    """The Noam warm-up (in updates) a model of `preset` trains with when the experiment gives none: the preset's
    (`PRESET_WARMUP_STEPS`), or the paper's 4000 for a model of no preset.

    Example:

    >>> recommended_warmup_steps("tiny"), recommended_warmup_steps("base"), recommended_warmup_steps(None)
    (400, 4000, 4000)
    """
    return PRESET_WARMUP_STEPS.get(preset, PAPER_WARMUP_STEPS) if preset is not None else PAPER_WARMUP_STEPS
