"""`BleuCallback` with tokenizers: decode the validation set during `model.fit`, log BLEU, keep the best weights.

The callback itself is `keras_transformer.trainer.callbacks.BleuCallback`,
which decodes through any translator it is given; this one builds a
TensorFlow `Translator` around the model being trained from
`(source_tokenizer, target_tokenizer)`.
"""

from collections.abc import Sequence
from typing import Any

from keras_transformer.engines.tensorflow import Translator
from keras_transformer.trainer import callbacks


class BleuCallback(callbacks.BleuCallback):
    """Every `every_n_epochs` epochs, translates the validation sources and logs their BLEU.

    Takes the arguments of `keras_transformer.trainer.callbacks.BleuCallback`,
    and `tokenizers=(source_tokenizer, target_tokenizer)` instead of a
    translator: the `Translator` is then built in `on_train_begin`, with
    `translator_options` (e.g. `beam_size=1` for fast greedy validation) and,
    unless they say otherwise, `chunk_size=0`: one search per decoding batch.

    Example:

    >>> callback = BleuCallback(val_sources, val_references, tokenizers=(src_tok, tgt_tok),  # doctest: +SKIP
    ...                         every_n_epochs=2, best_path="workdir/checkpoints/best.weights.h5")
    >>> model.fit(train_ds, epochs=10, callbacks=[callback, keras.callbacks.CSVLogger("history.csv")])  # doctest: +SKIP
    """

    def __init__(self, sources: Sequence[str], references: Sequence[str], translator: Any = None,
                 tokenizers: tuple[Any, Any] | None = None, **kwargs: Any) -> None:
        def make_translator(model: Any, **options: Any) -> Translator:
            assert tokenizers is not None  # made only when they are given
            # One search per batch of translate_lines (which bounds it): a model still learning runs its
            # translations to their length limit, and would pay for every chunk's full loop in turn.
            return Translator(model, *tokenizers, **{"chunk_size": 0, **options})
        super().__init__(sources, references, translator=translator,
                         make_translator=make_translator if tokenizers is not None else None, **kwargs)
        self.tokenizers = tokenizers
