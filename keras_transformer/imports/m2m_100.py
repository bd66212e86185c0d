"""M2M-100 and NLLB-200 (``model_type: m2m_100``, Hugging Face's ``M2M100ForConditionalGeneration``) onto
`TransformerConfig` and `build_model`'s weights.

How a checkpoint maps onto the package's model:

* pre-norm layers (``self_attn_layer_norm`` before attention, ``final_layer_norm``
  before the feed-forward network) and a final LayerNorm after each stack
  (``model.encoder.layer_norm``, ``model.decoder.layer_norm``): ``norm_first``,
  LayerNorm epsilon 1e-5 (PyTorch's default);
* token embeddings x sqrt(d_model) (``scale_embedding``) plus fairseq's sinusoids
  (sines then cosines of pos / 10000^(i / (d/2 - 1)): ``sinusoid_layout: fairseq``)
  numbered from ``pad_token_id + 1`` (``position_offset``); the table is computed,
  not stored, in the checkpoint and in the model alike;
* one embedding for the encoder, the decoder and the softmax (``tie_embeddings: all``),
  no output bias;
* ``activation_function`` -> ``activation``;
* the decoder starts from ``decoder_start_token_id``, which is eos (``bos_id == eos_id``);
  the target language is forced as the first generated token (``forced_bos_token_id``),
  which the package does with a target prefix (``--target-lang``).

The tokenizer, by ``tokenizer_config.json``'s ``tokenizer_class``:

* ``M2M100Tokenizer``: ``sentencepiece.bpe.model`` segments, ``vocab.json`` numbers
  the pieces, the language tokens ``__xx__`` follow the vocabulary in the order of
  the checkpoint's ``language_codes`` (fairseq's lists, below);
* ``NllbTokenizer``: ``sentencepiece.bpe.model`` segments, ``tokenizer.json`` numbers
  the pieces and the language codes (``eng_Latn``: fairseq's numbering, SentencePiece's
  ids shifted by one after ``<s> <pad> </s> <unk>``); without a ``tokenizer.json``,
  that numbering is computed, with the languages of ``tokenizer_config.json`` after
  the pieces and ``<mask>`` last.

A source is ``[src_lang] tokens </s>`` (``src_lang`` of ``tokenizer_config.json``, or a
language token the sentence opens with); a target ``[tgt_lang] tokens </s>`` where the
checkpoint names a ``tgt_lang`` (`MappedTokenizer`'s ``languages`` and ``language``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_transformer.data.tokenizers import MappedTokenizer, read_vocabulary
from keras_transformer.errors import CheckpointNotFoundError, ConfigError
from keras_transformer.imports.bart import BartFamily, fairseq_vocabulary
from keras_transformer.imports.family import TOKENIZER_CONFIG

if TYPE_CHECKING:
    import pathlib

    from keras_transformer.config import TransformerConfig
    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource

# fairseq's language lists of M2M100Tokenizer (tokenizer_config.json's language_codes), in id order
LANGUAGE_CODES = {
    "m2m100": ("af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he "
               "hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no "
               "ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo "
               "zh zu").split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
SENTENCEPIECE = "sentencepiece.bpe.model"


class M2M100Family(BartFamily):
    """M2M-100, NLLB-200 and every other ``M2M100ForConditionalGeneration`` checkpoint.

    Example:

    >>> M2M100Family().name
    'm2m_100'
    """

    name = "m2m_100"
    description = "M2M-100 / NLLB-200 (M2M100ForConditionalGeneration)"
    default_activation = "relu"

    # ------------------------------------------------------------------ config
    def architecture(self, checkpoint: Checkpoint, tensors: WeightSource, where: str) -> dict[str, Any]:
        hf = checkpoint.config
        self.check_tied(hf, where)
        pad, eos = int(hf["pad_token_id"]), int(hf["eos_token_id"])
        start = hf.get("decoder_start_token_id")
        return dict(
            vocab_size=int(hf["vocab_size"]), pad_id=pad, unk_id=self._unk_id(checkpoint),
            bos_id=eos if start is None else int(start), eos_id=eos,
            max_length=int(hf.get("max_position_embeddings", 1024)), position="sinusoidal",
            sinusoid_layout="fairseq", position_offset=pad + 1, scale_embeddings=bool(hf.get("scale_embedding", True)),
            output_bias=False, norm_first=True, tie_embeddings="all")

    # ------------------------------------------------------------------ tokenizers
    def _is_nllb(self, checkpoint: Checkpoint) -> bool:
        kind = str(self.settings(checkpoint).get("tokenizer_class") or "")
        if kind:
            return kind.startswith("Nllb")
        return not (checkpoint.folder / "vocab.json").is_file()

    def _vocabulary(self, checkpoint: Checkpoint) -> tuple[list[str], list[str], list[str]]:
        """`(tokens by id, language tokens, tokens detokenizing drops besides the languages)`."""
        if self._is_nllb(checkpoint):
            return self._nllb_vocabulary(checkpoint)
        tokens = read_vocabulary(checkpoint.file("vocab.json", "vocabulary (token -> id)"))
        settings = self.settings(checkpoint)
        listed = [token for token in (settings.get("additional_special_tokens") or settings.get(
            "extra_special_tokens") or []) if isinstance(token, str) and token.startswith("__")]
        codes = settings.get("language_codes", "m2m100")
        if not listed and codes not in LANGUAGE_CODES:
            raise ConfigError(f"{checkpoint.folder / TOKENIZER_CONFIG}: language_codes {codes!r} is not one of "
                              f"{sorted(LANGUAGE_CODES)}.")
        languages = listed or [f"__{code}__" for code in LANGUAGE_CODES[codes]]
        return tokens + [token for token in languages if token not in tokens], languages, ["<s>"]

    def _nllb_vocabulary(self, checkpoint: Checkpoint) -> tuple[list[str], list[str], list[str]]:
        settings = self.settings(checkpoint)
        listed = [token for token in (settings.get("extra_special_tokens") or settings.get(
            "additional_special_tokens") or []) if isinstance(token, str)]
        sentencepiece = checkpoint.folder / SENTENCEPIECE
        if not (checkpoint.folder / "tokenizer.json").is_file():  # fairseq's numbering computed
            sentencepiece = self._sentencepiece(checkpoint)
            if not listed:
                raise CheckpointNotFoundError(f"{checkpoint.folder / 'tokenizer.json'} is missing and "
                                              f"{TOKENIZER_CONFIG} lists no language codes: the NLLB tokenizer's "
                                              "ids of its language tokens are unknown.")
        tokens, languages = fairseq_vocabulary(checkpoint, sentencepiece, listed)
        return tokens, languages, [token for token in ("<s>", "<mask>") if token in tokens]

    def _sentencepiece(self, checkpoint: Checkpoint) -> pathlib.Path:
        return checkpoint.file(SENTENCEPIECE, "SentencePiece model (the Hub folders hold it; transformers 5 saves "
                                              "NLLB's tokenizer without it: copy it beside tokenizer.json)")

    def _unk_id(self, checkpoint: Checkpoint) -> int:
        tokens, _, _ = self._vocabulary(checkpoint)
        if "<unk>" not in tokens:
            raise ConfigError(f"{checkpoint.folder}: the vocabulary has no <unk> token.")
        return tokens.index("<unk>")

    def tokenizers(self, checkpoint: Checkpoint, config: TransformerConfig) -> tuple[Any, Any]:
        tokens, languages, dropped = self._vocabulary(checkpoint)
        model = self._sentencepiece(checkpoint).read_bytes()
        # ids the vocabulary does not name (M2M-100's made-up words, a model padded to a round size): placeholders
        tokens = self.special_vocabulary(tokens, config.vocab_size, config, checkpoint.folder)
        settings = self.settings(checkpoint)
        nllb = self._is_nllb(checkpoint)
        if nllb and settings.get("legacy_behaviour"):
            raise ConfigError(f"{checkpoint.folder / TOKENIZER_CONFIG}: legacy_behaviour true (tokens </s> [src_lang]) "
                              "is not read; the package encodes [src_lang] tokens </s>, NLLB's current layout.")

        def language(key: str, default: str | None) -> str | None:
            code = settings.get(key) or default
            if code is None:
                return None
            token = code if nllb or code.startswith("__") else f"__{code}__"
            if token not in languages:
                raise ConfigError(f"{checkpoint.folder / TOKENIZER_CONFIG}: {key} {code!r} is not one of the "
                                  f"vocabulary's {len(languages)} language tokens.")
            return token

        common: dict[str, Any] = dict(pad_id=config.pad_id, unk_id=config.unk_id, bos_id=config.bos_id,
                                      eos_id=config.eos_id, languages=languages, special_tokens=dropped)
        source = MappedTokenizer(model, tokens, language=language("src_lang", "eng_Latn" if nllb else "en"),
                                 name="source_tokenizer", **common)
        target = MappedTokenizer(model, tokens, language=language("tgt_lang", None), name="target_tokenizer",
                                 **common)
        return source, target


__all__ = ["LANGUAGE_CODES", "M2M100Family"]
