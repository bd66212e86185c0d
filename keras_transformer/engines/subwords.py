"""SentencePiece outside TensorFlow, for the engines that serve an export folder (CTranslate2, LiteRT).

`load_processors` opens an export's source and target SentencePiece models (one processor where they are one
file). An imported vocabulary (`data.tokenizers.MappedTokenizer`: OPUS-MT's, M2M-100's, NLLB's) numbers
SentencePiece's pieces through a vocabulary of its own: `mapped_pieces` segments a sentence as that tokenizer
does (a leading ``>>xx<<`` tag or language token whole, else the side's language first, the vocabulary's
split tokens whole wherever they stand, and a piece the vocabulary lacks read as unk), `source_end` puts eos
(and mBART-large-cc25's language token) after a source's tokens, and `mapped_text` joins pieces back into
text as its `detokenize` does. Needs `sentencepiece` and nothing else: neither Keras nor TensorFlow.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable
from typing import Any


def load_processors(directory: str | os.PathLike[str], files: dict[str, str]) -> tuple[Any, Any]:
    """The source and target `sentencepiece.SentencePieceProcessor` of an export folder: `files` names them
    (``{"source": name, "target": name}``, relative to `directory`); one file is one processor, used twice.

    Example:

    >>> source, target = load_processors("exports/en_de_litert", {"source": "sentencepiece.model",
    ...                                                           "target": "sentencepiece.model"})  # doctest: +SKIP
    >>> source is target  # doctest: +SKIP
    True
    """
    import sentencepiece

    source = sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, files["source"]))
    if files["source"] == files["target"]:
        return source, source
    return source, sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, files["target"]))


def split_pattern(tokens: Iterable[str]) -> str:
    """The regular expression (RE2's and Python's) that finds any of `tokens` in a text, the longest first where
    two start at the same place, as the added tokens of Hugging Face's tokenizers are found.

    Example:

    >>> re.split(split_pattern(["<2de>", "</s>", "<2de_Latn>"]), "<2de_Latn>Hallo</s>x")
    ['', '<2de_Latn>', 'Hallo', '</s>', 'x']
    >>> re.split(split_pattern(["a.b c", "[x]"]), "za.b c[x]aXb")
    ['z', 'a.b c', '', '[x]', 'aXb']
    """
    def literal(token: str) -> str:  # ASCII punctuation and spaces as \xHH escapes: RE2 and Python read them
        return "".join(f"\\x{ord(c):02x}" if ord(c) < 128 and not c.isalnum() else c for c in token)

    return "(" + "|".join(literal(token) for token in sorted(tokens, key=len, reverse=True)) + ")"


def source_end(tokens: list[Any], eos: Any, max_length: int, language_last: bool = False) -> list[Any]:
    """A source's tokens (or ids) then eos, `max_length` at most: as the TensorFlow engine's `encode_ids`, a
    `language_last` tokenizer's language token (the first `mapped_pieces` gives) goes after eos.

    Example:

    >>> source_end(["en_XX", "▁a", "▁cat"], "</s>", 8, language_last=True), source_end(["▁a", "▁cat"], "</s>", 2)
    (['▁a', '▁cat', '</s>', 'en_XX'], ['▁a', '</s>'])
    """
    if language_last:
        return list(tokens[1:][: max_length - 2]) + [eos, *tokens[:1]]
    return list(tokens[: max_length - 1]) + [eos]


def mapped_pieces(processor: Any, text: str, known: Collection[str], unk_token: str,
                  languages: Collection[str] = (), language: str | None = None,
                  split_tokens: Collection[str] = ()) -> list[str]:
    """An imported vocabulary's tokens of `text`, as `MappedTokenizer.tokenize` makes them (without eos).

    With language tokens (`languages`: M2M-100's ``__fr__``, NLLB's ``fra_Latn``), a sentence that opens with one
    has it first, and one that opens with none has `language` first (where there is one); without, a leading
    ``>>xx<<`` tag (multi-target OPUS-MT) is one token. Then SentencePiece's pieces, each one `known` lacks read as
    `unk_token`; each of `split_tokens` is cut out wherever it stands and kept whole, the text between them
    segmented as sentences of their own.

    Example:

    >>> class Pieces:  # a stand-in for a SentencePieceProcessor
    ...     def encode(self, text, out_type=str):
    ...         return ["▁" + word for word in text.split()]
    >>> mapped_pieces(Pieces(), ">>fr<< a cat", {">>fr<<", "▁a"}, "<unk>")
    ['>>fr<<', '▁a', '<unk>']
    >>> mapped_pieces(Pieces(), "a", {"fra_Latn", "eng_Latn", "▁a"}, "<unk>", ["fra_Latn", "eng_Latn"], "eng_Latn")
    ['eng_Latn', '▁a']
    >>> mapped_pieces(Pieces(), "<2de>a</s>", {"<2de>", "</s>", "▁a"}, "<unk>", split_tokens=["<2de>", "</s>"])
    ['<2de>', '▁a', '</s>']
    """
    tag = []
    if languages:
        first = text.split(maxsplit=1)[0] if text.strip() else ""
        if first in languages and text.startswith(first):
            tag, text = [first], text[len(first):]
        elif language is not None:
            tag = [language]
    elif text.startswith(">>") and text.find("<<") != -1 and not split_tokens:
        end = text.find("<<") + 2
        tag, text = [text[:end]], text[end:]
    parts = re.split(split_pattern(split_tokens), text) if split_tokens else [text]  # text, token, text, ...
    pieces = [piece for i, part in enumerate(parts)
              for piece in ([part] if i % 2 else processor.encode(part, out_type=str))]
    return [token if token in known else unk_token for token in tag + pieces]


def mapped_text(tokens: Iterable[str]) -> str:
    """Tokens of an imported vocabulary (specials already dropped) as text: joined, each ``▁`` a space, as
    `MappedTokenizer.detokenize` does.

    Example:

    >>> mapped_text(["▁a", "▁c", "at", "."])
    'a cat.'
    """
    return "".join(tokens).replace("\u2581", " ").strip()


__all__ = ["load_processors", "mapped_pieces", "mapped_text", "source_end", "split_pattern"]
