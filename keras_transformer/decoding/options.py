"""`DecodeOptions`: how to decode, in one validated object from the config and the command line to every engine.

The experiment's `decoding:` section, the `decoding:` mapping of a model folder's
`model.yaml`, the command line's decoding arguments, `Translator`, the SavedModel
export and the CTranslate2 export all take this one object. It imports nothing
but the standard library, so the command line checks it before TensorFlow loads.
"""

import dataclasses
import re
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

    Errors name the field as `decoding.FIELD`, the config section it comes from; `replace`'s name it as its
    caller does (`DecodeSettingsError`).

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

        The one place where given settings choose the strategy (`chosen_strategy`), for the command line's
        flags, a server request's fields and Python keywords alike: a setting of one strategy only (`beam_size`,
        `alpha`, `early_exit`; `top_k`, `top_p`, `temperature`, `seed`) chooses that strategy where this one does
        not read it. Refusals are `DecodeSettingsError`s, naming each field as it was given.

        Example:

        >>> DecodeOptions().replace(beam_size=5, alpha=None).beam_size
        5
        >>> DecodeOptions().replace(top_k=10).strategy, DecodeOptions(strategy="greedy").replace(beam_size=2).strategy
        ('sample', 'beam')
        >>> DecodeOptions(strategy="greedy").replace(strategy="greedy", beam_size=2)
        Traceback (most recent call last):
        ...
        keras_transformer.decoding.options.DecodeSettingsError: beam_size belongs to strategy 'beam' and strategy is ...
        """
        changes = {name: value for name, value in changes.items() if value is not None}
        try:
            target = chosen_strategy(changes, self.strategy) or self.strategy
            values = self.to_dict()
            defaults = _defaults()
            for other in _strategies():
                if other.exclusive and other.name != target:
                    values.update({name: defaults[name] for name in other.settings})
            if target in STRATEGIES:
                values = STRATEGIES.get(target).adopt(values)
            return DecodeOptions.from_dict({**values, **changes, "strategy": target})
        except DecodeSettingsError:
            raise
        except ConfigError as error:
            raise DecodeSettingsError(str(error)) from None

    def describe(self) -> str:
        """The settings that matter for the strategy, as one line (for logs and reports).

        Example:

        >>> DecodeOptions().describe()
        'beam: beam_size 4, alpha 0.6, max_extra 50'
        >>> DecodeOptions(strategy="sample", top_p=0.9, seed=3).describe()
        'sample: temperature 1.0, top_k 0, top_p 0.9, seed 3, max_extra 50'
        """
        return f"{self.strategy}: " + ", ".join(self.strategy_class().describe(self))


class DecodeSettingsError(ConfigError):
    """Decoding settings that `DecodeOptions.replace` refuses, in a message that names each field as its caller
    gave it: `str(error)` as a Python keyword or a JSON field (`beam_size`), `named(flags)` as the command line's
    flags (`--beam-size`).

    Example:

    >>> error = DecodeSettingsError("decoding.n_best=5 is more than decoding.beam_size=4.")
    >>> str(error), error.named({"n_best": "--n-best", "beam_size": "--beam-size"})
    ('n_best=5 is more than beam_size=4.', '--n-best=5 is more than --beam-size=4.')
    """

    def __init__(self, message: str) -> None:
        self.message = message  # fields named `decoding.FIELD`, as the config section does
        super().__init__(self.named({}))

    def named(self, names: Mapping[str, str]) -> str:
        """The message with each `decoding.FIELD` written `names[FIELD]` (the field's own name where absent)."""
        fields = "|".join(field.name for field in dataclasses.fields(DecodeOptions))
        return re.sub(rf"\bdecoding\.({fields})\b", lambda match: names.get(match[1], match[1]), self.message)


def chosen_strategy(changes: Mapping[str, typing.Any], current: str | None = None) -> str | None:
    """The strategy that given settings (`DecodeOptions` fields, None values left out) choose: `strategy` where
    given, else `current` where it reads every strategy's own setting among them, else the strategy that does
    (beam search for `beam_size`, `alpha` or `early_exit`; sampling for `top_k`, `top_p`, `temperature` or
    `seed`); None where they choose none (`max_extra`, `n_best`).

    Raises:
        DecodeSettingsError: a setting that the given `strategy` does not read, or settings of two strategies.

    Example:

    >>> chosen_strategy({"beam_size": 4, "n_best": 4}, "greedy"), chosen_strategy({"n_best": 1}, "greedy")
    ('beam', None)
    >>> chosen_strategy({"beam_size": 4, "top_p": 0.9})
    Traceback (most recent call last):
    ...
    keras_transformer.decoding.options.DecodeSettingsError: beam_size belongs to strategy 'beam' and top_p to ...
    """
    owners = {name: [strategy.name for strategy in _strategies() if name in strategy.settings]
              for name, value in changes.items() if value is not None}
    owned = [name for name, names in owners.items() if names]
    given = changes.get("strategy")
    if given is not None:
        if given not in STRATEGIES:
            return str(given)  # refused by name where the options are validated
        for name in owned:
            if name not in STRATEGIES.get(given).settings:
                raise DecodeSettingsError(f"decoding.{name} belongs to strategy {owners[name][0]!r} and "
                                          f"decoding.strategy is {given!r}: give one or the other.")
        return str(given)
    if not owned:
        return None
    if current is not None and current in STRATEGIES and set(owned) <= set(STRATEGIES.get(current).settings):
        return current
    for strategy in _strategies():
        if set(owned) <= set(strategy.settings):
            return strategy.name
    first = owned[0]
    other = next(name for name in owned if owners[first][0] not in owners[name])
    raise DecodeSettingsError(f"decoding.{first} belongs to strategy {owners[first][0]!r} and decoding.{other} to "
                              f"strategy {owners[other][0]!r}: give one strategy's settings.")


def _strategies() -> list[type[Strategy]]:
    """Every registered strategy, in registration order."""
    return [STRATEGIES.get(name) for name in STRATEGIES]


def _defaults() -> dict[str, typing.Any]:
    """Each `DecodeOptions` field's default."""
    return {field.name: field.default for field in dataclasses.fields(DecodeOptions)}
