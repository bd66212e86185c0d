"""The decoding strategies: each name and the module of `keras_transformer.decoding` whose `decode` runs it.

Adding a strategy is its module plus one line here (docs/decoding.md, "Adding a strategy").
"""

STRATEGIES = {
    "beam": "beam",
    "greedy": "greedy",
    "sample": "sampling",
}
