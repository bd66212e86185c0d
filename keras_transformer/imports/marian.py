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

from keras_transformer.data.tokenizers import MappedTokenizer, read_vocabulary
from keras_transformer.errors import ConfigError
from keras_transformer.imports.bart import BartFamily, output_bias_of, same
from keras_transformer.imports.family import assign
from keras_transformer.layers.position import sinusoidal_position_encoding

if TYPE_CHECKING:
    from keras_transformer.config import TransformerConfig
    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource
    from keras_transformer.model import TransformerParts

UNTIED = ("{name} differs from the matrix config.json says it shares (or, for positions, from Marian's sinusoids); "
          "this checkpoint is not the model its config.json describes.")


class MarianFamily(BartFamily):
    """OPUS-MT and every other ``MarianMTModel`` checkpoint.

    Example:

    >>> MarianFamily().name
    'marian'
    """

    name = "marian"
    description = "OPUS-MT / Marian (MarianMTModel)"
    logits_bias = True

    # ------------------------------------------------------------------ config
    def architecture(self, checkpoint: Checkpoint, tensors: WeightSource, where: str) -> dict[str, Any]:
        hf = checkpoint.config
        if hf.get("normalize_before") or hf.get("normalize_embedding") or hf.get("add_final_layer_norm"):
            raise ConfigError(f"{where}: normalize_before / normalize_embedding / add_final_layer_norm are not "
                              "Marian's post-norm layout; this importer reads MarianMTModel checkpoints.")
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
        return dict(
            vocab_size=vocab, source_vocab_size=None if shared else vocab,
            target_vocab_size=None if shared else target_vocab,
            pad_id=pad, unk_id=self._unk_id(checkpoint), bos_id=start, eos_id=int(hf["eos_token_id"]),
            max_length=int(hf.get("max_position_embeddings", 512)), position="sinusoidal",
            sinusoid_layout="concatenated", scale_embeddings=bool(hf.get("scale_embedding", False)),
            output_bias=output_bias_of(tensors), norm_first=False,
            tie_embeddings="all" if shared else ("decoder" if tied else "none"))

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
            # ids the vocabulary file does not name (a model padded to a round size) read as placeholders
            tokens = self.special_vocabulary(tokens, sizes[side], config, checkpoint.folder, side)
            result.append(MappedTokenizer(models[side], tokens, pad_id=config.pad_id, unk_id=config.unk_id,
                                          bos_id=config.bos_id, eos_id=config.eos_id, name=f"{side}_tokenizer"))
        return result[0], result[1]

    # ------------------------------------------------------------------ weights
    def assign_embeddings(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        """The three tying modes."""
        d = config.d_model
        if p.tie == "all":
            super().assign_embeddings(p, tensors, config)
            return
        if tensors.has("model.shared.weight"):
            tensors.skip("model.shared.weight")  # unused by a model with separate embeddings
        assign(p.source_embedding.embeddings,
               tensors.take("model.encoder.embed_tokens.weight", (config.src_vocab_size, d)),
               "model.encoder.embed_tokens.weight")
        target = tensors.take("model.decoder.embed_tokens.weight", (config.tgt_vocab_size, d))
        assign(p.target_embedding.embeddings, target, "model.decoder.embed_tokens.weight")
        if p.tie == "decoder":
            if tensors.has("lm_head.weight"):
                same(tensors.take("lm_head.weight", target.shape), target, UNTIED.format(name="lm_head.weight"))
        else:
            assert p.output_projection is not None  # tie_embeddings none: the model has its own softmax
            assign(p.output_projection.kernel, tensors.take("lm_head.weight", (config.tgt_vocab_size, d)).T,
                   "lm_head.weight")
        del target

    def untied_message(self, name: str) -> str:
        return UNTIED.format(name=name)

    def assign_positions(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        for side in ("encoder", "decoder"):
            name = f"model.{side}.embed_positions.weight"
            if tensors.has(name):  # Marian's fixed sinusoids, when a file keeps them: they must be the model's
                table = sinusoidal_position_encoding(config.max_length, config.d_model, config.sinusoid_layout)
                same(tensors.take(name, table.shape, exact=True), table, UNTIED.format(name=name), atol=1e-4)


__all__ = ["MarianFamily"]
