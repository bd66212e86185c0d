"""`DecodeOptions`: how to decode, in one validated object from the config and the command line to every engine.

The experiment's `decoding:` section, the `decoding:` mapping of a model folder's
`model.yaml`, the command line's decoding arguments, `Translator`, the SavedModel
export and the CTranslate2 export all take this one object. It imports nothing
but the standard library, so the command line checks it before TensorFlow loads.
"""

import dataclasses
import typing
from collections.abc import Mapping

from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.decoding.strategies import (
    Strategy,
    is_integer,
    is_run_time_value,
    require,
)
from keras_transformer.errors import ConfigError

# Names an older config or model.yaml used, and the field each is now.
OLD_NAMES = {"length_penalty": "alpha", "max_decode_extra": "max_extra"}


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
        """Raises `ConfigError` naming the first bad field: the strategy checks the settings it reads."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"decoding.strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}.")
        require(is_integer(self.max_extra) and self.max_extra >= 0, "decoding.", "max_extra", "an integer >= 0",
                self.max_extra)
        for strategy in _strategies():  # every field is well-formed, whichever strategy reads it
            strategy.check_settings({name: getattr(self, name) for name in strategy.settings})
        if self.n_best is not None:
            require(is_integer(self.n_best) and self.n_best >= 1, "decoding.", "n_best",
                    "a positive integer or null", self.n_best)
        self.strategy_class().check(self)
        defaults = _defaults()
        for other in _strategies():
            if other.name == self.strategy or not other.exclusive:
                continue
            for name in other.settings:
                if is_run_time_value(getattr(self, name)) or getattr(self, name) != defaults[name]:
                    raise ConfigError(f"decoding.{name} applies to strategy {other.name!r} only (this is "
                                      f"{self.strategy!r}); set decoding.strategy: {other.name} (--strategy "
                                      f"{other.name}) to {other.name}.")

    def strategy_class(self) -> type[Strategy]:
        """The registered `Strategy` of `strategy`: its settings, checks and search."""
        return STRATEGIES.get(self.strategy)

    def returned(self) -> int:
        """How many hypotheses an n-best request returns per sentence: `n_best`, or its default."""
        if self.n_best is not None:
            return self.n_best
        return self.strategy_class().default_n_best(self)

    @property
    def sampling(self) -> bool:
        """True when the strategy draws at random."""
        return self.strategy_class().random

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
        if "strategy" not in changes:  # a setting only one strategy takes chooses it
            owners = [other.name for other in _strategies() if other.exclusive and set(other.settings) & set(changes)]
            if owners:
                changes["strategy"] = owners[0]
        values = self.to_dict()
        target = changes.get("strategy", values["strategy"])
        defaults = _defaults()
        for other in _strategies():
            if other.exclusive and other.name != target:
                values.update({name: defaults[name] for name in other.settings})
        if target in STRATEGIES:
            values = STRATEGIES.get(target).adopt(values)
        return DecodeOptions.from_dict({**values, **changes})

    def describe(self) -> str:
        """The settings that matter for the strategy, as one line (for logs and reports).

        Example:

        >>> DecodeOptions().describe()
        'beam: beam_size 4, alpha 0.6, max_extra 50'
        >>> DecodeOptions(strategy="sample", top_p=0.9, seed=3).describe()
        'sample: temperature 1.0, top_k 0, top_p 0.9, seed 3, max_extra 50'
        """
        return f"{self.strategy}: " + ", ".join(self.strategy_class().describe(self))


def _strategies() -> list[type[Strategy]]:
    """Every registered strategy, in registration order."""
    return [STRATEGIES.get(name) for name in STRATEGIES]


def _defaults() -> dict[str, typing.Any]:
    """Each `DecodeOptions` field's default."""
    return {field.name: field.default for field in dataclasses.fields(DecodeOptions)}
