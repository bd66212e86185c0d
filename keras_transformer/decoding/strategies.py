"""Each decoding strategy's settings: which `DecodeOptions` fields it reads, their checks, its n-best default and
its one-line description, and where its search is.

`DecodeOptions` knows no strategy by name: it asks the strategy registered under `options.strategy`
(`decoding.registry.STRATEGIES`) for all of this. A strategy is a `Strategy` subclass; its search (the function
`decode(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None, row_keys=None,
target_prefix=None)`) is imported the first time it decodes. The three strategies of the package keep their
settings here and their searches in `beam`, `greedy` and `sampling`, because the command line and the CTranslate2
engine check options without importing Keras; a strategy of your own may be one module with both
(docs/decoding.md, "Adding a strategy"). Standard library only.

Example:

>>> Sampling.settings
('top_k', 'top_p', 'temperature', 'seed')
>>> Sampling.check_settings({"top_p": 1.5})
Traceback (most recent call last):
...
keras_transformer.errors.ConfigError: decoding.top_p must be in (0, 1] (1: no cut), got 1.5.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from keras_transformer.errors import ConfigError

# The largest seed: seeds are mixed as 32-bit integers inside the search.
MAX_SEED = 2**31 - 1


def is_run_time_value(value: object) -> bool:
    """True for a tensor (a SavedModel signature's input, known only when it runs): not checked here; the
    search clips it to its range. Python and numpy numbers are checked.

    Example:

    >>> is_run_time_value(0.9), is_run_time_value("0.9")
    (False, False)
    """
    return not isinstance(value, (numbers.Number, str, type(None))) and hasattr(value, "dtype")


def is_integer(value: object) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A Python or numpy real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# The rules every entry point applies to these two settings: `DecodeOptions` (ConfigError, for a config or a
# request) and the search functions called directly (`decoding.search.check_options`, ValueError).
ALPHA = ("alpha (the length-penalty exponent)", "a finite number >= 0 (0: plain log-probability)")
MAX_EXTRA = ("max_extra (output tokens allowed beyond the source length)", "an integer >= 0")


def valid_alpha(value: Any) -> bool:
    """A finite number >= 0 (the GNMT length-penalty exponent; 0 ranks by log-probability)."""
    return is_number(value) and math.isfinite(value) and value >= 0


def require(valid: bool, where: str, name: str, requirement: str, value: Any) -> None:
    """Raises `ConfigError("{where}{name} must be {requirement}, got {value!r}.")` unless `valid`."""
    if not valid:
        raise ConfigError(f"{where}{name} must be {requirement}, got {value!r}.")


class Strategy:
    """One decoding strategy: the `DecodeOptions` fields it reads, how they are checked, and its search.

    A subclass sets `name` (its key in `STRATEGIES`), `search` (its decode function, or `"module:function"`
    imported on first use), `settings` (the `DecodeOptions` fields it alone reads; every strategy reads
    `max_extra` and `n_best`) and overrides what differs from a strategy returning one hypothesis per draw.

    Attributes:
        exclusive: its settings are refused under another strategy unless they keep their defaults (a sampling
            setting with beam search is a mistake, not a preference carried over). Whether exclusive or not, a
            strategy's settings given to `DecodeOptions.replace` choose it (`options.chosen_strategy`).
        random: the strategy draws at random (a `seed` then matters; `DecodeOptions.sampling`).
    """

    name: ClassVar[str] = ""
    search: ClassVar[str | Callable[..., Any]] = ""
    settings: ClassVar[tuple[str, ...]] = ()
    exclusive: ClassVar[bool] = False
    random: ClassVar[bool] = False

    @classmethod
    def check_settings(cls, values: Mapping[str, Any], where: str = "decoding.") -> None:
        """Raises `ConfigError` naming the first of `values` (this strategy's settings, each optional) out of its
        range, as `{where}{name}`; a tensor (`is_run_time_value`) is taken as it is where the search clips it."""

    @classmethod
    def check(cls, options: Any) -> None:
        """Raises `ConfigError` where `options`, this strategy's, combine settings it cannot honour."""

    @classmethod
    def default_n_best(cls, options: Any) -> int:
        """How many hypotheses an n-best request returns per sentence when `n_best` is not set."""
        return 1

    @classmethod
    def adopt(cls, values: dict[str, Any]) -> dict[str, Any]:
        """`values`, the fields of options of another strategy switched to this one (`DecodeOptions.replace`),
        with what this strategy cannot take reset."""
        return values

    @classmethod
    def describe(cls, options: Any) -> list[str]:
        """The settings that matter, `"name value"` each, for `DecodeOptions.describe`."""
        return [f"max_extra {options.max_extra}"]

    @classmethod
    def decode_function(cls) -> Callable[..., Any]:
        """The search: `decode(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None,
        row_keys=None, target_prefix=None, constraints=None, banned=None) -> (tokens (B, R, T), scores (B, R))`,
        its module imported now; the engines add `start_from_prefix=True` for a model whose decoder starts from
        each target prefix's first token (mBART-large-cc25), and only then."""
        if callable(cls.search):
            return cls.search
        module, _, function = cls.search.partition(":")
        return getattr(importlib.import_module(module), function)


class BeamSearch(Strategy):
    """The paper's beam search (`decoding.beam`): `beam_size` hypotheses, the GNMT length penalty `alpha`,
    and `early_exit`, OpenNMT's and CTranslate2's stopping rule."""

    name = "beam"
    search = "keras_transformer.decoding.beam:decode"
    settings = ("beam_size", "alpha", "early_exit")

    @classmethod
    def check_settings(cls, values: Mapping[str, Any], where: str = "decoding.") -> None:
        if "beam_size" in values:
            value = values["beam_size"]
            require(is_integer(value) and value >= 1, where, "beam_size", "an integer >= 1", value)
        if "early_exit" in values:
            value = values["early_exit"]
            require(isinstance(value, bool), where, "early_exit", "true or false", value)
        if "alpha" in values:
            value = values["alpha"]
            require(valid_alpha(value), where, *ALPHA, value)

    @classmethod
    def check(cls, options: Any) -> None:
        if options.n_best is not None and options.n_best > options.beam_size:
            raise ConfigError(f"decoding.n_best={options.n_best} is more than decoding.beam_size="
                              f"{options.beam_size}: beam search returns at most beam_size hypotheses.")

    @classmethod
    def default_n_best(cls, options: Any) -> int:
        return int(options.beam_size)

    @classmethod
    def describe(cls, options: Any) -> list[str]:
        shown = [f"beam_size {options.beam_size}", f"alpha {options.alpha}", f"max_extra {options.max_extra}"]
        return shown + ([f"early_exit {options.early_exit}"] if options.early_exit else [])


class GreedySearch(Strategy):
    """The most probable token at every step (`decoding.greedy`): one hypothesis per sentence."""

    name = "greedy"
    search = "keras_transformer.decoding.greedy:decode"

    @classmethod
    def check(cls, options: Any) -> None:
        if options.n_best is not None and options.n_best != 1:
            raise ConfigError(f"decoding.n_best must be 1 with strategy 'greedy' (one hypothesis), got "
                              f"{options.n_best}: beam search returns several (strategy 'beam', decoding.beam_size "
                              f">= {options.n_best}).")

    @classmethod
    def adopt(cls, values: dict[str, Any]) -> dict[str, Any]:
        return {**values, "n_best": None}  # one hypothesis, whatever the other strategy returned


class Sampling(Strategy):
    """Each token drawn from the model's distribution (`decoding.sampling`), reshaped by `temperature`, cut to
    the `top_k` most probable tokens and to the nucleus `top_p`, the draws made reproducible by `seed`. Its
    settings may be tensors: a SavedModel's `sample` signature takes them as inputs."""

    name = "sample"
    search = "keras_transformer.decoding.sampling:decode"
    settings = ("top_k", "top_p", "temperature", "seed")
    exclusive = True
    random = True

    @classmethod
    def check_settings(cls, values: Mapping[str, Any], where: str = "decoding.") -> None:
        given = {name: value for name, value in values.items() if not is_run_time_value(value)}
        if "top_k" in given:
            value = given["top_k"]
            require(is_integer(value) and value >= 0, where, "top_k", "an integer >= 0", value)
        if "seed" in given:
            value = given["seed"]
            require(is_integer(value) and value >= 0, where, "seed", "an integer >= 0", value)
            require(value <= MAX_SEED, where, "seed", f"at most {MAX_SEED}", value)
        if "top_p" in given:
            value = given["top_p"]
            require(is_number(value) and 0 < value <= 1, where, "top_p", "in (0, 1] (1: no cut)", value)
        if "temperature" in given:
            value = given["temperature"]
            require(is_number(value) and math.isfinite(value) and value > 0, where, "temperature",
                    "a finite number > 0", value)

    @classmethod
    def describe(cls, options: Any) -> list[str]:
        return [f"temperature {options.temperature}", f"top_k {options.top_k}", f"top_p {options.top_p}",
                f"seed {options.seed}", f"max_extra {options.max_extra}"]


# The settings of strategy "sample" only; a SavedModel's `sample` signature takes them as inputs.
SAMPLING_FIELDS = Sampling.settings
