"""`BleuCallback`: decode the validation set during training, log BLEU, keep the best checkpoint."""

import math
import os

import keras

from keras_transformer import evaluation


class BleuCallback(keras.callbacks.Callback):
    """Every `every_n_epochs` epochs, translates the validation sources and logs their BLEU.

    BLEU is written into the epoch's `logs` under `monitor` (default
    `"val_bleu"`), so callbacks listed after this one (`CSVLogger`,
    `TensorBoard`, `EarlyStopping`, `ModelCheckpoint`) see it; on epochs
    without decoding the value is NaN, which keeps CSV columns stable. When
    the score improves, the model's weights are saved to `best_path`.

    Args:
        sources: validation source sentences (list of `str`).
        references: their reference translations (raw text).
        translator: a `Translator` around the model being trained, or None to
            build one in `on_train_begin` from `tokenizers`.
        tokenizers: `(source_tokenizer, target_tokenizer)` when `translator` is None.
        every_n_epochs: decode after epochs N, 2N, ...
        lowercase: case-insensitive BLEU.
        lang, tokenized_references: if given, BLEU follows the Multi30k
            protocol (`evaluation.multi30k_bleu`) instead.
        best_path: where to save the best weights (`.weights.h5`), or None.
        monitor: the `logs` key.
        batch_size: sentences per decoding batch.
        translator_options: `Translator` arguments when it is built here
            (e.g. `beam_size=1` for fast greedy validation).
        verbose: print the score.
        best: the score to beat before the first decoding. A resumed run passes
            its best so far, so that `best_path` keeps the best weights of the
            whole run and not the first ones scored after the resume.

    Example:

    >>> callback = BleuCallback(val_sources, val_references, tokenizers=(src_tok, tgt_tok),  # doctest: +SKIP
    ...                         every_n_epochs=2, best_path="workdir/checkpoints/best.weights.h5")
    >>> model.fit(train_ds, epochs=10, callbacks=[callback, keras.callbacks.CSVLogger("history.csv")])  # doctest: +SKIP
    """

    def __init__(self, sources, references, translator=None, tokenizers=None, every_n_epochs=1,
                 lowercase=False, lang=None, tokenized_references=None, best_path=None, monitor="val_bleu",
                 batch_size=64, translator_options=None, verbose=1, best=-math.inf):
        super().__init__()
        if translator is None and tokenizers is None:
            raise ValueError("BleuCallback needs a translator or (source, target) tokenizers.")
        if len(sources) != len(references):
            raise ValueError(f"BleuCallback: {len(sources)} sources but {len(references)} references.")
        if tokenized_references is not None and lang is None:
            raise ValueError("BleuCallback: the Multi30k protocol (tokenized_references) needs lang=.")
        if every_n_epochs < 1:
            raise ValueError(f"BleuCallback: every_n_epochs must be >= 1, got {every_n_epochs}.")
        self.sources = list(sources)
        self.references = list(references)
        self.translator = translator
        self.tokenizers = tokenizers
        self.every_n_epochs = int(every_n_epochs)
        self.lowercase = bool(lowercase)
        self.lang = lang
        self.tokenized_references = tokenized_references
        self.best_path = os.fspath(best_path) if best_path is not None else None
        self.monitor = monitor
        self.batch_size = int(batch_size)
        self.translator_options = dict(translator_options or {})
        self.verbose = verbose
        self.best = float(best)
        self.history = []  # (epoch, bleu)

    def on_train_begin(self, logs=None):
        if self.translator is None:
            from keras_transformer.translation import Translator

            source_tokenizer, target_tokenizer = self.tokenizers
            self.translator = Translator(self.model, source_tokenizer, target_tokenizer,
                                         **self.translator_options)

    def compute_bleu(self):
        """Translates the validation sources with the current weights and returns BLEU."""
        hypotheses = self.translator.translate_lines(self.sources, batch_size=self.batch_size)
        if self.tokenized_references is not None:
            return evaluation.multi30k_bleu(hypotheses, self.tokenized_references, self.lang).score
        return evaluation.bleu(hypotheses, self.references, lowercase=self.lowercase).score

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        if (epoch + 1) % self.every_n_epochs:
            logs[self.monitor] = float("nan")
            return
        score = self.compute_bleu()
        logs[self.monitor] = score
        self.history.append((epoch, score))
        improved = score > self.best
        if improved:
            self.best = score
            if self.best_path is not None:
                os.makedirs(os.path.dirname(self.best_path) or ".", exist_ok=True)
                self.model.save_weights(self.best_path)
        if self.verbose:
            note = f", saved to {self.best_path}" if improved and self.best_path else ""
            print(f"\nEpoch {epoch + 1}: {self.monitor} = {score:.2f} (best {self.best:.2f}{note})")
