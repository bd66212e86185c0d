"""Pictures: attention maps per layer and head, the learning-rate schedule, the positional encoding.

Everything draws on `matplotlib.figure.Figure` objects rendered by the Agg
backend (no window, no `pyplot` global state), so it works on servers and in
tests and never changes the backend a user has chosen.

Attention maps of one sentence:

1. the sentence is translated (beam search, or greedy with ``beam_size=1``),
   unless a translation is given;
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

Model code (`keras_transformer.model`, `decoding`) does the numbers; this module
only needs the tokenizers' ``tokenize`` and ``id_to_piece`` for a sentence.
"""

import dataclasses
import math
import os

import numpy as np
from matplotlib.figure import Figure

from keras_transformer import decoding
from keras_transformer.data.tokenizers import load_tokenizers
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import CheckpointNotFoundError
from keras_transformer.layers.position import sinusoidal_position_encoding
from keras_transformer.model import decode, encode, parts
from keras_transformer.schedules import NoamSchedule
from keras_transformer.translation import utf8_bytes
from keras_transformer.workdir import load_models

KINDS = ("encoder_self", "decoder_self", "cross")
LAYOUTS = ("grid", "heads")
_TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
           "cross": "encoder-decoder (cross) attention"}


@dataclasses.dataclass
class AttentionMaps:
    """The attention weights of one sentence pair, with the tokens for the axes.

    Attributes:
        source_tokens: S subword strings, the source then ``"</s>"``.
        target_inputs: T strings, the decoder inputs: ``"<s>"`` then the translation's subwords.
        target_outputs: T strings, what each decoder position predicts: the subwords then ``"</s>"``.
        translation: the detokenized translation (or the given target).
        encoder_self: per encoder layer, float32 ``(H, S, S)``.
        decoder_self: per decoder layer, float32 ``(H, T, T)``.
        cross: per decoder layer, float32 ``(H, T, S)``.
    """

    source_tokens: list
    target_inputs: list
    target_outputs: list
    translation: str
    encoder_self: list
    decoder_self: list
    cross: list

    def axes(self, kind):
        """`(weights per layer, row tokens, column tokens)` of one kind of attention.

        Example:

        >>> weights, rows, columns = maps.axes("cross")  # doctest: +SKIP
        >>> weights[0].shape == (len(weights[0]), len(rows), len(columns))  # doctest: +SKIP
        True
        """
        if kind == "encoder_self":
            return self.encoder_self, self.source_tokens, self.source_tokens
        if kind == "decoder_self":
            return self.decoder_self, self.target_outputs, self.target_inputs
        if kind == "cross":
            return self.cross, self.target_outputs, self.source_tokens
        raise ValueError(f"Unknown attention kind {kind!r}; choose one of {KINDS}.")


# ------------------------------------------------------------------ weights


def attention_weights(model, source_ids, target_ids, pad_id=0):
    """Every attention weight matrix of one teacher-forced pass (dropout off).

    Args:
        model: a `keras_transformer.build_model` model.
        source_ids: int ``(S,)`` source ids (tokens then eos), no padding.
        target_ids: int ``(T,)`` decoder inputs (bos then tokens), no padding.
        pad_id: the padding id.

    Returns:
        ``{"encoder_self": [(H, S, S)] * N_enc, "decoder_self": [(H, T, T)] * N_dec,
        "cross": [(H, T, S)] * N_dec}`` as float32 numpy arrays; every row sums to 1.

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> weights = attention_weights(model, np.array([5, 6, 3]), np.array([2, 9]))
    >>> [w.shape for w in weights["cross"]]
    [(4, 2, 3), (4, 2, 3)]
    """

    source = np.asarray(source_ids, dtype="int32").reshape(1, -1)  # (1, S)
    target = np.asarray(target_ids, dtype="int32").reshape(1, -1)  # (1, T)
    memory, source_padding, encoder_scores = encode(model, source, pad_id=pad_id, return_attention_scores=True)
    _, decoder_scores = decode(model, target, memory, source_padding, return_attention_scores=True)

    def first(weights):  # (1, H, Q, K) -> float32 (H, Q, K)
        return np.asarray(weights, dtype="float32")[0]

    return {"encoder_self": [first(w) for w in encoder_scores],
            "decoder_self": [first(layer["self"]) for layer in decoder_scores],
            "cross": [first(layer["cross"]) for layer in decoder_scores]}


def _pieces(tokenizer, ids):
    pieces = np.asarray(tokenizer.id_to_piece(np.asarray(ids, dtype="int32")))
    return [p.decode("utf-8") if isinstance(p, bytes) else str(p) for p in pieces.reshape(-1)]


