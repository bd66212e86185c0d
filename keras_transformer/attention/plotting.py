"""Pictures: attention maps per layer and head, the learning-rate schedule, the positional encoding.

Everything draws on `matplotlib.figure.Figure` objects rendered by the Agg
backend (no window, no `pyplot` global state), so it works on servers and in
tests and never changes the backend a user has chosen.

Attention maps of one sentence:

1. the translator translates the sentence (with its decoding options: the
   translation drawn is the one it serves), unless a translation is given;
2. one teacher-forced pass over ``<s> + translation`` collects every weight
   matrix: encoder self-attention ``(H, S, S)``, decoder self-attention
   ``(H, T, T)`` and cross-attention ``(H, T, S)`` per layer;
3. each layer's heads are drawn as a grid of heatmaps (``layout="grid"``, one
   PNG per layer) or one heatmap per PNG (``layout="heads"``).

Axes: a row is a query position, a column a key position, and each row sums to
one. Source axes show the source subwords followed by ``</s>``. Decoder rows
are labelled with the token that position *predicts* (the translation's
subwords, then ``</s>``), so a cross-attention map reads as an alignment: the
row of "Hund" shows where the decoder looked while writing "Hund". Decoder
self-attention columns are the decoder *inputs* (``<s>`` and the translation
shifted right), so the causal mask shows as the empty upper triangle.

Files (``plot_attention_maps``)::

    encoder_self_layer1.png ... encoder_self_layerN.png     (grid layout)
    decoder_self_layer1.png ... decoder_self_layerN.png
    cross_layer1.png        ... cross_layerN.png
    encoder_self_layer1_head1.png ...                        (heads layout)

The numbers come from the translator (`TranslatorInterface.attention`, which
builds `keras_transformer.attention.maps.AttentionMaps`); this module draws them.
"""

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from keras_transformer.attention.maps import KINDS, AttentionMaps
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.lines import clean_line
from keras_transformer.engines.loader import load_translator
from keras_transformer.layers.position import sinusoidal_position_encoding
from keras_transformer.trainer.schedules import NoamSchedule

LAYOUTS = ("grid", "heads")
_TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
           "cross": "encoder-decoder (cross) attention"}


# ------------------------------------------------------------------ drawing


def _heatmap(axes: Any, weights: np.ndarray, row_tokens: Sequence[str], column_tokens: Sequence[str], title: str,
             fontsize: float) -> Any:
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    axes.set_xticks(range(len(column_tokens)))
    axes.set_xticklabels(column_tokens, rotation=90, fontsize=fontsize)
    axes.set_yticks(range(len(row_tokens)))
    axes.set_yticklabels(row_tokens, fontsize=fontsize)
    axes.set_title(title, fontsize=fontsize + 2)
    return image


