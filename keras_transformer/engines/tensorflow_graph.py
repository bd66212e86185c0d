"""The TensorFlow engine's graph pieces: UTF-8 clean-up, tokenization to padded ids, chunk bookkeeping, shapes.

What `engines.tensorflow.Translator` builds its `tf.function`s from (and so what a SavedModel's signatures run);
the warm-up requests of an export (`warmup`) use the same shape buckets.
"""

from typing import Any

import tensorflow as tf

from keras_transformer.engines.terms import FORM_SEPARATOR


def valid_utf8(strings: Any) -> tf.Tensor:
    """Replaces invalid UTF-8 bytes with U+FFFD, so no input can break tokenization or output."""
    return tf.strings.unicode_transcode(tf.convert_to_tensor(strings, tf.string), "UTF-8", "UTF-8",
                                        errors="replace", replacement_char=0xFFFD)


def blank_strings(strings: Any) -> tf.Tensor:
    """True for empty or whitespace-only strings."""
    return tf.equal(tf.strings.length(tf.strings.strip(tf.convert_to_tensor(strings, tf.string))), 0)


def encode_ids(tokenizer: Any, sentences: Any, max_length: int, language_last: bool = False) -> tf.Tensor:
    """Tokenizes strings into ids followed by eos, keeping at most `max_length` positions, padded; with
    `language_last` (the sources of a `language_last` tokenizer: mBART-large-cc25's), the language token (the
    first `tokenize` gives) goes after eos."""
    tokens = tokenizer.tokenize(valid_utf8(sentences))
    if not isinstance(tokens, tf.RaggedTensor):
        tokens = tf.RaggedTensor.from_tensor(tokens, padding=tokenizer.pad_id)
    tokens = tf.cast(tokens, tf.int32)
    eos = tf.RaggedTensor.from_tensor(tf.fill([tokens.nrows(), 1], tf.constant(tokenizer.eos_id, tf.int32)))
    if language_last:  # [lang] tokens -> tokens </s> [lang] (mBART-large-cc25's sources)
        ends = [eos, tokens[:, :1]]
        tokens = tokens[:, 1: max_length - 1]
    else:
        ends = [eos]
        tokens = tokens[:, : max_length - 1]
    return tf.concat([tokens, *ends], axis=1).to_tensor(default_value=tokenizer.pad_id)


def encode_prefix_ids(tokenizer: Any, prefixes: Any, max_length: int) -> tf.Tensor:
    """Tokenizes target prefixes into forced target ids (no eos), padded: int32 `[N, P]`.

    Checked in the graph, so that an exported signature refuses them too (`tf.errors.InvalidArgumentError`
    naming the problem): a prefix must leave room for one decoded token (fewer than `max_length` tokens) and
    hold no piece the target vocabulary lacks (the tokenizer's unk id).
    """
    tokens = tokenizer.tokenize(valid_utf8(prefixes))
    if not isinstance(tokens, tf.RaggedTensor):
        tokens = tf.RaggedTensor.from_tensor(tokens, padding=tokenizer.pad_id)
    tokens = tf.cast(tokens, tf.int32)
    longest = tf.reduce_max(tf.concat([tokens.row_lengths(), [0]], 0))
    checks = [tf.debugging.Assert(longest < max_length, [
        "target prefix: a prefix of", longest, f"tokens leaves no room; the model produces at most {max_length} "
        f"tokens, so a prefix has at most {max_length - 1}."])]
    unk_id = getattr(tokenizer, "unk_id", None)
    if unk_id is not None:
        checks.append(tf.debugging.Assert(tf.logical_not(tf.reduce_any(tf.equal(tokens.flat_values, unk_id))), [
            "target prefix: a prefix holds text the target vocabulary does not have (it tokenizes to unk); "
            "forcing it would force unk."]))
    with tf.control_dependencies(checks):
        return tf.identity(tokens.to_tensor(default_value=tokenizer.pad_id))