def _text(sentence):
    """A sentence as valid text: bytes that are not UTF-8 (which Python keeps as lone surrogates in arguments and
    stdin, or given as `bytes`) become U+FFFD, as `Translator` does."""
    return utf8_bytes(sentence).decode("utf-8", "replace") if isinstance(sentence, (str, bytes)) else sentence


def _strip(ids, eos_id, pad_id, bos_id):
    """Ids up to (not including) the first eos, without pad/bos."""
    out = []
    for token in np.asarray(ids).reshape(-1).tolist():
        if token == eos_id:
            break
        if token not in (pad_id, bos_id):
            out.append(int(token))
    return out


def translate_with_attention(model, sentence, source_tokenizer, target_tokenizer=None, translation=None,
                             options=None, **settings):
    """Translates one sentence and collects its attention maps.

    Args:
        model: a `build_model` model.
        sentence: the source sentence (`str`, or UTF-8 `bytes`; bytes that are not UTF-8 become U+FFFD).
        source_tokenizer: a `SubwordTokenizer` (``tokenize``, ``id_to_piece``, special ids).
        target_tokenizer: the target one; defaults to `source_tokenizer` (shared vocabulary).
        translation: a target sentence to force instead of decoding (e.g. a reference).
        options: a `keras_transformer.decoding.DecodeOptions` (default: the paper's beam search);
            `settings` (`beam_size=1`, `strategy="greedy"`, ...) replace its fields.

    Returns:
        An `AttentionMaps`.

    Example:

    >>> maps = translate_with_attention(model, "A dog runs.", tokenizer)  # doctest: +SKIP
    >>> maps.translation, maps.cross[-1].shape  # doctest: +SKIP
    ('Ein Hund läuft.', (4, 5, 6))
    """

    target_tokenizer = target_tokenizer if target_tokenizer is not None else source_tokenizer
    sentence, translation = _text(sentence), _text(translation)
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"translate_with_attention needs a non-empty sentence, got {sentence!r}.")
    max_source = parts(model).source_position.max_length
    source_ids = np.asarray(source_tokenizer.tokenize([sentence])[0], dtype="int32")[: max_source - 1]
    source_ids = np.append(source_ids, source_tokenizer.eos_id).astype("int32")  # (S,)
    pad, bos, eos = target_tokenizer.pad_id, target_tokenizer.bos_id, target_tokenizer.eos_id

    if translation is None:
        options = (options or DecodeOptions()).replace(**settings)
        tokens, _ = decoding.strategy(options.strategy)([model], source_ids[None], options.replace(n_best=1),
                                                        pad_id=pad, bos_id=bos, eos_id=eos)
        target_ids = _strip(np.asarray(tokens)[0, 0], eos, pad, bos)
    else:
        target_ids = np.asarray(target_tokenizer.tokenize([translation])[0], dtype="int32").tolist()
    target_ids = target_ids[: decoding.max_positions(model) - 1]
    text = target_tokenizer.detokenize(np.asarray([target_ids + [eos]], dtype="int32"))
    text = np.asarray(text).reshape(-1)[0]
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text)

    decoder_inputs = np.asarray([bos] + target_ids, dtype="int32")  # (T,)
    decoder_outputs = np.asarray(target_ids + [eos], dtype="int32")  # (T,)
    weights = attention_weights(model, source_ids, decoder_inputs, pad_id=pad)
    return AttentionMaps(source_tokens=_pieces(source_tokenizer, source_ids),
                         target_inputs=_pieces(target_tokenizer, decoder_inputs),
                         target_outputs=_pieces(target_tokenizer, decoder_outputs),
                         translation=text, **weights)


# ------------------------------------------------------------------ drawing


def _heatmap(axes, weights, row_tokens, column_tokens, title, fontsize):
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    axes.set_xticks(range(len(column_tokens)))
    axes.set_xticklabels(column_tokens, rotation=90, fontsize=fontsize)
    axes.set_yticks(range(len(row_tokens)))
    axes.set_yticklabels(row_tokens, fontsize=fontsize)
    axes.set_title(title, fontsize=fontsize + 2)
    return image


def attention_figure(weights, row_tokens, column_tokens, title=None, columns=4, cell_inches=0.22):
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


def _save(figure, path, dpi):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


