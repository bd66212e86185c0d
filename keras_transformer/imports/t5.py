"""T5 v1.1, mT5 and MADLAD-400 (``model_type: t5``, Hugging Face's ``T5ForConditionalGeneration``), and the
original T5, onto `TransformerConfig` and `build_model`'s weights.

How a checkpoint maps onto the package's model:

* pre-norm layers with RMS normalization, no mean and no bias (``T5LayerNorm``, ``layer_norm_epsilon``), and a
  final one after each stack: ``norm_first``, ``normalization: rms``;
* no position embeddings: bucketed relative position biases (``relative_attention_num_buckets``,
  ``relative_attention_max_distance``) held by the first layer of each stack and used by all its layers:
  ``position: relative_bias`` (bidirectional in the encoder, causal in the decoder's self-attention, none in
  cross-attention); a checkpoint with a bias in another layer is refused by name;
* projections without biases, attention logits not divided by sqrt(d_kv), embeddings not scaled: ``use_bias``,
  ``scale_attention_logits`` and ``scale_embeddings`` false; ``d_kv`` is ``key_dim``, whatever d_model / heads;
* ``feed_forward_proj``: ``relu`` (``wi``, ``wo``), or ``gated-gelu`` (``wi_0`` under GELU's tanh form times
  ``wi_1``, T5 v1.1 / mT5 / MADLAD) and the other ``gated-*``: ``gated_feed_forward``;
* one embedding for both sides (``shared``); a file with its own ``lm_head.weight`` (T5 v1.1, mT5, MADLAD): a
  softmax of its own (``tie_embeddings: embeddings``), else the shared matrix (``all``); the decoder's output
  multiplied by d_model ** -0.5 first (``scale_decoder_output``) where ``scale_decoder_outputs`` (transformers 5)
  or, before it, ``tie_word_embeddings`` says so (the original T5);
* the decoder starts from ``decoder_start_token_id``, the pad id 0 (``bos_id == pad_id``).

The tokenizer: ``spiece.model``'s ids as they are (pad 0, ``</s>`` 1, ``<unk>`` 2), then the sentinels
``<extra_id_N>`` (the last id is ``<extra_id_0>``), as transformers' ``T5Tokenizer`` numbers them (its
``tokenizer.json``, where the folder has one, gives the vocabulary); ``</s>`` closes a sentence. MADLAD-400's
target-language tokens ``<2xx>`` (pieces of its SentencePiece model) open a source: they are the source
tokenizer's `languages`. As ``T5Tokenizer`` (transformers 5), both sides cut the added tokens out of the text
wherever they stand (``<2de>Hello``, a literal ``</s>`` or ``<extra_id_0>``) and segment the text between them
as sentences of their own: tokenizer.json's ``added_tokens`` where the folder has one, else the special,
user-defined and control pieces of spiece.model and the sentinels.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.data.tokenizers import MappedTokenizer
from keras_transformer.errors import ConfigError, CorruptFileError
from keras_transformer.imports.family import ACTIVATIONS, Family, assign, per_head
from keras_transformer.model import parts

if TYPE_CHECKING:
    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource

SENTENCEPIECE = "spiece.model"
LANGUAGE = re.compile(r"<2[^<>\s]+>")  # MADLAD-400's target-language tokens: <2de>, <2zh_Latn>
RELATIVE_BIAS = "relative_attention_bias.weight"
# feed_forward_proj's activation -> Hugging Face's (T5Config: "gated-gelu" uses gelu_new, the tanh form)
T5_ACTIVATIONS = {"gelu": "gelu_new"}


class T5Family(Family):
    """T5 v1.1, mT5, MADLAD-400 and the original T5: every ``T5ForConditionalGeneration`` checkpoint whose
    relative position biases are shared across each stack's layers.

    Example:

    >>> T5Family().name
    't5'
    """

    name = "t5"
    description = "T5 / mT5 / MADLAD-400 (T5ForConditionalGeneration)"

    # ------------------------------------------------------------------ config
    def config(self, checkpoint: Checkpoint, tensors: WeightSource) -> TransformerConfig:
        hf = checkpoint.config
        where = f"{checkpoint.folder / 'config.json'}"
        if hf.get("is_encoder_decoder", True) is False:
            raise ConfigError(f"{where}: is_encoder_decoder false (T5's encoder alone) is not a translation model.")
        projection = str(hf.get("feed_forward_proj", "relu"))
        parts_ = projection.split("-")
        gated = parts_[0] == "gated"
        if len(parts_) > 2 or (len(parts_) == 2 and not gated):
            raise ConfigError(f"{where}: feed_forward_proj {projection!r} is not T5's `gated-{{act}}` or `{{act}}`.")
        activation = T5_ACTIVATIONS.get(parts_[-1], parts_[-1]) if gated else parts_[-1]
        if activation not in ACTIVATIONS:
            raise ConfigError(f"{where}: feed_forward_proj {projection!r}: the activation {parts_[-1]!r} is not one "
                              f"the package's model has ({', '.join(sorted(ACTIVATIONS))}).")
        encoder_layers = int(hf["num_layers"])
        decoder_layers = int(hf.get("num_decoder_layers") or encoder_layers)
        for side, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            for i in range(1, count):  # T5 keeps the stack's one table in its first layer; UMT5 has one per layer
                name = f"{side}.block.{i}.layer.0.SelfAttention.{RELATIVE_BIAS}"
                if tensors.has(name):
                    raise ConfigError(f"{checkpoint.weights_file}: {name}: a relative attention bias per layer "
                                      "(UMT5's) is not a model the package holds: its stacks share one table.")
        # A softmax of its own where config.json unties it (T5 v1.1, mT5, MADLAD-400 as published) or, as
        # transformers 5 writes tie_word_embeddings true for every T5, where the file holds an lm_head.weight that
        # is not the shared matrix. The decoder's output is rescaled where config.json says so (transformers 5's
        # scale_decoder_outputs; before it, tie_word_embeddings).
        if hf.get("tie_word_embeddings", True) is False:
            tied = False
        else:
            head = tensors.peek("lm_head.weight")
            tied = head is None or np.array_equal(np.asarray(head), np.asarray(tensors.peek("shared.weight")))
            del head
        scale = bool(hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True)))
        pad, eos = int(hf.get("pad_token_id", 0)), int(hf.get("eos_token_id", 1))
        start = hf.get("decoder_start_token_id")
        rate = float(hf.get("dropout_rate", 0.1))
        values = dict(
            vocab_size=int(hf["vocab_size"]), pad_id=pad, unk_id=self._unk_id(checkpoint), eos_id=eos,
            bos_id=pad if start is None else int(start),
            num_layers=encoder_layers, num_encoder_layers=encoder_layers, num_decoder_layers=decoder_layers,
            d_model=int(hf["d_model"]), num_heads=int(hf["num_heads"]), key_dim=int(hf["d_kv"]),
            d_ff=int(hf["d_ff"]), max_length=int(hf.get("n_positions") or 512), position="relative_bias",
            relative_attention_num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
            relative_attention_max_distance=int(hf.get("relative_attention_max_distance", 128)),
            scale_embeddings=False, scale_attention_logits=False, activation=ACTIVATIONS[activation],
            gated_feed_forward=gated, use_bias=False, norm_first=True, normalization="rms",
            layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-6)),
            tie_embeddings="all" if tied else "embeddings", scale_decoder_output=scale, output_bias=False,
            dropout=rate, attention_dropout=rate, ffn_dropout=rate)
        try:
            return TransformerConfig.from_dict(values)
        except ValueError as error:
            raise ConfigError(f"{where}: {error}") from None

    # ------------------------------------------------------------------ tokenizers
    def _vocabulary(self, checkpoint: Checkpoint) -> list[str]:
        """The tokens by id: tokenizer.json's where the folder has one, else spiece.model's and the sentinels."""
        return self._tokens(checkpoint)[0]

    def _tokens(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
        """The tokens by id and the added ones (cut out of the text wherever they stand, as ``T5Tokenizer`` does)."""
        path = checkpoint.folder / "tokenizer.json"
        if path.is_file():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                tokens = [str(entry[0]) for entry in saved["model"]["vocab"]]
                added = {entry["content"]: int(entry["id"]) for entry in saved.get("added_tokens", [])}
            except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
                raise CorruptFileError(f"{path} is not a tokenizers-library Unigram tokenizer.json (its model's "
                                       f"vocab and added_tokens): {' '.join(str(error).split())[:160]}.") from None
            for token, index in added.items():
                tokens += [f"<unused_{i}>" for i in range(len(tokens), index + 1)]
                tokens[index] = token
            return tokens, list(added)
        from sentencepiece import sentencepiece_model_pb2
        proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf code
        path = self._sentencepiece(checkpoint)
        try:
            proto.ParseFromString(path.read_bytes())
        except Exception as error:  # protobuf's DecodeError
            raise CorruptFileError(f"{path} is not a SentencePiece model: {' '.join(str(error).split())[:160]}.") \
                from None
        tokens = [piece.piece for piece in proto.pieces]
        kept = (proto.SentencePiece.CONTROL, proto.SentencePiece.UNKNOWN, proto.SentencePiece.USER_DEFINED)
        extra = int(self.settings(checkpoint).get("extra_ids", 100))
        sentinels = [f"<extra_id_{i}>" for i in reversed(range(extra))]
        return tokens + sentinels, [piece.piece for piece in proto.pieces if piece.type in kept] + sentinels

    def _sentencepiece(self, checkpoint: Checkpoint) -> Any:
        return checkpoint.file(SENTENCEPIECE, "SentencePiece model (the Hub folders hold it; transformers 5 saves "
                                              "T5's tokenizer without it: copy it beside tokenizer.json)")

    def _unk_id(self, checkpoint: Checkpoint) -> int:
        tokens = self._vocabulary(checkpoint)
        if "<unk>" not in tokens:
            raise ConfigError(f"{checkpoint.folder}: the vocabulary has no <unk> token.")
        return tokens.index("<unk>")

    def tokenizers(self, checkpoint: Checkpoint, config: TransformerConfig) -> tuple[Any, Any]:
        tokens, added = self._tokens(checkpoint)
        model = self._sentencepiece(checkpoint).read_bytes()
        if len(tokens) > config.vocab_size:
            raise ConfigError(f"{checkpoint.folder}: the vocabulary has {len(tokens)} tokens but config.json's "
                              f"vocab_size is {config.vocab_size}.")
        tokens = tokens + [f"<unused_{index}>" for index in range(len(tokens), config.vocab_size)]
        for name, token in (("pad_id", "<pad>"), ("eos_id", "</s>"), ("unk_id", "<unk>")):
            if tokens[getattr(config, name)] != token:
                raise ConfigError(f"{checkpoint.folder}: config.json's {name.replace('_id', '_token_id')} "
                                  f"{getattr(config, name)} is {tokens[getattr(config, name)]!r} in the vocabulary, "
                                  f"not {token}.")
        languages = [token for token in tokens if LANGUAGE.fullmatch(token)]
        sentinels = [token for token in tokens if token.startswith("<extra_id_")]
        common: dict[str, Any] = dict(pad_id=config.pad_id, unk_id=config.unk_id, bos_id=config.bos_id,
                                      eos_id=config.eos_id, special_tokens=sentinels, split_tokens=added)
        source = MappedTokenizer(model, tokens, languages=languages, name="source_tokenizer", **common)
        target = MappedTokenizer(model, tokens, name="target_tokenizer", **common)
        return source, target

    # ------------------------------------------------------------------ weights
    def assign_weights(self, model: Any, tensors: WeightSource, config: TransformerConfig) -> None:
        p = parts(model)
        d, heads, dk = config.d_model, config.num_heads, config.head_dim
        shared = tensors.take("shared.weight", (config.vocab_size, d))
        names = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
        if config.tie_embeddings == "all":
            names.append("lm_head.weight")
        for name in names:
            if tensors.has(name) and not np.array_equal(tensors.take(name, shared.shape), shared):
                raise ConfigError(f"{name} differs from shared.weight, which config.json says it is; this "
                                  "checkpoint is not the model its config.json describes.")
        assign(p.source_embedding.embeddings, shared, "shared.weight")
        del shared
        if p.output_projection is not None:
            assign(p.output_projection.kernel, tensors.take("lm_head.weight", (config.tgt_vocab_size, d)).T,
                   "lm_head.weight")
        for side, stack, layers in (("encoder", p.encoder, p.encoder.encoder_layers),
                                    ("decoder", p.decoder, p.decoder.decoder_layers)):
            name = f"{side}.block.0.layer.0.SelfAttention.{RELATIVE_BIAS}"
            assign(stack.relative_position_bias.embeddings,
                   tensors.take(name, (config.relative_attention_num_buckets, heads)), name)
            for i, layer in enumerate(layers):
                prefix = f"{side}.block.{i}.layer"
                blocks = [(layer.self_attention_block, "0"), (layer.feed_forward_block, "1")]
                _self_attention(tensors, layer.self_attention, f"{prefix}.0.SelfAttention", d, heads, dk)
                if side == "decoder":
                    _cross_attention(tensors, layer.cross_attention, f"{prefix}.1.EncDecAttention", d, heads, dk)
                    blocks = [(layer.self_attention_block, "0"), (layer.cross_attention_block, "1"),
                              (layer.feed_forward_block, "2")]
                for block, index in blocks:
                    _norm(tensors, block.norm, f"{prefix}.{index}.layer_norm", d)
                _feed_forward(tensors, layer.feed_forward, f"{prefix}.{blocks[-1][1]}.DenseReluDense", d,
                              config.d_ff)
            _norm(tensors, stack.final_norm, f"{side}.final_layer_norm", d)


def _kernel(tensors: Any, name: str, rows: int, columns: int) -> np.ndarray:
    """A bias-free PyTorch Linear's weight `(out, in)` as a Keras kernel `(in, out)`."""
    return tensors.take(f"{name}.weight", (rows, columns)).T


