"""Subword vocabularies and the tensorflow-text tokenizers that apply them.

The default is a SentencePiece BPE model learned on the source and target
training text together (one shared vocabulary):

* it is reversible: SentencePiece keeps whitespace as a piece (``▁``), so
  ``detokenize(tokenize(s)) == s`` up to the documented normalization (NFKC,
  whitespace runs collapsed, leading/trailing whitespace removed; case folding
  too with ``lowercase=True``). Byte fallback spells a character never seen in
  training as its UTF-8 bytes, so even those come back instead of ``⁇``;
* a shared vocabulary lets source embedding, target embedding and the softmax
  share one matrix (``TransformerConfig.tie_embeddings="all"``), as in the
  paper (37k shared BPE for WMT En-De); on Multi30k the strongest published
  Transformer used a joint BPE of about 10k;
* the tokenizer is a `tf.Module` around ``tensorflow_text.SentencepieceTokenizer``:
  it runs eagerly, inside `tf.function`, in `tf.data` and in a SavedModel (the
  SentencePiece model travels inside the graph, so the exported model needs
  only ``tensorflow`` and ``tensorflow_text``).

WordPiece (``model_type="wordpiece"``, learned with keras-nlp's
``compute_word_piece_vocabulary`` and applied with
``tensorflow_text.FastWordpieceTokenizer``) is available for comparison. It is
not the default because it is not reversible: it splits off punctuation and
drops the information about where spaces were, so detokenized output reads
"A man , on a bike ." and must be post-processed before BLEU.

The SentencePiece model is learned with the SentencePiece trainer that
keras-nlp's ``compute_sentence_piece_proto`` wraps, with the same reserved ids
(pad=0, unk=1, bos=2, eos=3) and normalization (``nmt_nfkc``, or
``nmt_nfkc_cf`` when lowercasing). We call the trainer ourselves because
``compute_sentence_piece_proto`` does not expose ``byte_fallback`` and
``character_coverage``: without them a joint 8k BPE learned on the Multi30k
training split returns 16 of the 2,028 validation sentences (English and
German) with ``⁇`` in place of a digit, ``Q``, ``Ü`` or ``é`` (see
``tests/test_tokenizers.py``). ``byte_fallback=False,
character_coverage=0.9995`` are keras-nlp's settings.

Reserved ids are the same for every tokenizer and match `TransformerConfig`:
pad 0, unk 1, bos (begin) 2, eos (end) 3.

Files: ``SubwordTokenizer.save(directory)`` writes ``tokenizer.json`` (kind,
size, options) and ``sentencepiece.model`` or ``wordpiece.vocab``.
`save_tokenizers` writes a shared tokenizer into ``directory`` itself and
separate ones into ``directory/source`` and ``directory/target``;
`load_tokenizers` reads either layout back.

Large corpora: `train_tokenizers_from_files` (what ``train`` and ``pack`` call)
learns from at most ``sample_size`` sentences, drawn uniformly from the whole of
each side's files in one streaming pass (`reservoir_sample`; half of the sample
from each side when the vocabulary is shared), so learning a vocabulary takes
a time and memory bounded by the sample, whatever the corpus size.

Imported vocabularies (`keras-transformer import`): `mapped` (`MappedTokenizer`: a published model's SentencePiece
model whose pieces are numbered by its own vocabulary, with its own special ids); `load_tokenizers` reads it too.

The modules: `subword` (`SubwordTokenizer`: one vocabulary, learned, applied, saved), `pairs` (the source and
target tokenizers learned, saved and loaded together), `sampling` (the uniform draw of sentences from files,
without TensorFlow). Import the names from this package.
"""

from keras_transformer.data.tokenizers.mapped import MappedTokenizer, read_vocabulary
from keras_transformer.data.tokenizers.pairs import (
                                                     load_tokenizer,
                                                     load_tokenizers,
                                                     save_tokenizers,
                                                     train_tokenizers,
                                                     train_tokenizers_from_files,
)
from keras_transformer.data.tokenizers.sampling import check_text_files, reservoir_sample, sample_files
from keras_transformer.data.tokenizers.subword import (
                                                     BOS_ID,
                                                     CONFIG_FILE,
                                                     EOS_ID,
                                                     PAD_ID,
                                                     SENTENCEPIECE_FILE,
                                                     UNK_ID,
                                                     WORDPIECE_FILE,
                                                     WORDPIECE_RESERVED,
                                                     SubwordTokenizer,
                                                     sentence_list,
)

__all__ = ["BOS_ID", "CONFIG_FILE", "EOS_ID", "PAD_ID", "SENTENCEPIECE_FILE", "UNK_ID", "WORDPIECE_FILE",
           "WORDPIECE_RESERVED", "MappedTokenizer", "SubwordTokenizer", "check_text_files", "load_tokenizer",
           "load_tokenizers", "read_vocabulary", "reservoir_sample",
           "sample_files", "save_tokenizers", "sentence_list", "train_tokenizers", "train_tokenizers_from_files"]
