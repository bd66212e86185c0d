"""The decoding strategies, each name with its `Strategy` (`decoding.strategies`): its settings and its search.

Adding a strategy is its module (a `Strategy` subclass and its search) plus one line here (docs/decoding.md,
"Adding a strategy"). Nothing here imports Keras: a strategy's search is imported when it first decodes.
"""

from keras_transformer.runtime.registry import Registry

STRATEGIES = Registry("decoding strategy")
STRATEGIES.register("beam", "keras_transformer.decoding.strategies:BeamSearch")
STRATEGIES.register("greedy", "keras_transformer.decoding.strategies:GreedySearch")
STRATEGIES.register("sample", "keras_transformer.decoding.strategies:Sampling")
