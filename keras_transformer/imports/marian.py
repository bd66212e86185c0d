"""OPUS-MT / Marian (``model_type: marian``, Hugging Face's ``MarianMTModel``) onto `TransformerConfig` and
`build_model`'s weights.

How a Marian checkpoint maps onto the package's model:

* post-norm layers (``self_attn_layer_norm`` after attention, ``final_layer_norm``
  after the feed-forward network), LayerNorm epsilon 1e-5 (PyTorch's default);
* token embeddings x sqrt(d_model) (``scale_embedding``) plus sinusoids laid out
  sines first, cosines after (``sinusoid_layout: concatenated``), positions from 0;
* ``share_encoder_decoder_embeddings`` and ``tie_word_embeddings`` -> ``tie_embeddings``
  "all" (one matrix), "decoder" (separate vocabularies, target embedding = softmax) or "none";
* ``activation_function`` -> ``activation`` (swish is SiLU; gelu the erf form; gelu_new the tanh form);
* ``final_logits_bias`` -> ``output_bias`` (kept when it is not all zeros);
* the decoder starts from the pad id (``decoder_start_token_id``): ``bos_id == pad_id``;
* q/k/v projections -> the fused per-head projections of the package's attention layers.

The vocabulary: ``vocab.json`` (``target_vocab.json`` too for separate vocabularies)
numbers the pieces ``source.spm`` / ``target.spm`` cut (`MappedTokenizer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.data.tokenizers import MappedTokenizer, read_vocabulary
from keras_transformer.errors import ConfigError
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
from keras_transformer.layers.position import sinusoidal_position_encoding
from keras_transformer.model import parts

if TYPE_CHECKING:
    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource


class MarianFamily(Family):
    """OPUS-MT and every other ``MarianMTModel`` checkpoint.

    Example:

    >>> MarianFamily().name
    'marian'
    """

    name = "marian"
    description = "OPUS-MT / Marian (MarianMTModel)"

    # ------------------------------------------------------------------ config
    def config(self, checkpoint: Checkpoint, tensors: WeightSource) -> TransformerConfig:
        hf = checkpoint.config
        where = f"{checkpoint.folder / 'config.json'}"

        heads = one_size(hf, where, "encoder_attention_heads", "decoder_attention_heads")
        d_ff = one_size(hf, where, "encoder_ffn_dim", "decoder_ffn_dim")
        if hf.get("normalize_before") or hf.get("normalize_embedding") or hf.get("add_final_layer_norm"):
            raise ConfigError(f"{where}: normalize_before / normalize_embedding / add_final_layer_norm are not "
                              "Marian's post-norm layout; this importer reads MarianMTModel checkpoints.")
        activation = activation_of(hf, where, "gelu")
        shared = bool(hf.get("share_encoder_decoder_embeddings", True))
        tied = bool(hf.get("tie_word_embeddings", True))
        if shared and not tied:
            raise ConfigError(f"{where}: share_encoder_decoder_embeddings with tie_word_embeddings false (one "
                              "embedding for both sides, a softmax of its own) is not a tying mode of the package "
                              "(all, decoder, none).")
        vocab = int(hf["vocab_size"])
        target_vocab = vocab if shared else int(hf.get("decoder_vocab_size") or vocab)
        pad = int(hf["pad_token_id"])
        start = int(hf.get("decoder_start_token_id", pad) if hf.get("decoder_start_token_id") is not None else pad)
        eos = int(hf["eos_token_id"])
        unk = self._unk_id(checkpoint)
        bias = tensors.peek("final_logits_bias")
        values = dict(
            vocab_size=vocab, source_vocab_size=None if shared else vocab,
            target_vocab_size=None if shared else target_vocab,
            pad_id=pad, unk_id=unk, bos_id=start, eos_id=eos,
            num_layers=int(hf["encoder_layers"]), num_encoder_layers=int(hf["encoder_layers"]),
            num_decoder_layers=int(hf["decoder_layers"]), d_model=int(hf["d_model"]), num_heads=int(heads),
            d_ff=int(d_ff), max_length=int(hf.get("max_position_embeddings", 512)), position="sinusoidal",
            sinusoid_layout="concatenated", scale_embeddings=bool(hf.get("scale_embedding", False)),
            activation=activation, output_bias=bias is not None and bool(np.any(bias != 0)),
            layer_norm_epsilon=LAYER_NORM_EPSILON, norm_first=False,
            tie_embeddings="all" if shared else ("decoder" if tied else "none"),
            dropout=float(hf.get("dropout", 0.1)), attention_dropout=float(hf.get("attention_dropout", 0.0)),
            ffn_dropout=float(hf.get("activation_dropout", 0.0)))
        try:
            return TransformerConfig.from_dict(values)
        except ValueError as error:
            raise ConfigError(f"{where}: {error}") from None

    # ------------------------------------------------------------------ tokenizers
    def _vocabularies(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
        source = read_vocabulary(checkpoint.file("vocab.json", "vocabulary (token -> id)"))
        separate = (checkpoint.folder / "target_vocab.json").is_file()
        target = read_vocabulary(checkpoint.file("target_vocab.json", "target vocabulary")) if separate else source
        return source, target

    def _unk_id(self, checkpoint: Checkpoint) -> int:
        source, _ = self._vocabularies(checkpoint)
        if "<unk>" not in source:
            raise ConfigError(f"{checkpoint.folder / 'vocab.json'} has no <unk> token.")
        return source.index("<unk>")

    def tokenizers(self, checkpoint: Checkpoint, config: TransformerConfig) -> tuple[Any, Any]:
        source_tokens, target_tokens = self._vocabularies(checkpoint)
        models = {side: checkpoint.file(f"{side}.spm", f"{side} SentencePiece model").read_bytes()
                  for side in ("source", "target")}
        sizes = {"source": config.src_vocab_size, "target": config.tgt_vocab_size}
        result = []
        for side, tokens in (("source", source_tokens), ("target", target_tokens)):
            if len(tokens) > sizes[side]:
                raise ConfigError(f"{checkpoint.folder}: the {side} vocabulary has {len(tokens)} tokens but the "
                                  f"model's {side} embedding has {sizes[side]} rows.")
            # ids the vocabulary file does not name (a model padded to a round size) read as placeholders
            tokens = tokens + [f"<unused_{index}>" for index in range(len(tokens), sizes[side])]
            for name, token in (("pad_id", "<pad>"), ("eos_id", "</s>"), ("unk_id", "<unk>")):
                if tokens[getattr(config, name)] != token:
                    raise ConfigError(f"{checkpoint.folder}: config.json's {name.replace('_id', '_token_id')} "
                                      f"{getattr(config, name)} is {tokens[getattr(config, name)]!r} in the {side} "
                                      f"vocabulary, not {token}.")
            result.append(MappedTokenizer(models[side], tokens, pad_id=config.pad_id, unk_id=config.unk_id,
                                          bos_id=config.bos_id, eos_id=config.eos_id, name=f"{side}_tokenizer"))
        return result[0], result[1]

    # ------------------------------------------------------------------ weights
    def assign_weights(self, model: Any, tensors: WeightSource, config: TransformerConfig) -> None:
        p = parts(model)
        d, heads, dk, dv = config.d_model, config.num_heads, config.head_dim, config.head_value_dim
        if p.tie == "all":
            shared = tensors.take("model.shared.weight", (config.vocab_size, d))
            for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
                if tensors.has(name):  # a copy of the shared matrix, where the file keeps one
                    _same(tensors.take(name, shared.shape), shared, name)
            assign(p.source_embedding.embeddings, shared, "model.shared.weight")
            del shared  # the largest matrix: not held while the layers are copied
        else:
            if tensors.has("model.shared.weight"):
                tensors.skip("model.shared.weight")  # unused by a model with separate embeddings
            assign(p.source_embedding.embeddings,
                   tensors.take("model.encoder.embed_tokens.weight", (config.src_vocab_size, d)),
                   "model.encoder.embed_tokens.weight")
            target = tensors.take("model.decoder.embed_tokens.weight", (config.tgt_vocab_size, d))
            assign(p.target_embedding.embeddings, target, "model.decoder.embed_tokens.weight")
            if p.tie == "decoder":
                if tensors.has("lm_head.weight"):
                    _same(tensors.take("lm_head.weight", target.shape), target, "lm_head.weight")
            else:
                assert p.output_projection is not None  # tie_embeddings none: the model has its own softmax
                assign(p.output_projection.kernel, tensors.take("lm_head.weight", (config.tgt_vocab_size, d)).T,
                       "lm_head.weight")
            del target
        bias = tensors.take("final_logits_bias", (1, config.tgt_vocab_size))
        if p.output_bias is not None:
            assign(p.output_bias.bias, bias[0], "final_logits_bias")
        for side, length in (("encoder", config.max_length), ("decoder", config.max_length)):
            name = f"model.{side}.embed_positions.weight"
            if tensors.has(name):  # Marian's fixed sinusoids, when a file keeps them: they must be the model's
                table = sinusoidal_position_encoding(length, d, config.sinusoid_layout)
                _same(tensors.take(name, table.shape), table, name, atol=1e-4)
        for i, layer in enumerate(p.encoder.encoder_layers):
            prefix = f"model.encoder.layers.{i}"
            self_attention(tensors, layer.self_attention, f"{prefix}.self_attn", d, heads, dk, dv)
            norm(tensors, layer.self_attention_block.norm, f"{prefix}.self_attn_layer_norm", d)
            feed_forward(tensors, layer.feed_forward, prefix, d, config.d_ff)
            norm(tensors, layer.feed_forward_block.norm, f"{prefix}.final_layer_norm", d)
        for i, layer in enumerate(p.decoder.decoder_layers):
            prefix = f"model.decoder.layers.{i}"
            self_attention(tensors, layer.self_attention, f"{prefix}.self_attn", d, heads, dk, dv)
            norm(tensors, layer.self_attention_block.norm, f"{prefix}.self_attn_layer_norm", d)
            cross_attention(tensors, layer.cross_attention, f"{prefix}.encoder_attn", d, heads, dk, dv)
            norm(tensors, layer.cross_attention_block.norm, f"{prefix}.encoder_attn_layer_norm", d)
            feed_forward(tensors, layer.feed_forward, prefix, d, config.d_ff)
            norm(tensors, layer.feed_forward_block.norm, f"{prefix}.final_layer_norm", d)


def _same(value: np.ndarray, expected: np.ndarray, name: str, atol: float = 0.0,
          rows: int = 4096) -> None:
    # compared a block of rows at a time: no temporaries the size of an embedding matrix
    if not all(np.allclose(value[start:start + rows], expected[start:start + rows], atol=atol, rtol=0)
               for start in range(0, len(value), rows)):
        raise ConfigError(f"{name} differs from the matrix config.json says it shares (or, for positions, from "
                          "Marian's sinusoids); this checkpoint is not the model its config.json describes.")


__all__ = ["MarianFamily"]
