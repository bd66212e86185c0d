"""mBART-50 and mBART-large-cc25 (``model_type: mbart``, Hugging Face's ``MBartForConditionalGeneration``) onto
`TransformerConfig` and `build_model`'s weights.

How a checkpoint maps onto the package's model (what differs from `BartFamily`):

* pre-norm layers with a final LayerNorm after each stack (``model.{side}.layer_norm``):
  ``norm_first``; a LayerNorm on embeddings + positions (``model.{side}.layernorm_embedding``):
  ``embedding_norm``;
* learned positions (``position: learned``), one table a side, numbered from fairseq's
  offset 2: the checkpoint's rows 2.. are the model's rows 0.. (rows 0 and 1 are never used);
* token embeddings x sqrt(d_model) where ``scale_embedding`` says so (mBART-50: true);
* one embedding for the encoder, the decoder and the softmax, ``final_logits_bias`` kept
  where it is not all zeros;
* the decoder starts from ``decoder_start_token_id`` (eos); the target language is forced as
  the first generated token (``forced_bos_token_id``), which the package does with a target
  prefix (``--target-lang de`` or ``de_DE``).

The tokenizer (``MBart50Tokenizer``): ``sentencepiece.bpe.model`` segments, fairseq's numbering
(``<s> <pad> </s> <unk>``, SentencePiece's ids one up, the 52 language codes, ``<mask>``), read
from ``tokenizer.json`` where the checkpoint has one; a source is ``[src_lang] tokens </s>``, a
target ``[tgt_lang] tokens </s>``. mBART-large-cc25's ``MBartTokenizer`` (the first 25 codes): a
source is ``tokens </s> [src_lang]``, and the decoder starts from the target language itself
(transformers' ``decoder_start_token_id = lang_code_to_id[tgt_lang]``), not from ``</s>``: both
tokenizers are ``language_last``, the target language's token opens the target prefix, and the
searches start the decoder from it (``start_from_prefix``). Without a target language given, the
decoder starts from the target tokenizer's language: the one ``decoder_start_token_id`` names (a
fine-tuned cc25 model's, mbart-large-en-ro's ``ro_RO``), else ``tgt_lang``; from ``</s>`` without either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_transformer.data.tokenizers import MappedTokenizer
from keras_transformer.errors import ConfigError
from keras_transformer.imports.bart import BartFamily, fairseq_vocabulary, output_bias_of
from keras_transformer.imports.family import TOKENIZER_CONFIG, assign

if TYPE_CHECKING:
    from keras_transformer.config import TransformerConfig
    from keras_transformer.imports.checkpoint import Checkpoint
    from keras_transformer.imports.family import WeightSource
    from keras_transformer.model import TransformerParts

# mBART-50's language codes (fairseq's, MBart50Tokenizer's), in id order after the pieces
LANGUAGE_CODES = ("ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV "
                  "my_MM ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID "
                  "ka_GE km_KH mk_MK ml_IN mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA "
                  "ur_PK xh_ZA gl_ES sl_SI").split()
CC25_LANGUAGE_CODES = LANGUAGE_CODES[:25]  # mBART-large-cc25's (MBartTokenizer's), the first 25 of them
SENTENCEPIECE = "sentencepiece.bpe.model"
POSITION_OFFSET = 2  # fairseq's learned positions count from pad_id + 1


class MBartFamily(BartFamily):
    """mBART-50 (many-to-many and one-to-many), mBART-large-cc25 and every other ``MBartForConditionalGeneration``
    checkpoint with ``MBart50Tokenizer``'s or ``MBartTokenizer``'s layout.

    Example:

    >>> MBartFamily().name
    'mbart'
    """

    name = "mbart"
    description = "mBART-50 and mBART-large-cc25 (MBartForConditionalGeneration)"

    # ------------------------------------------------------------------ config
    def architecture(self, checkpoint: Checkpoint, tensors: WeightSource, where: str) -> dict[str, Any]:
        hf = checkpoint.config
        self.check_tied(hf, where)
        pad, eos = int(hf["pad_token_id"]), int(hf["eos_token_id"])
        # cc25: the decoder starts from the target language (a target prefix's first token), else from eos
        start = None if self.language_last(checkpoint) else hf.get("decoder_start_token_id")
        return dict(
            vocab_size=int(hf["vocab_size"]), pad_id=pad, unk_id=self._unk_id(checkpoint),
            bos_id=eos if start is None else int(start), eos_id=eos,
            max_length=int(hf.get("max_position_embeddings", 1024)), position="learned",
            scale_embeddings=bool(hf.get("scale_embedding", False)), output_bias=output_bias_of(tensors),
            norm_first=True, embedding_norm=True, tie_embeddings="all")

    # ------------------------------------------------------------------ tokenizers
    def _tokenizer_class(self, checkpoint: Checkpoint) -> str | None:
        kind = self.settings(checkpoint).get("tokenizer_class") or checkpoint.config.get("tokenizer_class")
        return None if not kind else str(kind)

    def language_last(self, checkpoint: Checkpoint) -> bool:
        """Whether the checkpoint's tokenizer has ``MBartTokenizer``'s layout (mBART-large-cc25: ``tokens </s>
        [src_lang]``, the decoder started from the target language) rather than ``MBart50Tokenizer``'s."""
        kind = self._tokenizer_class(checkpoint)
        if kind is None:  # mBART-50's vocabulary has its 52 languages, cc25's its 25
            return len(self._vocabulary(checkpoint)[1]) <= len(CC25_LANGUAGE_CODES)
        if kind.startswith("MBart50"):
            return False
        if kind in ("MBartTokenizer", "MBartTokenizerFast"):
            return True
        raise ConfigError(f"{checkpoint.folder / TOKENIZER_CONFIG}: tokenizer_class {kind!r} is not read; the "
                          "package imports MBart50Tokenizer's layout ([src_lang] tokens </s>) and MBartTokenizer's "
                          "(mBART-large-cc25's tokens </s> [src_lang]).")

    def _vocabulary(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
        settings = self.settings(checkpoint)
        kind = self._tokenizer_class(checkpoint) or ""
        default = CC25_LANGUAGE_CODES if kind.startswith("MBartTokenizer") else LANGUAGE_CODES
        listed = [token for token in (settings.get("extra_special_tokens") or settings.get(
            "additional_special_tokens") or default) if isinstance(token, str)]
        sentencepiece = checkpoint.folder / SENTENCEPIECE
        if not (checkpoint.folder / "tokenizer.json").is_file():  # fairseq's numbering computed
            sentencepiece = self._sentencepiece(checkpoint)
        return fairseq_vocabulary(checkpoint, sentencepiece, listed)

    def _sentencepiece(self, checkpoint: Checkpoint) -> Any:
        return checkpoint.file(SENTENCEPIECE, "SentencePiece model")

    def _unk_id(self, checkpoint: Checkpoint) -> int:
        tokens, _ = self._vocabulary(checkpoint)
        if "<unk>" not in tokens:
            raise ConfigError(f"{checkpoint.folder}: the vocabulary has no <unk> token.")
        return tokens.index("<unk>")

    def tokenizers(self, checkpoint: Checkpoint, config: TransformerConfig) -> tuple[Any, Any]:
        tokens, languages = self._vocabulary(checkpoint)
        model = self._sentencepiece(checkpoint).read_bytes()
        tokens = self.special_vocabulary(tokens, config.vocab_size, config, checkpoint.folder)
        settings = self.settings(checkpoint)

        def language(key: str, default: str | None) -> str | None:
            code = settings.get(key) or default
            if code is not None and code not in languages:
                raise ConfigError(f"{checkpoint.folder / TOKENIZER_CONFIG}: {key} {code!r} is not one of the "
                                  f"vocabulary's {len(languages)} language tokens.")
            return code

        common: dict[str, Any] = dict(pad_id=config.pad_id, unk_id=config.unk_id, bos_id=config.bos_id,
                                      eos_id=config.eos_id, languages=languages,
                                      special_tokens=[token for token in ("<s>", "<mask>") if token in tokens],
                                      **({"language_last": True} if self.language_last(checkpoint) else {}))
        source = MappedTokenizer(model, tokens, language=language("src_lang", "en_XX"), name="source_tokenizer",
                                 **common)
        start = checkpoint.config.get("decoder_start_token_id")  # a tuned cc25 model's target language
        started = tokens[start] if self.language_last(checkpoint) and isinstance(start, int) and \
            0 <= start < len(tokens) and tokens[start] in languages else None
        target = MappedTokenizer(model, tokens, language=started or language("tgt_lang", None),
                                 name="target_tokenizer", **common)
        return source, target

    # ------------------------------------------------------------------ weights
    def assign_positions(self, p: TransformerParts, tensors: WeightSource, config: TransformerConfig) -> None:
        """The learned tables, less fairseq's first two rows."""
        for side, layer in (("encoder", p.source_position), ("decoder", p.target_position)):
            name = f"{self.prefix}.{side}.embed_positions.weight"
            table = tensors.take(name, (config.max_length + POSITION_OFFSET, config.d_model))
            assign(layer.table, table[POSITION_OFFSET:], name)


__all__ = ["CC25_LANGUAGE_CODES", "LANGUAGE_CODES", "MBartFamily"]
