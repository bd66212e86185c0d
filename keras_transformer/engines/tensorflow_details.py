"""The TensorFlow engine's per-sentence details and token counts: `Translator.details_batch` and
`Translator.count_source_tokens` (`engines.details`, `TranslatorInterface.translate_detailed`).

`details_batch` runs the search `translate` runs, in a graph of its own that also returns each best hypothesis's
length (its tokens up to and including eos: a prefix's and a language token's counted, as the length penalty counts
them), so that its score gives the log-probability of exactly the tokens generated.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from keras_transformer.engines.details import Translation
from keras_transformer.engines.tensorflow_graph import valid_utf8

# Per translator, its details graphs (without and with target prefixes), traced on first use. The graphs hold the
# translator weakly, so the cache never keeps a translator alive.
_GRAPHS: weakref.WeakKeyDictionary[Any, dict[bool, Any]] = weakref.WeakKeyDictionary()


def _best(translator: Any, sentences: tf.Tensor, prefixes: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
    """The best hypothesis of each sentence: its text, score and length (int32, eos counted, pad not)."""
    target = translator.target_tokenizer
    forced = None if prefixes is None else translator.encode_prefixes(prefixes)
    tokens, scores = translator.translate_ids(translator.encode_sources(sentences), num_return=1,
                                              target_prefix=forced)
    best = tokens[:, 0]  # (N, T): the tokens, eos, then pad
    return {"translation": valid_utf8(target.detokenize(best)), "score": scores[:, 0],
            "tokens": tf.reduce_sum(tf.cast(tf.not_equal(best, target.pad_id), tf.int32), axis=1)}


def _graph(translator: Any, prefixed: bool) -> Any:
    """The translator's details graph (`_best`), without or with prefixes, traced once."""
    graphs = _GRAPHS.setdefault(translator, {})
    if prefixed not in graphs:
        held = weakref.ref(translator)
        strings = tf.TensorSpec([None], tf.string)
        if prefixed:
            graphs[prefixed] = tf.function(lambda sentences, prefixes: _best(held(), sentences, prefixes),
                                           autograph=False, input_signature=[strings, strings])
        else:
            graphs[prefixed] = tf.function(lambda sentences: _best(held(), sentences), autograph=False,
                                           input_signature=[strings])
    return graphs[prefixed]


def details_batch(translator: Any, texts: list[str], prefixes: list[str] | None = None) -> list[Translation]:
    """Per cleaned, non-blank text, its best translation as a `details.Translation` (`translate_detailed` calls
    it): the text and score `translate` gives, and the tokens generated; with `prefixes`, each starting with its
    prefix (checked first, as `translate_batch` checks them)."""
    inputs = [tf.constant([text.encode("utf-8") for text in texts], tf.string)]
    if prefixes is not None:
        translator.target_prefix_ids(prefixes)  # a bad prefix is named here, before any graph runs
        inputs.append(tf.constant([text.encode("utf-8") for text in prefixes], tf.string))
    result = _graph(translator, prefixes is not None)(*inputs)
    alpha = translator.scoring_alpha
    return [Translation.from_score(text.decode("utf-8"), float(score), int(tokens), alpha) for text, score, tokens in
            zip(result["translation"].numpy(), result["score"].numpy(), result["tokens"].numpy())]


def count_source_tokens(translator: Any, text: str) -> int:
    """The tokens the translator's source tokenizer makes of `text`, without eos and without the language token
    a multilingual tokenizer puts first on its own (what it makes of ""), for `translate_document`'s budget."""
    ids = translator.source_tokenizer.tokenize(tf.constant([text.encode("utf-8"), b""], tf.string))
    if isinstance(ids, tf.RaggedTensor):
        lengths = ids.row_lengths().numpy()
    else:
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, translator.source_tokenizer.pad_id), tf.int32), 1).numpy()
    return max(0, int(lengths[0]) - int(lengths[1]))
