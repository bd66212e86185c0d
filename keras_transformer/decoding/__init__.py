"""Decoding a `build_model` Transformer: beam search, greedy decoding, sampling, and forced-decode scoring.

One module per strategy, each behind the same function::

    decode(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None, row_keys=None,
           target_prefix=None)
        -> (tokens int32 (B, R, T), scores float32 (B, R))

with `options` a `DecodeOptions` and `R = options.returned()`; `target_prefix`, int `(B, P)` padded,
forces each sentence's first output tokens (`search.target_prefix_ids`; docs/decoding.md, "Target
prefixes"). `STRATEGIES` (`registry`) maps each name to its module: adding a strategy is its module
plus one line there (docs/decoding.md, "Adding a strategy"). What every strategy shares (the
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

import importlib

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES

# The public functions and the module of this package that defines each.
_DEFINED_IN = {
    "beam_search": "beam", "top_k_by_blocks": "beam",
    "greedy_decode": "greedy",
    "sample": "sampling",
    "score": "scoring",
    "FIRST_CACHE_STAGE": "search", "cache_stages": "search", "check_options": "search",
    "ensemble_members": "search", "length_penalty": "search", "max_positions": "search", "output_limits": "search",
    "target_prefix_ids": "search",
}


def strategy(name):
    """The `decode` function of the strategy called `name` (a key of `STRATEGIES`).

    Example:

    >>> strategy("beam").__module__
    'keras_transformer.decoding.beam'
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown decoding strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}.")
    return importlib.import_module(f"{__name__}.{STRATEGIES[name]}").decode


def __getattr__(name):
    if name in _DEFINED_IN:
        return getattr(importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_DEFINED_IN])


__all__ = ["STRATEGIES", "DecodeOptions", "strategy", *sorted(_DEFINED_IN)]
