"""Glossaries: the target terms a source sentence's words call for, as constraints. Standard library only.

A glossary is a UTF-8 text file of tab-separated lines::

    # comment lines and blank lines are skipped
    agreement<TAB>Vertrag
    Keras<TAB>Keras
    bike<TAB>Fahrrad<TAB>Rad

The first field is a source term, the others the target forms it calls for (any one of them satisfies the
constraint: `decoding.constraints` takes them as alternative forms). A term is one or more words; it matches
whole words only (words are runs of letters, digits and `_`; every other non-space character is a word of its
own; spaces between words do not matter). Case: a source term written in lower case matches in any case
("agreement" matches "Agreement"); a term with a capital letter matches only as written ("Apple" does not match
"apple"). In a sentence the longest matches are taken first and matches never overlap; each match is one
constraint, so a term that occurs twice calls for its target twice.

Turning a target term into token ids is the target tokenizer's work (`term_ids`). With a subword vocabulary a
word can be split differently at the start of a sentence, after a space, or inside a longer word: a constraint
is the term's tokens as the tokenizer splits it alone, and the output contains exactly those tokens.

Example:

>>> glossary = Glossary.parse("agreement\\tVertrag\\nbike\\tFahrrad\\tRad\\n")
>>> glossary.constraints("The agreement about the bike.")
[('Vertrag',), ('Fahrrad', 'Rad')]
"""

import os
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from keras_transformer.errors import ConfigError

_WORDS = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """The words of `text` as matching sees them: runs of letters, digits and `_`, and each other non-space
    character alone.

    Example:

    >>> words("A man's bike, 2 wheels.")
    ['A', 'man', "'", 's', 'bike', ',', '2', 'wheels', '.']
    """
    return _WORDS.findall(text)


@dataclass(frozen=True)
class GlossaryEntry:
    """One line of a glossary: the source term's words, its target forms, whether case matters, and its line.

    Example:

    >>> GlossaryEntry(("bike",), ("Fahrrad",), False, 1).matches(["Bike"])
    True
    """

    source: tuple[str, ...]
    targets: tuple[str, ...]
    case_sensitive: bool
    line: int

    def matches(self, sentence_words: Sequence[str]) -> bool:
        """Whether `sentence_words` (as many as the term has) are this term's words."""
        if self.case_sensitive:
            return tuple(sentence_words) == self.source
        return tuple(word.lower() for word in sentence_words) == self.source


