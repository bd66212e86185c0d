"""The TensorFlow engine's attention maps: `Translator.attention` (`attention.maps.attention_maps` on the source
and the translation the translator gives it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_transformer.attention.maps import AttentionMaps, attention_maps, strip_special
from keras_transformer.engines.lines import clean_line
from keras_transformer.engines.tensorflow_graph import valid_utf8


def translation_attention(translator: Any, sentence: str | bytes, translation: str | bytes | None = None
                          ) -> AttentionMaps:
    """The `AttentionMaps` of `sentence` and the translation `translator` (a `Translator`) gives it (or
    `translation`): `Translator.attention`."""
    if len(translator.models) != 1:
        raise ValueError(f"Attention maps are drawn for one model; this Translator decodes an ensemble of "
                         f"{len(translator.models)}.")
    text = clean_line(sentence, "Translator.attention") if isinstance(sentence, (str, bytes)) else sentence
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Translator.attention needs a non-empty sentence, got {sentence!r}.")
    source = translator.encode_sources(tf.constant([text.encode("utf-8")]))  # (1, S): tokens then eos
    target = translator.target_tokenizer
    if translation is None:
        tokens, _ = translator.translate_ids(source, num_return=1)
        target_ids = strip_special(tokens.numpy()[0, 0], target.eos_id, target.pad_id, target.bos_id)
    else:
        forced = clean_line(translation, "Translator.attention")
        target_ids = translator.encode_targets(tf.constant([forced.encode("utf-8")])).numpy()[0].tolist()
        target_ids = strip_special(target_ids, target.eos_id, target.pad_id, target.bos_id)
    target_ids = target_ids[: translator.max_target_length - 1]
    detokenized = valid_utf8(target.detokenize(tf.constant([target_ids + [target.eos_id]], tf.int32)))

    def pieces(tokenizer: Any) -> Callable[[list[int]], list[str]]:
        def read(ids: list[int]) -> list[str]:
            values = tokenizer.id_to_piece(tf.constant(ids, tf.int32)).numpy().reshape(-1)
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
        return read

    source_ids = [int(i) for i in source.numpy()[0] if i != translator.source_tokenizer.pad_id]
    readers = (pieces(translator.source_tokenizer), pieces(target))
    return attention_maps(translator.model, source_ids, target_ids, readers,
                          detokenized.numpy()[0].decode("utf-8"), bos_id=target.bos_id, eos_id=target.eos_id,
                          pad_id=target.pad_id)
