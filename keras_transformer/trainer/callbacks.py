"""The callbacks of the training loop: checkpoints, the learning rate, history.csv and BLEU on validation.

Backend-neutral (keras and numpy): the same callbacks serve `model.fit` on a
tf.data pipeline and on the packed arrays of any backend.
"""

import csv
import logging
import math
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from keras_transformer import evaluation
from keras_transformer.experiment.validation import VALIDATION_METRICS
from keras_transformer.files import atomic_write
from keras_transformer.trainer.ema import averaged_weights
from keras_transformer.workdir.checkpoints import save_weights, write_weights_file
from keras_transformer.workdir.rotation import rotate_checkpoints

log = logging.getLogger("keras_transformer")


def all_finite(variables: Iterable[Any]) -> bool:
    """Whether every value of `variables` (Keras variables or arrays) is finite.

    >>> all_finite([np.ones(3)]), all_finite([np.ones(3), np.array([1.0, np.nan])])
    (True, False)
    """
    return all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in variables)


class NonFiniteGuard(keras.callbacks.Callback):
    """Stops training at the first non-finite training loss or weight, and vetoes every save after it.

    Keras' `TerminateOnNaN` only sets `stop_training`: the epoch still ends,
    and its checkpoint, backup and best-BLEU weights are written with the
    broken weights. Here every writer of the training loop (`EpochCheckpoint`,
    `StepCheckpoint`, `HistoryCSV`, `BleuCallback`, `ResumableBackup`) asks
    `safe_to_save` first, which also checks that the weights are finite: an
    update whose gradient was not finite (the loss of its batch still was)
    is caught at the next save, before anything of it reaches the disk.

    After `fit`, `tripped` tells whether it stopped the run, `update` at
    which optimizer update, and `reason` why.
    """

    def __init__(self) -> None:
        super().__init__()
        self.update: int | None = None
        self.reason: str | None = None

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        """Stops the run: nothing is saved from now on."""
        if self.tripped:
            return
        self.reason = reason
        self.update = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        self.model.stop_training = True
        log.error("Training stops at update %d: %s. Nothing of this epoch is saved.", self.update, reason)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(np.asarray(loss))):
            self.trip(f"the training loss became {float(np.asarray(loss))}")

    def safe_to_save(self, model: Any = None) -> bool:
        """False once the run has tripped, or when a trainable weight is not finite (which trips it)."""
        if self.tripped:
            return False
        if not all_finite((model or self.model).trainable_variables):
            self.trip("a weight became non-finite (a gradient that was not finite)")
            return False
        return True


def _safe(guard: NonFiniteGuard | None, model: Any) -> bool:
    return guard is None or guard.safe_to_save(model)


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves `checkpoints/ckpt-{epoch:04d}.weights.h5` (1-based) at the end of each epoch: the moving average of
    the weights when the optimizer keeps one (`training.ema_decay`), else the weights.

    Each file is written under a temporary name and renamed, so an interrupted
    run never leaves a truncated checkpoint. With `keep` only the newest `keep`
    files stay (`workdir.rotate_checkpoints`: while a reader reads the old ones,
    they stay until the next epoch's rotation).

    Args:
        directory: the checkpoint folder.
        keep: how many epoch checkpoints to keep; None keeps all.
        guard: a `NonFiniteGuard` that can veto the save, or None.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int | None = None,
                 guard: NonFiniteGuard | None = None) -> None:
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.keep = keep
        self.guard = guard

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not _safe(self.guard, self.model):
            return
        with averaged_weights(self.model):
            save_weights(self.model, self.directory / f"ckpt-{epoch + 1:04d}.weights.h5")
        if self.keep:
            rotate_checkpoints(self.directory, self.keep)  # not while a reader reads them (it deletes them later)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves `checkpoints/step-{step:08d}.weights.h5` every `every` optimizer updates, keeping the last `keep`
    (the moving average of the weights when the optimizer keeps one).

    Steps are optimizer updates (`optimizer.iterations`), so with gradient
    accumulation one step spans several batches.
    """

    def __init__(self, directory: str | os.PathLike[str], every: int, keep: int = 3,
                 guard: NonFiniteGuard | None = None) -> None:
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.every = int(every)
        self.keep = int(keep)
        self.guard = guard
        self._saved: int | None = None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))  # a jax.Array on JAX with accumulation
        if step % self.every == 0 and step != self._saved and _safe(self.guard, self.model):
            self._saved = step
            with averaged_weights(self.model):
                save_weights(self.model, self.directory / f"step-{step:08d}.weights.h5")
            rotate_checkpoints(self.directory, self.keep, "step-[0-9]*.weights.h5")


class LearningRateLogger(keras.callbacks.Callback):
    """Adds `learning_rate` and the optimizer `step` to the epoch logs (for history.csv and TensorBoard)."""

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        optimizer = self.model.optimizer
        logs.setdefault("learning_rate", float(np.asarray(optimizer.learning_rate)))
        logs["step"] = int(keras.ops.convert_to_numpy(optimizer.iterations))


class ProgressLogger(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, without the epoch-end entries kept for `history.csv` and TensorBoard only.

    `step` (the update count, which Keras' bar would print as `53.0000`) and
    entries that are NaN because nothing was measured that epoch (`val_bleu`
    between BLEU passes) stay in the logs but leave the printed line.

    `epochs` (the run's `training.epochs`) is the total its epoch headers count to, also when `fit` trains a
    resumed epoch's rest alone.

    Example:

    >>> ProgressLogger.shown({"loss": 2.5, "step": 53, "val_bleu": float("nan")})
    {'loss': 2.5}
    """

    HIDDEN = ("step",)

    def __init__(self, epochs: int | None = None) -> None:
        super().__init__()
        self.run_epochs = epochs  # the run's training.epochs: a resumed epoch's header reads "Epoch 3/8", not 3/3

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self.run_epochs is not None:
            self.epochs: int = max(int(self.run_epochs), self.epochs)

    @classmethod
    def shown(cls, logs: Mapping[str, Any] | None) -> dict[str, Any]:
        """The entries of `logs` the progress line prints."""
        return {key: value for key, value in (logs or {}).items() if key not in cls.HIDDEN and not (
            isinstance(value, float) and math.isnan(value))}

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, self.shown(logs))


