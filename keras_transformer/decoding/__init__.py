"""Decoding a `build_model` Transformer: beam search, greedy decoding, sampling, and forced-decode scoring.

One module per strategy, each behind the same function::

    decode(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None, row_keys=None,
           target_prefix=None)
        -> (tokens int32 (B, R, T), scores float32 (B, R))

with `options` a `DecodeOptions` and `R = options.returned()`; `target_prefix`, int `(B, P)` padded,
forces each sentence's first output tokens (`search.target_prefix_ids`; docs/decoding.md, "Target
prefixes"). `STRATEGIES` (`registry`) maps each name to its `Strategy` (`strategies`: the settings it reads,
their checks, its search): adding a strategy is its module plus one line there (docs/decoding.md, "Adding a
strategy"). What every strategy shares (the
cached decoder step, the search loop, the length limits, ensembles) is in
`search`; `scoring` is forced decoding.

The functions are imported on first use, so reading `STRATEGIES` or building
`DecodeOptions` imports no Keras (the command line checks its arguments before
TensorFlow loads).

Example:

>>> sorted(STRATEGIES)
['beam', 'greedy', 'sample']
>>> DecodeOptions(strategy="greedy").returned()
1
"""

from collections.abc import Callable
from typing import Any

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.runtime.registry import Registry

# The public functions, each with where it is defined (imported on first use).
_PUBLIC = Registry("name of keras_transformer.decoding")
_PUBLIC.register("beam_search", "keras_transformer.decoding.beam:beam_search")
_PUBLIC.register("top_k_by_blocks", "keras_transformer.decoding.beam:top_k_by_blocks")
_PUBLIC.register("greedy_decode", "keras_transformer.decoding.greedy:greedy_decode")
_PUBLIC.register("sample", "keras_transformer.decoding.sampling:sample")
_PUBLIC.register("score", "keras_transformer.decoding.scoring:score")
_PUBLIC.register("pad_constraints", "keras_transformer.decoding.constraints:pad_constraints")
_PUBLIC.register("constraints_met", "keras_transformer.decoding.constraints:constraints_met")
_PUBLIC.register("Glossary", "keras_transformer.decoding.glossary:Glossary")
_PUBLIC.register("term_ids", "keras_transformer.decoding.glossary:term_ids")
_PUBLIC.register("FIRST_CACHE_STAGE", "keras_transformer.decoding.search:FIRST_CACHE_STAGE")
_PUBLIC.register("cache_stages", "keras_transformer.decoding.search:cache_stages")
_PUBLIC.register("check_options", "keras_transformer.decoding.search:check_options")
_PUBLIC.register("ensemble_members", "keras_transformer.decoding.search:ensemble_members")
_PUBLIC.register("length_penalty", "keras_transformer.decoding.search:length_penalty")
_PUBLIC.register("max_positions", "keras_transformer.decoding.search:max_positions")
_PUBLIC.register("output_limits", "keras_transformer.decoding.search:output_limits")
_PUBLIC.register("target_prefix_ids", "keras_transformer.decoding.search:target_prefix_ids")


def strategy(name: str) -> Callable[..., Any]:
    """The search function of the strategy called `name` (a key of `STRATEGIES`).

    Example:

    >>> strategy("beam").__module__
    'keras_transformer.decoding.beam'
    """
    return STRATEGIES.get(name).decode_function()


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return _PUBLIC.get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = ["STRATEGIES", "DecodeOptions", "strategy", *sorted(_PUBLIC)]