def plot_attention_maps(maps, out_dir, kinds=KINDS, layout="grid", dpi=110):
    """Writes the heatmaps of an `AttentionMaps` as PNG files.

    Args:
        maps: an `AttentionMaps` (from `translate_with_attention`).
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


def plot_attention(model, sentence, out_dir, source_tokenizer, target_tokenizer=None, translation=None,
                   options=None, kinds=KINDS, layout="grid", dpi=110, **settings):
    """Translates `sentence` and writes its attention maps: the one call behind ``plot-attention``.

    Also writes ``out_dir/translation.txt`` (source, translation and the
    subword tokens of both axes).

    Args:
        model: a `build_model` model.
        sentence: the source sentence.
        out_dir: the folder to write.
        source_tokenizer, target_tokenizer: `SubwordTokenizer`s (target defaults to source).
        translation: force this target instead of decoding.
        options, **settings: the decoding, as in `translate_with_attention`.
        kinds, layout, dpi: as in `plot_attention_maps`.

    Returns:
        ``(maps, paths)``: the `AttentionMaps` and the PNG paths written.

    Example:

    >>> from keras_transformer.data.tokenizers import load_tokenizers  # doctest: +SKIP
    >>> maps, paths = plot_attention(model, "A dog runs.", "out/", *load_tokenizers("vocab/"))  # doctest: +SKIP
    """
    maps = translate_with_attention(model, sentence, source_tokenizer, target_tokenizer, translation=translation,
                                    options=options, **settings)
    paths = plot_attention_maps(maps, out_dir, kinds=kinds, layout=layout, dpi=dpi)
    with open(os.path.join(os.fspath(out_dir), "translation.txt"), "w", encoding="utf-8") as f:
        f.write(f"source:       {_text(sentence)}\ntranslation:  {maps.translation}\n"
                f"source tokens: {' '.join(maps.source_tokens)}\n"
                f"target tokens: {' '.join(maps.target_outputs)}\n")
    return maps, paths


# ------------------------------------------------------------------ loading


def load_model(path, checkpoint=None, average=None):
    """Loads a model and its tokenizers from a training workdir (or an exported model folder).

    A training workdir holds ``model.yaml``, ``data/vocab/`` and
    ``checkpoints/ckpt-*.weights.h5`` (see `keras_transformer.training`). An
    exported model (`keras_transformer.export`) keeps the same three things in
    ``assets.extra/``: ``model.yaml``, ``vocab/`` and ``model.weights.h5``; any
    folder with ``model.yaml``, ``vocab/`` and one ``*.weights.h5`` file works.

    Args:
        path: the workdir or exported folder.
        checkpoint: a `.weights.h5` file to load instead of the latest one (workdirs only).
        average: average the last `average` checkpoints of a workdir (not with `checkpoint`).

    Raises:
        FileNotFoundError: a missing folder, or one without a model, vocabulary or weights.
        ValueError: `checkpoint` and `average` together, or either for an exported model.

    Returns:
        ``(model, source_tokenizer, target_tokenizer, config, options)``: the model's `TransformerConfig` and
        its decoding options.

    Example:

    >>> model, src, tgt, config, options = load_model("runs/multi30k_en_de", average=5)  # doctest: +SKIP
    """
    loaded = load_models(path, checkpoint, average)
    if loaded.vocab_dir is None:
        raise CheckpointNotFoundError(f"No tokenizer folder in {path}: expected data/vocab/ (a training workdir) "
                                      "or assets.extra/vocab/ (an exported model).")
    source_tokenizer, target_tokenizer = load_tokenizers(loaded.vocab_dir)
    return loaded.models[0], source_tokenizer, target_tokenizer, loaded.configs[0], loaded.decoding


def plot_attention_for_path(model_path, sentence, out_dir, checkpoint=None, average=None, beam_size=None,
                            translation=None, layout="grid", kinds=KINDS, dpi=110):
    """`plot_attention` for a model on disk: what ``keras-transformer plot-attention`` runs.

    Args:
        model_path: a training workdir or exported model folder (see `load_model`).
        sentence: the source sentence.
        out_dir: the folder to write.
        checkpoint, average: which weights (see `load_model`).
        beam_size: beam width; None takes the model config's (1: greedy).
        translation: force this target instead of decoding.
        layout, kinds, dpi: as in `plot_attention_maps`.

    The other decoding settings are the model's (its model.yaml's decoding
    options), so the translation drawn is the one the model serves.

    Returns:
        ``(maps, paths)`` as `plot_attention`.

    Example:

    >>> plot_attention_for_path("runs/multi30k_en_de", "A dog runs.", "attention/")  # doctest: +SKIP
    """
    model, source_tokenizer, target_tokenizer, _, options = load_model(model_path, checkpoint, average)
    return plot_attention(model, sentence, out_dir, source_tokenizer, target_tokenizer, translation=translation,
                          options=options, kinds=kinds, layout=layout, dpi=dpi, beam_size=beam_size)


# ------------------------------------------------------------------ schedule and positions


def plot_learning_rate_schedule(path, settings=((512, 4000), (512, 8000), (256, 4000), (128, 4000)),
                                steps=20000, dpi=110):
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


def plot_position_encoding(path, length=100, d_model=512, dpi=110):
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
