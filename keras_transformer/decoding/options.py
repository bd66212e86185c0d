"""`DecodeOptions`: how to decode, in one validated object from the config and the command line to every engine.

The experiment's `decoding:` section, the `decoding:` mapping of a model folder's
`model.yaml`, the command line's decoding arguments, `Translator`, the SavedModel
export and the CTranslate2 export all take this one object. It imports nothing
but the standard library, so the command line checks it before TensorFlow loads.
"""

import dataclasses
import math
import typing
from collections.abc import Mapping

from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.errors import ConfigError

# Names an older config or model.yaml used, and the field each is now.
OLD_NAMES = {"length_penalty": "alpha", "max_decode_extra": "max_extra"}

# The settings of strategy "sample" only; a SavedModel's `sample` signature takes them as inputs.
SAMPLING_FIELDS = ("top_k", "top_p", "temperature", "seed")

# The largest seed: seeds are mixed as 32-bit integers inside the search.
MAX_SEED = 2**31 - 1


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_run_time_value(value: object) -> bool:
    """True for a tensor (a SavedModel signature's input, known only when it runs): not checked here; the
    search clips it to its range.

    Example:

    >>> is_run_time_value(0.9), is_run_time_value("0.9")
    (False, False)
    """
    return not isinstance(value, (bool, int, float, str, type(None))) and hasattr(value, "dtype")


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How to decode: the strategy and its settings (frozen, validated at construction).

    `beam` is the paper's beam search (`beam_size`, `alpha`, `early_exit`);
    `greedy` takes the most probable token at every step; `sample` draws each
    token from the model's distribution, reshaped by `temperature`, cut to the
    `top_k` most probable tokens and to the smallest set of tokens whose
    probability reaches `top_p` (the nucleus), with `seed` making the draws
    reproducible: a sentence's samples depend only on the seed, its position in
    the request and the model, never on the batch it was decoded in.
    `n_best` hypotheses come back per sentence where asked for (beam: the best
    ones, at most `beam_size`; sample: that many independent draws; greedy: 1).

    Errors name the field as `decoding.FIELD`, the config section it comes from.

    Example:

    >>> DecodeOptions().returned(), DecodeOptions(strategy="sample", n_best=3, seed=7).returned()
    (4, 3)
    >>> DecodeOptions.from_dict({"length_penalty": 1.0, "max_decode_extra": 20})
    DecodeOptions(strategy='beam', beam_size=4, alpha=1.0, max_extra=20, early_exit=False, n_best=None, ...)
    >>> DecodeOptions(strategy="beam", top_k=10)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: decoding.top_k applies to strategy 'sample' only (this is 'beam'); ...
    """

    strategy: str = "beam"  # how tokens are chosen: beam search (the paper), greedy, or sampling
    beam_size: int = 4  # beam: hypotheses kept per sentence (paper: 4; 1 chooses tokens as greedy does)
    alpha: float = 0.6  # beam: GNMT length-penalty exponent, lp(Y) = ((5 + |Y|) / 6) ** alpha (paper: 0.6)
    max_extra: int = 50  # every strategy: at most source length + this many output tokens (paper: 50)
    early_exit: bool = False  # beam: also stop a sentence by OpenNMT's/CTranslate2's rule (docs/decoding.md)
    n_best: typing.Optional[int] = None  # hypotheses returned by n-best requests; null: beam_size (beam), 1 (others)
    top_k: int = 0  # sample: draw among the k most probable tokens only (0: no cut)
    top_p: float = 1.0  # sample: draw within the nucleus of probability top_p (1.0: no cut)
    temperature: float = 1.0  # sample: divide the logits by this before drawing (> 0; toward 0: greedy)
    seed: int = 0  # sample: the draws' seed (same seed, same request: same samples)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises `ConfigError` naming the first bad field."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"decoding.strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}.")
        for name, low in (("beam_size", 1), ("max_extra", 0), ("top_k", 0), ("seed", 0)):
            value = getattr(self, name)
            if name in SAMPLING_FIELDS and is_run_time_value(value):
                continue
            if not _is_integer(value) or value < low:
                raise ConfigError(f"decoding.{name} must be an integer >= {low}, got {value!r}.")
        if not is_run_time_value(self.seed) and self.seed > MAX_SEED:
            raise ConfigError(f"decoding.seed must be at most {MAX_SEED}, got {self.seed}.")
        if not isinstance(self.early_exit, bool):
            raise ConfigError(f"decoding.early_exit must be true or false, got {self.early_exit!r}.")
        if not _is_number(self.alpha) or not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError(f"decoding.alpha (the length-penalty exponent) must be a finite number >= 0 "
                              f"(0: plain log-probability), got {self.alpha!r}.")
        if not is_run_time_value(self.top_p) and (not _is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise ConfigError(f"decoding.top_p must be in (0, 1] (1: no cut), got {self.top_p!r}.")
        if not is_run_time_value(self.temperature) and (
                not _is_number(self.temperature) or not (math.isfinite(self.temperature) and self.temperature > 0)):
            raise ConfigError(f"decoding.temperature must be a finite number > 0, got {self.temperature!r}.")
        if self.n_best is not None:
            if not _is_integer(self.n_best) or self.n_best < 1:
                raise ConfigError(f"decoding.n_best must be a positive integer or null, got {self.n_best!r}.")
            if self.strategy == "beam" and self.n_best > self.beam_size:
                raise ConfigError(f"decoding.n_best={self.n_best} is more than decoding.beam_size={self.beam_size}: "
                                  "beam search returns at most beam_size hypotheses.")
            if self.strategy == "greedy" and self.n_best != 1:
                raise ConfigError(f"decoding.n_best must be 1 with strategy 'greedy' (one hypothesis), "
                                  f"got {self.n_best}; sample for several.")
        if self.strategy != "sample":
            defaults = DecodeOptions.__dataclass_fields__
            for name in SAMPLING_FIELDS:
                if is_run_time_value(getattr(self, name)) or getattr(self, name) != defaults[name].default:
                    raise ConfigError(f"decoding.{name} applies to strategy 'sample' only (this is "
                                      f"{self.strategy!r}); set decoding.strategy: sample (--strategy sample) "
                                      "to sample.")

    def returned(self) -> int:
        """How many hypotheses an n-best request returns per sentence: `n_best`, or its default."""
        if self.n_best is not None:
            return self.n_best
        return self.beam_size if self.strategy == "beam" else 1

    @property
    def sampling(self) -> bool:
        """True when the strategy draws at random."""
        return self.strategy == "sample"

    # ------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, values: Mapping[str, typing.Any] | None, where: str = "decoding") -> "DecodeOptions":
        """Builds options from a mapping, taking the old names (`length_penalty`, `max_decode_extra`) too.

        Unknown keys are refused by name; `where` names the mapping in errors.

        Example:

        >>> DecodeOptions.from_dict({"strategy": "sample", "top_p": 0.9}).top_p
        0.9
        """
        values = dict(values or {})
        for old, new in OLD_NAMES.items():
            if old in values:
                if new in values:
                    raise ConfigError(f"{where}: {old} is the old name of {new}; give one of them, not both.")
                values[new] = values.pop(old)
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"Unknown {where} field(s): {', '.join(unknown)}. Known fields: {', '.join(known)}.")
        return cls(**values)

    def to_dict(self) -> dict[str, typing.Any]:
        """The fields as a plain dict (YAML- and JSON-friendly)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def replace(self, **changes: typing.Any) -> "DecodeOptions":
        """A copy with `changes` applied (and validated); `None` values change nothing (an option not given).

        Giving a sampling setting (`top_k`, `top_p`, `temperature`, `seed`) without a strategy chooses
        `sample`, as the command line's `--sampling-*` arguments do.

        Example:

        >>> DecodeOptions().replace(beam_size=5, alpha=None).beam_size
        5
        >>> DecodeOptions().replace(top_k=10).strategy
        'sample'
        """
        changes = {name: value for name, value in changes.items() if value is not None}
        sampling = set(SAMPLING_FIELDS) & set(changes)
        if sampling and "strategy" not in changes:
            changes["strategy"] = "sample"
        values = self.to_dict()
        if changes.get("strategy", values["strategy"]) != "sample":
            values.update(top_k=0, top_p=1.0, temperature=1.0, seed=0)
        if changes.get("strategy", values["strategy"]) == "greedy":
            values["n_best"] = None
        return DecodeOptions.from_dict({**values, **changes})

    def describe(self) -> str:
        """The settings that matter for the strategy, as one line (for logs and reports).

        Example:

        >>> DecodeOptions().describe()
        'beam: beam_size 4, alpha 0.6, max_extra 50'
        >>> DecodeOptions(strategy="sample", top_p=0.9, seed=3).describe()
        'sample: temperature 1.0, top_k 0, top_p 0.9, seed 3, max_extra 50'
        """
        names = {"beam": ("beam_size", "alpha", "max_extra", "early_exit"),
                 "sample": ("temperature", "top_k", "top_p", "seed", "max_extra")}.get(self.strategy, ("max_extra",))
        shown = [f"{name} {getattr(self, name)}" for name in names if name != "early_exit" or self.early_exit]
        return f"{self.strategy}: " + ", ".join(shown)