def attention_figure(weights: Any, row_tokens: Sequence[str], column_tokens: Sequence[str], title: str | None = None,
                     columns: int = 4, cell_inches: float = 0.22) -> Figure:
    """Draws the heads of one attention layer as a grid of heatmaps.

    Args:
        weights: ``(H, Q, K)`` (or ``(Q, K)`` for one head) weights in [0, 1].
        row_tokens: Q labels for the query axis (rows, the y axis).
        column_tokens: K labels for the key axis (columns, the x axis).
        title: the figure title.
        columns: heads per row of the grid (head h sits at row ``h // columns``,
            column ``h % columns``, read left to right, top to bottom).
        cell_inches: size of one matrix cell; the figure grows with the sentence.

    Returns:
        A `matplotlib.figure.Figure` with one `Axes` per head (titled "head 1",
        ...) and a shared colour bar; ``figure.savefig(path)`` writes it.

    Example:

    >>> import numpy as np
    >>> figure = attention_figure(np.full((2, 2, 3), 1 / 3), ["a", "b"], ["x", "y", "z"])
    >>> [t.get_text() for t in figure.axes[0].get_xticklabels()]
    ['x', 'y', 'z']
    """
    weights = np.asarray(weights, dtype="float32")
    if weights.ndim == 2:
        weights = weights[None]
    if weights.ndim != 3:
        raise ValueError(f"attention_figure expects weights of shape (H, Q, K) or (Q, K), got {weights.shape}.")
    heads, queries, keys = weights.shape
    if (queries, keys) != (len(row_tokens), len(column_tokens)):
        raise ValueError(f"attention_figure: weights of shape {weights.shape} do not match {len(row_tokens)} row "
                         f"tokens and {len(column_tokens)} column tokens.")
    columns = max(1, min(int(columns), heads))
    rows = math.ceil(heads / columns)
    label_inches = 0.09 * max(len(t) for t in list(row_tokens) + list(column_tokens) + ["x"]) + 0.4
    panel_width = max(1.6, keys * cell_inches) + label_inches
    panel_height = max(1.6, queries * cell_inches) + label_inches + 0.3
    figure = Figure(figsize=(columns * panel_width + 0.8, rows * panel_height + 0.6), layout="constrained")
    fontsize = 7 if max(queries, keys) <= 40 else 5
    grid = figure.subplots(rows, columns, squeeze=False)
    panels = []
    for head in range(rows * columns):
        axes = grid[head // columns][head % columns]
        if head >= heads:
            figure.delaxes(axes)
            continue
        image = _heatmap(axes, weights[head], row_tokens, column_tokens, f"head {head + 1}", fontsize)
        panels.append(axes)
    figure.colorbar(image, ax=panels, shrink=0.6, label="weight")
    if title:
        figure.suptitle(title, fontsize=fontsize + 3)
    return figure


def _save(figure: Figure, path: str, dpi: int) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def plot_attention_maps(maps: AttentionMaps, out_dir: str | os.PathLike[str], kinds: Iterable[str] = KINDS,
                        layout: str = "grid", dpi: int = 110) -> list[str]:
    """Writes the heatmaps of an `AttentionMaps` as PNG files.

    Args:
        maps: an `AttentionMaps` (from a translator's `attention`).
        out_dir: the folder to write (created if needed).
        kinds: which of ``"encoder_self"``, ``"decoder_self"``, ``"cross"`` to draw.
        layout: ``"grid"``: one PNG per layer with every head in a grid
            (``{kind}_layer{l}.png``); ``"heads"``: one PNG per layer and head
            (``{kind}_layer{l}_head{h}.png``). Layers and heads count from 1.
        dpi: resolution of the PNG files.

    Returns:
        The list of paths written, encoder first, layers in order.

    Example:

    >>> paths = plot_attention_maps(maps, "attention/")  # doctest: +SKIP
    >>> paths[0]  # doctest: +SKIP
    'attention/encoder_self_layer1.png'
    """
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {layout!r}; choose one of {LAYOUTS}.")
    out_dir = os.fspath(out_dir)
    paths = []
    for kind in kinds:
        layers, rows, columns = maps.axes(kind)
        for layer, weights in enumerate(layers, start=1):
            title = f"{_TITLES[kind]}, layer {layer}"
            if layout == "grid":
                paths.append(_save(attention_figure(weights, rows, columns, title=title),
                                   os.path.join(out_dir, f"{kind}_layer{layer}.png"), dpi))
                continue
            for head, head_weights in enumerate(weights, start=1):
                figure = attention_figure(head_weights, rows, columns, title=f"{title}, head {head}")
                paths.append(_save(figure, os.path.join(out_dir, f"{kind}_layer{layer}_head{head}.png"), dpi))
    return paths


def plot_attention(translator: TranslatorInterface, sentence: str, out_dir: str | os.PathLike[str],
                   translation: str | None = None, kinds: Iterable[str] = KINDS, layout: str = "grid",
                   dpi: int = 110) -> tuple[AttentionMaps, list[str]]:
    """Translates `sentence` and writes its attention maps: the one call behind ``plot-attention``.

    Also writes ``out_dir/translation.txt`` (source, translation and the
    subword tokens of both axes).

    Args:
        translator: a translator with attention maps (`interface.TranslatorInterface.attention`: the
            TensorFlow `Translator` or the packed one), e.g. `keras_transformer.load_translator(path)`.
        sentence: the source sentence (`str`, or UTF-8 `bytes`; bytes that are not UTF-8 become U+FFFD).
        out_dir: the folder to write.
        translation: force this target instead of decoding (e.g. a reference).
        kinds, layout, dpi: as in `plot_attention_maps`.

    Returns:
        ``(maps, paths)``: the `AttentionMaps` and the PNG paths written.

    Example:

    >>> from keras_transformer.engines.loader import load_translator  # doctest: +SKIP
    >>> maps, paths = plot_attention(load_translator("runs/en_de"), "A dog runs.", "out/")  # doctest: +SKIP
    """
    maps = translator.attention(sentence, translation)
    paths = plot_attention_maps(maps, out_dir, kinds=kinds, layout=layout, dpi=dpi)
    text = clean_line(sentence) if isinstance(sentence, (str, bytes)) else sentence
    with open(os.path.join(os.fspath(out_dir), "translation.txt"), "w", encoding="utf-8") as f:
        f.write(f"source:       {text}\ntranslation:  {maps.translation}\n"
                f"source tokens: {' '.join(maps.source_tokens)}\n"
                f"target tokens: {' '.join(maps.target_outputs)}\n")
    return maps, paths


def plot_attention_for_path(model_path: str | os.PathLike[str], sentence: str, out_dir: str | os.PathLike[str],
                            checkpoint: Any = None, average: int | None = None, translation: str | None = None,
                            layout: str = "grid", kinds: Iterable[str] = KINDS, dpi: int = 110,
                            **settings: Any) -> tuple[AttentionMaps, list[str]]:
    """`plot_attention` for a model on disk: what ``keras-transformer plot-attention`` runs.

    Args:
        model_path: a training workdir or a SavedModel export (`keras_transformer.load_translator`).
        sentence: the source sentence.
        out_dir: the folder to write.
        checkpoint, average: which weights (`keras_transformer.load_translator`).
        translation: force this target instead of decoding.
        layout, kinds, dpi: as in `plot_attention_maps`.
        **settings: `DecodeOptions` fields replacing the model's (`beam_size=1`, ...); by default the
            translation drawn is the one the model serves.

    Returns:
        ``(maps, paths)`` as `plot_attention`.

    Example:

    >>> plot_attention_for_path("runs/multi30k_en_de", "A dog runs.", "attention/")  # doctest: +SKIP
    """
    translator = load_translator(model_path, checkpoint, average, **settings)
    return plot_attention(translator, sentence, out_dir, translation=translation, kinds=kinds, layout=layout,
                          dpi=dpi)


# ------------------------------------------------------------------ schedule and positions


def plot_learning_rate_schedule(path: str | os.PathLike[str],
                                settings: Iterable[tuple[int, int]] = ((512, 4000), (512, 8000), (256, 4000),
                                                                       (128, 4000)),
                                steps: int = 20000, dpi: int = 110) -> str:
    """Plots `NoamSchedule` curves, one per ``(d_model, warmup_steps)`` setting.

    Args:
        path: the PNG to write.
        settings: ``(d_model, warmup_steps)`` pairs (the paper: 512 and 4000).
        steps: the x range, training steps 1..steps.
        dpi: resolution.

    Returns:
        `path`.

    Example:

    >>> import os, tempfile
    >>> path = plot_learning_rate_schedule(os.path.join(tempfile.mkdtemp(), "lr.png"), steps=100)
    >>> os.path.getsize(path) > 1000
    True
    """

    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.subplots()
    step = np.arange(1, int(steps) + 1, dtype="float32")
    for d_model, warmup in settings:
        rate = np.asarray(NoamSchedule(d_model=d_model, warmup_steps=warmup)(step))
        axes.plot(step, rate, label=f"d_model={d_model}, warmup={warmup}")
    axes.set_xlabel("training step")
    axes.set_ylabel("learning rate")
    axes.set_title("lr = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, os.fspath(path), dpi)


def plot_position_encoding(path: str | os.PathLike[str], length: int = 100, d_model: int = 512, dpi: int = 110) -> str:
    """Plots the sinusoidal positional-encoding matrix (positions down, dimensions across).

    The even (sine) dimensions are drawn first and the odd (cosine) ones after
    them, each in order of falling frequency, so the smooth bands the formula
    makes are visible (interleaved, neighbouring columns alternate sin and cos
    and the picture turns into moire stripes).

    Args:
        path: the PNG to write.
        length: number of positions.
        d_model: number of dimensions.
        dpi: resolution.

    Returns:
        `path`.

    Example:

    >>> import os, tempfile
    >>> path = plot_position_encoding(os.path.join(tempfile.mkdtemp(), "pe.png"), length=20, d_model=16)
    >>> os.path.getsize(path) > 1000
    True
    """

    table = sinusoidal_position_encoding(int(length), int(d_model))  # (L, D)
    halves = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)  # (L, D): sin columns, then cos columns
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(halves, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest")
    sines = table[:, 0::2].shape[1]
    axes.axvline(sines - 0.5, color="black", linewidth=0.8)
    axes.set_xticks([0, sines // 2, sines, sines + (d_model - sines) // 2])
    axes.set_xticklabels(["i=0", f"i={2 * (sines // 2)}", "i=1", f"i={2 * ((d_model - sines) // 2) + 1}"])
    axes.set_xlabel("dimension i: sin(pos / 10000^(i/d)) for even i (left), cos for odd i (right)")
    axes.set_ylabel("position")
    axes.set_title(f"sinusoidal positional encoding, {length} positions x d_model={d_model}")
    figure.colorbar(image, ax=axes, label="PE(pos, i)")
    return _save(figure, os.fspath(path), dpi)
