"""`BartFamily`: what BART-like checkpoints share (Marian, M2M-100 / NLLB, mBART), written once; a family overrides
only what differs, as CTranslate2's ``MarianMTLoader(BartLoader)`` does.

A BART-like checkpoint names its tensors alike: ``model.shared`` (or ``model.encoder.embed_tokens`` and
``model.decoder.embed_tokens``), ``model.{encoder,decoder}.layers.N.{self_attn,encoder_attn}.{q,k,v,out}_proj``,
``*_layer_norm``, ``fc1`` / ``fc2``, optional final norms (``model.{side}.layer_norm``), embedding norms
(``model.{side}.layernorm_embedding``), ``lm_head`` and ``final_logits_bias``; and its config.json names its sizes
alike (``d_model``, ``encoder_layers``, ``encoder_ffn_dim``, ...). The base class maps those; a family gives:

* `architecture(checkpoint, tensors, where)`: the `TransformerConfig` fields only it knows (vocabulary, special
  ids, positions, norms, tying), merged over `sizes` (the shared ones);
* `tokenizers(checkpoint, config)`, with `special_vocabulary` to pad and check its vocabulary;
* hooks of `assign_weights` where its tensors differ: `assign_embeddings`, `assign_output_bias`,
  `assign_positions`.

Example:

>>> BartFamily.prefix
'model'
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.errors import ConfigError, CorruptFileError
from keras_transformer.imports.family import (
    LAYER_NORM_EPSILON,
    Family,
    activation_of,
    assign,
    cross_attention,
    feed_forward,
    norm,
    one_size,
    self_attention,
)
from keras_transformer.model import parts

if TYPE_CHECKING:
    import pathlib

    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource
    from keras_transformer.model import TransformerParts

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's first ids, before SentencePiece's pieces


def config_from(values: dict[str, Any], where: str) -> TransformerConfig:
    """`TransformerConfig.from_dict(values)`, a field it refuses named with `where` (config.json)."""
    try:
        return TransformerConfig.from_dict(values)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def same(value: np.ndarray, expected: np.ndarray, message: str, atol: float = 0.0, rows: int = 4096) -> None:
    """Refuses (`ConfigError` with `message`) a copy of a matrix that is not `expected`, compared a block of rows
    at a time: no temporaries the size of an embedding matrix."""
    if not all(np.allclose(value[start:start + rows], expected[start:start + rows], atol=atol, rtol=0)
               for start in range(0, len(value), rows)):
        raise ConfigError(message)


def fairseq_vocabulary(checkpoint: Checkpoint, sentencepiece_file: pathlib.Path, listed: list[str],
                       special: tuple[str, ...] = ("<mask>",)) -> tuple[list[str], list[str]]:
    """`(tokens by id, language tokens)` of a fairseq vocabulary over a SentencePiece model (NLLB, mBART): from the
    checkpoint's ``tokenizer.json`` where it has one (its model's vocab, a mapping or a list by id, and its added
    tokens), else computed: ``<s> <pad> </s> <unk>``, SentencePiece's pieces one id up, the languages `listed`,
    then `special` (``<mask>``)."""
    path = checkpoint.folder / "tokenizer.json"
    if path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            vocab = saved["model"]["vocab"]
            mapping = dict(vocab) if isinstance(vocab, dict) else {str(entry[0]): i for i, entry in enumerate(vocab)}
            added = {entry["content"]: int(entry["id"]) for entry in saved.get("added_tokens", [])}
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
            raise CorruptFileError(f"{path} is not a tokenizers-library tokenizer.json (its model's vocab and "
                                   f"added_tokens): {' '.join(str(error).split())[:160]}.") from None
        mapping.update(added)
        tokens: list[Any] = [None] * (max(mapping.values()) + 1)
        for token, index in mapping.items():
            tokens[index] = token
        tokens = [f"<unused_{i}>" if token is None else token for i, token in enumerate(tokens)]
        return tokens, [token for token in added if token not in FAIRSEQ_SPECIALS and token not in special]
    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_file))
    tokens = list(FAIRSEQ_SPECIALS) + [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    return tokens + listed + list(special), list(listed)


class BartFamily(Family):
    """A BART-like family: the shared sizes, the layers' weights, the special-token checks.

    Example:

    >>> BartFamily().default_activation
    'gelu'
    """

    prefix = "model"  # of the encoder's and decoder's tensor names
    default_activation = "gelu"  # activation_function where config.json has none
    logits_bias = False  # whether every checkpoint of the family has a final_logits_bias

    # ------------------------------------------------------------------ config
    def config(self, checkpoint: Checkpoint, tensors: WeightSource) -> TransformerConfig:
        where = f"{checkpoint.folder / 'config.json'}"
        values = {**self.sizes(checkpoint.config, where), **self.architecture(checkpoint, tensors, where)}
        return config_from(values, where)

    def sizes(self, hf: dict[str, Any], where: str) -> dict[str, Any]:
        """The `TransformerConfig` fields every BART-like config.json names alike: depths, widths, heads, the
        activation, dropouts, PyTorch's LayerNorm epsilon."""
        heads = one_size(hf, where, "encoder_attention_heads", "decoder_attention_heads")
        d_ff = one_size(hf, where, "encoder_ffn_dim", "decoder_ffn_dim")
        return dict(
            num_layers=int(hf["encoder_layers"]), num_encoder_layers=int(hf["encoder_layers"]),
            num_decoder_layers=int(hf["decoder_layers"]), d_model=int(hf["d_model"]), num_heads=int(heads),
            d_ff=int(d_ff), activation=activation_of(hf, where, self.default_activation),
            layer_norm_epsilon=LAYER_NORM_EPSILON, dropout=float(hf.get("dropout", 0.1)),
            attention_dropout=float(hf.get("attention_dropout", 0.0)),
            ffn_dropout=float(hf.get("activation_dropout", 0.0)))

    @staticmethod
    def check_tied(hf: dict[str, Any], where: str) -> None:
        """Refuses a config.json that unties the output from the shared embedding (the package ties all three)."""
        if not hf.get("tie_word_embeddings", True):
            raise ConfigError(f"{where}: tie_word_embeddings false (one embedding for both sides, a softmax of its "
                              "own) is not a tying mode of the package (all, decoder, none).")

    def architecture(self, checkpoint: Checkpoint, tensors: WeightSource, where: str) -> dict[str, Any]:
        """The family's own `TransformerConfig` fields (vocabulary, special ids, positions, norms, tying)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tokenizers
    @staticmethod
    def special_vocabulary(tokens: list[str], size: int, config: TransformerConfig, where: Any,
                           side: str = "") -> list[str]:
        """`tokens` padded with placeholders to `size` ids (a model padded to a round size), after checking that
        config.json's pad, eos and unk ids are ``<pad>``, ``</s>`` and ``<unk>`` there.

        Example:

        >>> config = TransformerConfig(vocab_size=5, pad_id=1, unk_id=3, bos_id=2, eos_id=2)
        >>> BartFamily.special_vocabulary(["<s>", "<pad>", "</s>", "<unk>"], 5, config, "here")[-1]
        '<unused_4>'
        """
        vocabulary = f"{side} vocabulary" if side else "vocabulary"
        if len(tokens) > size:
            raise ConfigError(f"{where}: the {vocabulary} has {len(tokens)} tokens but "
                              + (f"the model's {side} embedding has {size} rows." if side else
                                 f"config.json's vocab_size is {size}."))
        tokens = tokens + [f"<unused_{index}>" for index in range(len(tokens), size)]
        for name, token in (("pad_id", "<pad>"), ("eos_id", "</s>"), ("unk_id", "<unk>")):
            if tokens[getattr(config, name)] != token:
                raise ConfigError(f"{where}: config.json's {name.replace('_id', '_token_id')} {getattr(config, name)} "
                                  f"is {tokens[getattr(config, name)]!r} in the {vocabulary}, not {token}.")
        return tokens

    # ------------------------------------------------------------------ weights
    def assign_weights(self, model: Any, tensors: WeightSource, config: TransformerConfig) -> None:
        p = parts(model)
        self.assign_embeddings(p, tensors, config)
        self.assign_output_bias(p, tensors, config)
        self.assign_positions(p, tensors, config)
        d, heads, dk, dv = config.d_model, config.num_heads, config.head_dim, config.head_value_dim
        for side, stack, layers in (("encoder", p.encoder, p.encoder.encoder_layers),
                                    ("decoder", p.decoder, p.decoder.decoder_layers)):
            for i, layer in enumerate(layers):
                prefix = f"{self.prefix}.{side}.layers.{i}"
                self_attention(tensors, layer.self_attention, f"{prefix}.self_attn", d, heads, dk, dv)
                norm(tensors, layer.self_attention_block.norm, f"{prefix}.self_attn_layer_norm", d)
                if side == "decoder":
                    cross_attention(tensors, layer.cross_attention, f"{prefix}.encoder_attn", d, heads, dk, dv)
                    norm(tensors, layer.cross_attention_block.norm, f"{prefix}.encoder_attn_layer_norm", d)
                feed_forward(tensors, layer.feed_forward, prefix, d, config.d_ff)
                norm(tensors, layer.feed_forward_block.norm, f"{prefix}.final_layer_norm", d)
            if stack.final_norm is not None:  # pre-norm's final LayerNorm
                norm(tensors, stack.final_norm, f"{self.prefix}.{side}.layer_norm", d)
        for side, layer in (("encoder", p.source_embedding_norm), ("decoder", p.target_embedding_norm)):
            if layer is not None:
                norm(tensors, layer, f"{self.prefix}.{side}.layernorm_embedding", d)

    def assign_embeddings(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        """One embedding for the encoder, the decoder and the softmax (``model.shared``; the copies a file keeps
        must equal it)."""
        shared = tensors.take(f"{self.prefix}.shared.weight", (config.vocab_size, config.d_model))
        for name in (f"{self.prefix}.encoder.embed_tokens.weight", f"{self.prefix}.decoder.embed_tokens.weight",
                     "lm_head.weight"):
            if tensors.has(name):  # a copy of the shared matrix, where the file keeps one
                same(tensors.take(name, shared.shape), shared, self.untied_message(name))
        assign(p.source_embedding.embeddings, shared, f"{self.prefix}.shared.weight")
        del shared  # the largest matrix: not held while the layers are copied

    def assign_output_bias(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        """``final_logits_bias`` (required with `logits_bias`) into the model's output bias, where it has one
        (`output_bias_of`: the bias is not all zeros)."""
        if self.logits_bias or tensors.has("final_logits_bias"):
            bias = tensors.take("final_logits_bias", (1, config.tgt_vocab_size))
            if p.output_bias is not None:
                assign(p.output_bias.bias, bias[0], "final_logits_bias")

    def untied_message(self, name: str) -> str:
        """What `assign_embeddings` says of a copy of the shared matrix that differs from it."""
        return (f"{name} differs from {self.prefix}.shared.weight, which config.json says it is "
                "(tie_word_embeddings); this checkpoint is not the model its config.json describes.")

    def assign_positions(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        """Positions: none stored (the model computes its sinusoids) unless a family says otherwise."""


def output_bias_of(tensors: WeightSource) -> bool:
    """Whether ``final_logits_bias`` is there and not all zeros (`TransformerConfig.output_bias`)."""
    bias = tensors.peek("final_logits_bias")
    return bias is not None and bool(np.any(bias != 0))


__all__ = ["BartFamily", "FAIRSEQ_SPECIALS", "config_from", "fairseq_vocabulary", "output_bias_of", "same"]