class HistoryCSV(keras.callbacks.Callback):
    """Writes `history.csv`: one row per finished epoch, column `epoch` (1-based) first.

    Rows are appended across resumed runs. When a run resumes at epoch `e`, rows
    for epochs after `e` (written by a run killed before its backup was saved)
    are dropped before training goes on, so the `epoch` column never goes back.

    Args:
        path: the CSV file.
        guard: a `NonFiniteGuard`: an epoch it stopped gets no row (it trains again when the run resumes).
    """

    def __init__(self, path: str | os.PathLike[str], guard: NonFiniteGuard | None = None) -> None:
        super().__init__()
        self.path = pathlib.Path(path)
        self.guard = guard
        self._started: int | None = None

    def read(self) -> tuple[list[str], list[dict[str, Any]]]:
        """`(header, rows)` of the file as it stands; `([], [])` without one."""
        if not self.path.is_file():
            return [], []
        with open(self.path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or []), list(reader)

    def _write(self, header: list[str], rows: list[dict[str, Any]]) -> None:
        def write(temporary: str | os.PathLike[str]) -> None:
            with open(temporary, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=header, restval="")
                writer.writeheader()
                writer.writerows(rows)
        atomic_write(self.path, write)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._started is None:
            self._started = epoch
            header, rows = self.read()
            kept = [row for row in rows if row.get("epoch", "").isdigit() and int(row["epoch"]) <= epoch]
            if len(kept) != len(rows):
                self._write(header, kept)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.guard is not None and self.guard.tripped:
            return
        header, rows = self.read()
        row = {"epoch": epoch + 1}
        row.update({key: _plain(value) for key, value in (logs or {}).items()})
        new_header = ["epoch"] + sorted(set(header[1:]) | (set(row) - {"epoch"}))
        rows.append(row)
        self._write(new_header, rows)


def _plain(value: Any) -> Any:
    value = np.asarray(value)
    return value.item() if value.size == 1 else value.tolist()


def best_logged(history_csv: str | os.PathLike[str], key: str, epochs: int) -> float:
    """The highest finite `key` in the first `epochs` rows of a history.csv; -inf without one."""
    _, rows = HistoryCSV(history_csv).read()
    values = []
    for row in rows:
        try:
            if int(row.get("epoch", "")) <= epochs:
                values.append(float(row.get(key, "")))
        except (TypeError, ValueError):
            continue
    values = [value for value in values if math.isfinite(value)]
    return max(values, default=-math.inf)


