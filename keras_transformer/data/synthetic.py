"""Synthetic sequence-to-sequence tasks (copy, reverse) for smoke tests and the demo.

Pure numpy: usable with any Keras backend.
"""

from collections.abc import Sequence

import numpy as np

TASKS = ("copy", "reverse")


def synthetic_pairs(task: str = "copy", num_examples: int = 1000, vocab_size: int = 32, min_length: int = 3,
                    max_length: int = 10, first_token: int = 4,
                    seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Random token sequences and their copy or reversal, as lists of ids.

    Tokens are drawn from `[first_token, vocab_size)`, so the reserved ids
    (pad 0, unk 1, bos 2, eos 3) never occur inside a sequence.

    Returns:
        `(sources, targets)`: two lists of int lists.

    Example:

    >>> sources, targets = synthetic_pairs("reverse", num_examples=2, seed=1)
    >>> targets[0] == sources[0][::-1]
    True
    """
    if task not in TASKS:
        raise ValueError(f"Unknown synthetic task {task!r}; choose one of {TASKS}.")
    if not 0 < min_length <= max_length:
        raise ValueError(f"Need 0 < min_length <= max_length, got {min_length} and {max_length}.")
    if vocab_size <= first_token:
        raise ValueError(f"vocab_size={vocab_size} leaves no room for tokens after the reserved ids.")
    rng = np.random.default_rng(seed)
    sources, targets = [], []
    for _ in range(num_examples):
        length = int(rng.integers(min_length, max_length + 1))
        tokens = rng.integers(first_token, vocab_size, size=length).tolist()
        sources.append(tokens)
        targets.append(tokens if task == "copy" else tokens[::-1])
    return sources, targets


def make_arrays(sources: Sequence[list[int]], targets: Sequence[list[int]], pad_id: int = 0, bos_id: int = 2,
                eos_id: int = 3) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Pads pairs into the model's training arrays.

    Returns:
        `(inputs, labels)`: `inputs = {"source": (N, S), "target": (N, T)}` where
        source = tokens + eos, target = bos + tokens (decoder input), and
        labels = tokens + eos; all int32, padded with `pad_id`.

    Example:

    >>> inputs, labels = make_arrays([[5, 6]], [[6, 5]])
    >>> inputs["source"].tolist(), inputs["target"].tolist(), labels.tolist()
    ([[5, 6, 3]], [[2, 6, 5]], [[6, 5, 3]])
    """
    source_length = max(len(s) for s in sources) + 1
    target_length = max(len(t) for t in targets) + 1
    source = np.full((len(sources), source_length), pad_id, dtype="int32")
    target = np.full((len(targets), target_length), pad_id, dtype="int32")
    labels = np.full((len(targets), target_length), pad_id, dtype="int32")
    for i, (s, t) in enumerate(zip(sources, targets)):
        source[i, : len(s) + 1] = s + [eos_id]
        target[i, : len(t) + 1] = [bos_id] + t
        labels[i, : len(t) + 1] = t + [eos_id]
    return {"source": source, "target": target}, labels
