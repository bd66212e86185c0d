"""The TensorFlow engine's per-sentence details and token counts: `Translator.details_batch`,
`Translator.n_best_details_batch` and `Translator.count_source_tokens` (`engines.details`,
`TranslatorInterface.translate_detailed` and `n_best_detailed`).

`details_batch` runs the search `translate` runs (`n_best_details_batch`, that of `n_best`), in a graph of its own
that also returns each hypothesis's length (its tokens up to and including eos: a prefix's and a language token's
counted, as the length penalty counts them), so that its score gives the log-probability of exactly the tokens
generated.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from keras_transformer.engines.details import Translation
from keras_transformer.engines.tensorflow_graph import valid_utf8

# Per translator, its details graphs (by target prefixes or not, and hypotheses returned), traced on first use.
# The graphs hold the translator weakly, so the cache never keeps a translator alive.
_GRAPHS: weakref.WeakKeyDictionary[Any, dict[tuple[bool, int], Any]] = weakref.WeakKeyDictionary()


def _hypotheses(translator: Any, sentences: tf.Tensor, prefixes: tf.Tensor | None = None,
                num_return: int = 1) -> dict[str, tf.Tensor]:
    """The `num_return` best hypotheses of each sentence: their texts (`[N * R]`, sentence by sentence), scores
    and lengths (`[N, R]`; int32, eos counted, pad not)."""
    target = translator.target_tokenizer
    forced = None if prefixes is None else translator.encode_prefixes(prefixes)
    tokens, scores = translator.translate_ids(translator.encode_sources(sentences), num_return=num_return,
                                              target_prefix=forced)  # (N, R, T): the tokens, eos, then pad
    flat = tf.reshape(tokens, [-1, tf.shape(tokens)[2]])
    return {"translation": valid_utf8(target.detokenize(flat)), "score": scores,
            "tokens": tf.reduce_sum(tf.cast(tf.not_equal(tokens, target.pad_id), tf.int32), axis=2)}


def _graph(translator: Any, prefixed: bool, num_return: int) -> Any:
    """The translator's details graph (`_hypotheses`), without or with prefixes, traced once."""
    graphs = _GRAPHS.setdefault(translator, {})
    key = (prefixed, num_return)
    if key not in graphs:
        held = weakref.ref(translator)
        strings = tf.TensorSpec([None], tf.string)
        if prefixed:
            graphs[key] = tf.function(lambda sentences, prefixes: _hypotheses(held(), sentences, prefixes, num_return),
                                      autograph=False, input_signature=[strings, strings])
        else:
            graphs[key] = tf.function(lambda sentences: _hypotheses(held(), sentences, None, num_return),
                                      autograph=False, input_signature=[strings])
    return graphs[key]


def n_best_details_batch(translator: Any, texts: list[str], prefixes: list[str] | None = None,
                         num_return: int | None = None) -> list[list[Translation]]:
    """Per cleaned, non-blank text, its `num_return` (None: the translator's `returned()`) best translations as
    `details.Translation`s (`n_best_detailed` calls it): the texts and scores `n_best` gives, and the tokens
    generated; with `prefixes`, each starting with its prefix (checked first, as `translate_batch` checks them)."""
    inputs = [tf.constant([text.encode("utf-8") for text in texts], tf.string)]
    if prefixes is not None:
        translator.target_prefix_ids(prefixes)  # a bad prefix is named here, before any graph runs
        inputs.append(tf.constant([text.encode("utf-8") for text in prefixes], tf.string))
    count = translator.returned() if num_return is None else int(num_return)
    result = _graph(translator, prefixes is not None, count)(*inputs)
    alpha, strings = translator.scoring_alpha, result["translation"].numpy()
    scores, tokens = result["score"].numpy(), result["tokens"].numpy()
    return [[Translation.from_score(strings[i * count + r].decode("utf-8"), float(scores[i, r]), int(tokens[i, r]),
                                    alpha) for r in range(count)] for i in range(len(texts))]


def details_batch(translator: Any, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
    """Per cleaned, non-blank text, its best translation as a `details.Translation` (`translate_detailed` calls
    it): the text and score `translate` gives, and the tokens generated; with `prefixes`, each starting with its
    prefix (checked first, as `translate_batch` checks them)."""
    return [row[0] for row in n_best_details_batch(translator, texts, prefixes, 1)]


def count_source_tokens(translator: Any, text: str) -> int:
    """The tokens the translator's source tokenizer makes of `text`, without eos and without the language token
    a multilingual tokenizer puts first on its own (what it makes of ""), for `translate_document`'s budget."""
    ids = translator.source_tokenizer.tokenize(tf.constant([text.encode("utf-8"), b""], tf.string))
    if isinstance(ids, tf.RaggedTensor):
        lengths = ids.row_lengths().numpy()
    else:
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, translator.source_tokenizer.pad_id), tf.int32), 1).numpy()
    return max(0, int(lengths[0]) - int(lengths[1]))