class BleuCallback(keras.callbacks.Callback):
    """Every `every_n_epochs` epochs, translates the validation sources and logs their BLEU (or chrF).

    The score (`metric`: sacreBLEU's BLEU, or its chrF) is written into the
    epoch's `logs` under `monitor` (default `"val_bleu"`, `"val_chrf"` for
    chrF), so callbacks listed after this one (`CSVLogger`, `TensorBoard`,
    `EarlyStopping`, `ModelCheckpoint`) see it; on epochs without decoding
    the value is NaN, which keeps CSV columns stable. When the score
    improves, the model's weights are saved to `best_path`.

    Args:
        sources: validation source sentences (list of `str`).
        references: their reference translations (raw text).
        translator: anything with `translate_lines(sentences, batch_size=...)`
            decoding with the model being trained (a `Translator`), or None to
            build one in `on_train_begin` with `make_translator`.
        make_translator: `make_translator(model, **translator_options)` when
            `translator` is None (`keras_transformer.trainer.tensorflow_callbacks.BleuCallback`
            passes one that builds a `Translator` from tokenizers).
        every_n_epochs: decode after epochs N, 2N, ...
        lowercase: case-insensitive BLEU.
        lang, tokenized_references: if given, BLEU follows the Multi30k
            protocol (`evaluation.multi30k_bleu`) instead.
        best_path: where to save the best weights (`.weights.h5`), or None.
        monitor: the `logs` key (None: `val_` and the metric's name).
        metric: "bleu" or "chrf" (`evaluation.chrf`, on the raw references):
            the score logged, and the one `best_path` keeps the best of.
        batch_size: sentences per decoding batch.
        translator_options: `Translator` arguments when it is built here
            (e.g. `beam_size=1` for fast greedy validation).
        verbose: print the score.
        best: the score to beat before the first decoding. A resumed run passes
            its best so far, so that `best_path` keeps the best weights of the
            whole run and not the first ones scored after the resume.
        guard: a `NonFiniteGuard`: once it has stopped the run, nothing is
            decoded or saved.

    Example:

    >>> callback = BleuCallback(val_sources, val_references, translator=translator,  # doctest: +SKIP
    ...                         every_n_epochs=2, best_path="workdir/checkpoints/best.weights.h5")
    >>> model.fit(train_ds, epochs=10, callbacks=[callback, keras.callbacks.CSVLogger("history.csv")])  # doctest: +SKIP
    """

    def __init__(self, sources: Sequence[str], references: Sequence[str], translator: Any = None,
                 make_translator: Callable[..., Any] | None = None, every_n_epochs: int = 1,
                 lowercase: bool = False, lang: str | None = None, tokenized_references: Sequence[str] | None = None,
                 best_path: str | os.PathLike[str] | None = None, monitor: str | None = None, batch_size: int = 64,
                 translator_options: Mapping[str, Any] | None = None, verbose: int | bool = 1, best: float = -math.inf,
                 guard: NonFiniteGuard | None = None, metric: str = "bleu") -> None:
        super().__init__()
        if metric not in VALIDATION_METRICS:
            raise ValueError(f"BleuCallback: metric must be one of {', '.join(VALIDATION_METRICS)}, got {metric!r}.")
        if translator is None and make_translator is None:
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
        self.make_translator = make_translator
        self.every_n_epochs = int(every_n_epochs)
        self.lowercase = bool(lowercase)
        self.lang = lang
        self.tokenized_references = tokenized_references
        self.best_path = os.fspath(best_path) if best_path is not None else None
        self.metric = metric
        self.monitor = monitor or f"val_{metric}"
        self.batch_size = int(batch_size)
        self.translator_options = dict(translator_options or {})
        self.verbose = verbose
        self.best = float(best)
        self.guard = guard
        self.history: list[tuple[int, float]] = []  # (epoch, bleu)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.translator is None:
            assert self.make_translator is not None  # __init__ refuses a callback with neither
            self.translator = self.make_translator(self.model, **self.translator_options)

    def compute_bleu(self) -> float:
        """Translates the validation sources with the current weights and returns BLEU."""
        hypotheses = self.translator.translate_lines(self.sources, batch_size=self.batch_size)
        if self.tokenized_references is not None:
            assert self.lang is not None  # __init__ refuses tokenized references without their language
            return evaluation.multi30k_bleu(hypotheses, self.tokenized_references, self.lang).score
        return evaluation.bleu(hypotheses, self.references, lowercase=self.lowercase).score

    def compute_score(self) -> float:
        """Translates the validation sources with the current weights and returns the `metric`'s score."""
        if self.metric == "bleu":
            return self.compute_bleu()
        hypotheses = self.translator.translate_lines(self.sources, batch_size=self.batch_size)
        return evaluation.chrf(hypotheses, self.references).score

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs if logs is not None else {}
        if (epoch + 1) % self.every_n_epochs or (self.guard is not None and self.guard.tripped):
            logs[self.monitor] = float("nan")
            return
        with averaged_weights(self.model):
            score = self.compute_score()
            logs[self.monitor] = score
            self.history.append((epoch, score))
            improved = score > self.best
            if improved:
                self.best = score
                if self.best_path is not None and _safe(self.guard, self.model):
                    atomic_write(self.best_path, lambda path: write_weights_file(self.model, path))
        if self.verbose:
            note = f", saved to {self.best_path}" if improved and self.best_path else ""
            print(f"\nEpoch {epoch + 1}: {self.monitor} = {score:.2f} (best {self.best:.2f}{note})")