def row_lengths(ids: tf.Tensor, pad_id: int) -> tf.Tensor:
    """int32 `[N]`: the ids of each row that are not `pad_id` (tokens and eos; `encode_ids` pads after them)."""
    return tf.reduce_sum(tf.cast(tf.not_equal(ids, pad_id), tf.int32), axis=1)


def result_parts(empty: tf.Tensor) -> tf.TensorArray:
    """A TensorArray gathering a loop's results, part 1, 2, ... one per iteration, to concatenate once at the end.

    Part 0 is `empty` (no rows, the parts' other sizes), so that a loop of no iteration (an empty batch)
    concatenates to no rows: a TensorArray cannot concatenate zero parts (in a graph, of sizes known only at
    run time; eagerly, any).
    """
    shape = tf.TensorShape([None]).concatenate(empty.shape[1:])
    parts = tf.TensorArray(empty.dtype, size=0, dynamic_size=True, infer_shape=False, element_shape=shape)
    return parts.write(0, empty)


def one_target_per_source(caller: str, sources: Any, targets: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """`sources, targets` behind a run-time check that they hold as many sentences, naming both counts.

    The check is an op of the graph (a traced batch has no size yet), so an
    exported signature refuses other pairs as well.
    """
    sources, targets = tf.convert_to_tensor(sources, tf.string), tf.convert_to_tensor(targets, tf.string)
    same = tf.debugging.Assert(tf.equal(tf.size(sources), tf.size(targets)),
                               [f"{caller}: got", tf.size(sources), "source(s) but", tf.size(targets),
                                "target(s); give one target per source."])
    with tf.control_dependencies([same]):
        return tf.identity(sources), tf.identity(targets)


def check_vocabulary_sizes(model: Any, source_tokenizer: Any, target_tokenizer: Any, which: str) -> None:
    """Refuses tokenizers whose vocabulary size is not that of the embedding their ids go through.

    Ids beyond the embedding would fail inside the graph; a smaller vocabulary
    (another one, most likely) would decode into nonsense without a word.
    """
    layers = {layer.name: layer for layer in model.layers}
    for side, tokenizer in (("source", source_tokenizer), ("target", target_tokenizer)):
        embedding = layers.get("shared_embedding") or layers[f"{side}_embedding"]
        size = getattr(tokenizer, "vocab_size", None)
        if size is not None and int(size) != embedding.vocab_size:
            field = "vocab_size" if embedding.name == "shared_embedding" else f"{side}_vocab_size"
            raise ValueError(f"Translator: the {side} tokenizer has a vocabulary of {int(size)} ids but {which} "
                             f"has {embedding.vocab_size} ({embedding.name}, TransformerConfig.{field}); "
                             "use the vocabulary the model was trained with.")


# With `jit_compile`, XLA compiles one program per input shape, so a chunk is padded to a few
# shapes: its rows to the next power of two (up to `chunk_size`), its source width to the next power
# of two from 16 (up to the model's source limit). A chunk of 8 then has at most 4 row sizes and,
# for sentences under 64 tokens, 3 widths.
SMALLEST_WIDTH_BUCKET = 16


def bucket_sizes(limit: int, smallest: int = 1) -> list[int]:
    """The padded sizes up to `limit`: powers of two from `smallest`, then `limit` itself.

    Example:

    >>> bucket_sizes(128, 16), bucket_sizes(100, 16), bucket_sizes(8)
    ([16, 32, 64, 128], [16, 32, 64, 100], [1, 2, 4, 8])
    """
    if limit < 1 or smallest < 1:
        raise ValueError(f"bucket_sizes: limit and smallest must be >= 1, got {limit} and {smallest}.")
    sizes, size = [], smallest
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


def bucket_table(limit: int, smallest: int = 1) -> tf.Tensor:
    """int32 `(limit + 1,)`: entry `n` is the smallest `bucket_sizes(limit, smallest)` size >= n.

    Example:

    >>> bucket_table(8).numpy().tolist()
    [1, 1, 2, 4, 4, 8, 8, 8, 8]
    """
    sizes = bucket_sizes(limit, smallest)
    return tf.constant([next(size for size in sizes if size >= n) for n in range(limit + 1)], tf.int32)


def encode_terms(tokenizer: Any, terms: Any, what: str, max_count: int, max_forms: int, max_tokens: int) -> tf.Tensor:
    """Tokenizes target terms given as text slots, `tf.string [N, C]`, into int32 `[N, C, F, L]` ids padded with
    the tokenizer's pad id (F, L at least 1), checked in the graph.

    Each slot holds one term, its alternative forms separated by `FORM_SEPARATOR`; a blank slot (or form) is
    none (all padding), so that rows of different counts fill one rectangle. A form is tokenized alone, as the
    engine tokenizes a term (`engines.tensorflow_terms.TermSearch.term_tokens`), without pad, bos and eos ids.
    At most `max_count` slots per row, `max_forms` forms per slot and `max_tokens` tokens per form, and no form
    holding text the vocabulary lacks (unk): else `tf.errors.InvalidArgumentError` naming `what` and the limit.
    """
    terms = tf.convert_to_tensor(terms, tf.string)
    rows, count = tf.shape(terms)[0], tf.shape(terms)[1]
    forms = tf.strings.split(valid_utf8(tf.reshape(terms, [-1])), sep=FORM_SEPARATOR)  # [(N * C), (F)]
    tokens = tokenizer.tokenize(tf.strings.strip(forms.flat_values))
    if not isinstance(tokens, tf.RaggedTensor):
        tokens = tf.RaggedTensor.from_tensor(tokens, padding=tokenizer.pad_id)
    tokens = tf.cast(tokens, tf.int32)
    special = tf.constant(sorted({tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}), tf.int32)
    keep = tf.ragged.map_flat_values(
        lambda ids: tf.logical_not(tf.reduce_any(tf.equal(ids[:, None], special[None, :]), axis=1)), tokens)
    tokens = tf.ragged.boolean_mask(tokens, keep)  # [(forms), (L)]
    most_forms = tf.reduce_max(tf.concat([forms.row_lengths(), [0]], 0))
    longest = tf.reduce_max(tf.concat([tokens.row_lengths(), [0]], 0))
    checks = [
        tf.debugging.Assert(count <= max_count, [f"{what}: rows of", count, f"slots; at most {max_count} per line."]),
        tf.debugging.Assert(most_forms <= max_forms, [
            f"{what}: a slot of", most_forms, f"forms (separated by tabs); at most {max_forms}."]),
        tf.debugging.Assert(longest <= max_tokens, [
            f"{what}: a term of", longest, f"target tokens; at most {max_tokens}."])]
    unk_id = getattr(tokenizer, "unk_id", None)
    if unk_id is not None:
        checks.append(tf.debugging.Assert(tf.logical_not(tf.reduce_any(tf.equal(tokens.flat_values, unk_id))), [
            f"{what}: a term holds text the target vocabulary does not have (it tokenizes to unk); forcing or "
            "banning it would force or ban unk."]))
    nested = tf.RaggedTensor.from_row_splits(tokens, tf.cast(forms.row_splits, tf.int64))  # [(N * C), (F), (L)]
    ids = nested.to_tensor(default_value=tokenizer.pad_id)  # [N * C, F, L]
    shape = tf.shape(ids)
    ids = tf.pad(ids, [[0, 0], [0, tf.maximum(1 - shape[1], 0)], [0, tf.maximum(1 - shape[2], 0)]],
                 constant_values=tokenizer.pad_id)
    with tf.control_dependencies(checks):
        return tf.reshape(ids, tf.stack([rows, count, tf.shape(ids)[1], tf.shape(ids)[2]]))