def _dense(tensors: Any, layer: Any, name: str, rows: int, columns: int) -> None:
    assign(layer.kernel, _kernel(tensors, name, rows, columns), f"{name}.weight")


def _norm(tensors: Any, layer: Any, name: str, d: int) -> None:
    assign(layer.gamma, tensors.take(f"{name}.weight", (d,)), f"{name}.weight")


def _self_attention(tensors: Any, attention: Any, name: str, d: int, heads: int, dk: int) -> None:
    kernels = [_kernel(tensors, f"{name}.{proj}", heads * dk, d) for proj in "qkv"]
    assign(attention.qkv_dense.kernel, per_head(kernels, heads), f"{name}.q.weight")
    _dense(tensors, attention.output_dense, f"{name}.o", d, heads * dk)


def _cross_attention(tensors: Any, attention: Any, name: str, d: int, heads: int, dk: int) -> None:
    _dense(tensors, attention.query_dense, f"{name}.q", heads * dk, d)
    kernels = [_kernel(tensors, f"{name}.{proj}", heads * dk, d) for proj in "kv"]
    assign(attention.key_value_dense.kernel, per_head(kernels, heads), f"{name}.k.weight")
    _dense(tensors, attention.output_dense, f"{name}.o", d, heads * dk)


def _feed_forward(tensors: Any, layer: Any, name: str, d: int, d_ff: int) -> None:
    if layer.inner_linear is not None:  # gated: wi_0 under the activation, times wi_1
        _dense(tensors, layer.inner, f"{name}.wi_0", d_ff, d)
        _dense(tensors, layer.inner_linear, f"{name}.wi_1", d_ff, d)
    else:
        _dense(tensors, layer.inner, f"{name}.wi", d_ff, d)
    _dense(tensors, layer.outer, f"{name}.wo", d, d_ff)


__all__ = ["T5Family"]