class Glossary:
    """Source terms and their target forms, read from a tab-separated file (the module's docstring).

    Example:

    >>> glossary = Glossary.parse("red\\trot\\nred wine\\tRotwein\\nApple\\tApple\\n")
    >>> glossary.constraints("Red wine from apple trees and Apple.")  # longest first; "apple" is not "Apple"
    [('Rotwein',), ('Apple',)]
    """

    def __init__(self, entries: Iterable[GlossaryEntry], name: str = "<glossary>") -> None:
        self.entries, self.name = list(entries), name
        # the first word (lower case) -> the entries starting with it, longest first
        self._by_first: dict[str, list[GlossaryEntry]] = {}
        for entry in self.entries:
            self._by_first.setdefault(entry.source[0].lower(), []).append(entry)
        for group in self._by_first.values():
            group.sort(key=lambda entry: -len(entry.source))

    @classmethod
    def parse(cls, text: str, name: str = "<glossary>") -> "Glossary":
        """A glossary from its text; a malformed line is refused with `name` and its line number.

        Example:

        >>> Glossary.parse("bike Fahrrad\\n", name="terms.tsv")
        Traceback (most recent call last):
        ...
        keras_transformer.errors.ConfigError: terms.tsv line 1: expected 'source term<TAB>target term...', got 'bike \
Fahrrad' (no tab).
        """
        entries = []
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            fields = [field.strip() for field in line.rstrip("\r\n").split("\t")]
            where = f"{name} line {number}"
            if len(fields) < 2:
                raise ConfigError(f"{where}: expected 'source term<TAB>target term[<TAB>more target forms]', "
                                  f"got {stripped[:60]!r} (no tab).")
            source, targets = fields[0], tuple(dict.fromkeys(field for field in fields[1:] if field))
            if not words(source):
                raise ConfigError(f"{where}: the source term is empty.")
            if not targets:
                raise ConfigError(f"{where}: the source term {source!r} has no target term.")
            case_sensitive = source != source.lower()
            entries.append(GlossaryEntry(tuple(words(source if case_sensitive else source.lower())), targets,
                                         case_sensitive, number))
        return cls(entries, name)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Glossary":
        """The glossary in the file `path` (UTF-8); a file that cannot be read is refused by name.

        Example:

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "terms.tsv"
        >>> _ = path.write_text("# terms\\nagreement\\tVertrag\\n", encoding="utf-8")
        >>> len(Glossary.read(path).entries)
        1
        """
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"Cannot read the glossary {path}: {error}.") from None
        return cls.parse(text, str(path))

    def matches(self, sentence: str) -> list[tuple[int, GlossaryEntry]]:
        """The entries whose source term occurs in `sentence`, in sentence order: `[(word index, entry), ...]`,
        the longest matches first taken, none overlapping.

        Example:

        >>> [entry.targets for _, entry in Glossary.parse("dog\\tHund\\n").matches("A dog and a dog.")]
        [('Hund',), ('Hund',)]
        """
        found: list[tuple[int, int, GlossaryEntry]] = []
        sentence_words = words(sentence)
        for start, word in enumerate(sentence_words):
            for entry in self._by_first.get(word.lower(), ()):
                end = start + len(entry.source)
                if end <= len(sentence_words) and entry.matches(sentence_words[start:end]):
                    found.append((start, end, entry))
        taken: list[tuple[int, GlossaryEntry]] = []
        used: set[int] = set()
        for start, end, entry in sorted(found, key=lambda match: (-(match[1] - match[0]), match[0])):
            if used.isdisjoint(range(start, end)):
                taken.append((start, entry))
                used.update(range(start, end))
        return sorted(taken, key=lambda match: match[0])

    def constraints(self, sentence: str) -> list[tuple[str, ...]]:
        """The constraints `sentence` calls for: one tuple of target forms per match, in sentence order."""
        return [entry.targets for _, entry in self.matches(sentence)]


def term_ids(term: str, tokenize: Callable[[str], Iterable[int]], unk_id: int | None = None,
             drop: Collection[int] = ()) -> list[int]:
    """A target term as the token ids of a constraint: `tokenize(term)` (a list of ids), without the ids in
    `drop` (a tokenizer's bos and eos).

    Refuses (`ConfigError`, naming the term) an empty term, and one whose ids are all `unk_id` (a term of
    characters the vocabulary lacks: as a constraint it would only force unknown tokens).

    Example:

    >>> vocabulary = {"ein": 5, "Vertrag": 6}
    >>> tokenize = lambda text: [vocabulary.get(word, 1) for word in text.split()] + [3]
    >>> term_ids("Vertrag", tokenize, unk_id=1, drop=(3,))
    [6]
    >>> term_ids("Жук", tokenize, unk_id=1, drop=(3,))
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: The constraint 'Жук' has only unknown tokens (id 1) in the target ...
    """
    if not term.strip():
        raise ConfigError(f"A constraint is empty ({term!r}); give one or more words.")
    ids = [int(i) for i in tokenize(term) if int(i) not in drop]
    if not ids:
        raise ConfigError(f"The constraint {term!r} has no tokens in the target vocabulary.")
    if unk_id is not None and all(i == unk_id for i in ids):
        raise ConfigError(f"The constraint {term!r} has only unknown tokens (id {unk_id}) in the target vocabulary.")
    return ids
