"""Terms for the engines: each line's constraints (given, and from a glossary) and banned phrases, checked.

A request names target terms as text: `constraints` (per line, a list of terms, each a text or a tuple of
alternative forms), a `glossary` (a `decoding.Glossary` or the path of a TSV glossary: each line gets the entries
whose source term occurs in it) and `banned` (texts no translation may contain, the same for every line).
`TermRequest.build` gathers them per line and checks them against the limits below before any search runs; an
engine then turns each term into target ids (`term_ids`) and searches with them (`engines.tensorflow_terms`).
An engine that cannot force terms refuses them (`refuse`). Standard library only.

The limits keep a request's search state bounded: at most `MAX_CONSTRAINTS` constraints per line, each form of at
most `MAX_TERM_TOKENS` target tokens, and at most `MAX_BANNED` banned phrases.

Example:

>>> request = TermRequest.build(2, constraints=[["Vertrag"], []], banned=["Mist"])
>>> request.per_line, request.banned
([[('Vertrag',)], []], [('Mist',)])
>>> TermRequest.build(1, constraints=[[""]])
Traceback (most recent call last):
...
keras_transformer.errors.ConfigError: constraints: line 1's constraint 1 is empty; give one or more words.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_transformer.decoding.glossary import Glossary
from keras_transformer.errors import ConfigError

MAX_CONSTRAINTS = 16  # constraints per line (given and from the glossary together)
MAX_TERM_TOKENS = 8  # target tokens per form of a constraint, and per banned phrase
MAX_FORMS = 4  # alternative forms per constraint
MAX_BANNED = 64  # banned phrases per request
# Where terms travel as one text per constraint (the SavedModel's `translate_constrained` signature), the separator
# of its alternative target forms ("Fahrrad\tRad": either satisfies it), as a glossary line separates them.
FORM_SEPARATOR = "\t"

Term = tuple[str, ...]  # one constraint: its alternative target forms (any one satisfies it)


def _forms(item: Any, where: str) -> Term:
    """One constraint as a tuple of forms: a text, or a list of texts (alternatives)."""
    forms = (item,) if isinstance(item, str) else tuple(item) if isinstance(item, (list, tuple)) else None
    if not forms or not all(isinstance(form, str) for form in forms):
        raise ConfigError(f"{where} must be a text or a list of texts (alternative forms), got {item!r}.")
    if any(not form.strip() for form in forms):
        raise ConfigError(f"{where} is empty; give one or more words.")
    if len(forms) > MAX_FORMS:
        raise ConfigError(f"{where} has {len(forms)} forms; at most {MAX_FORMS}.")
    return tuple(form.strip() for form in forms)


@dataclass
class TermRequest:
    """A request's terms: `per_line[i]`, line i's constraints (each a tuple of forms), and `banned`, the phrases
    none may contain (each a one-form tuple).

    Example:

    >>> TermRequest.build(1, glossary=Glossary.parse("dog\\tHund\\n"), lines=["A dog."]).per_line
    [[('Hund',)]]
    """

    per_line: list[list[Term]] = field(default_factory=list)
    banned: list[Term] = field(default_factory=list)

    @property
    def positive(self) -> bool:
        """Whether any line has a constraint."""
        return any(self.per_line)

    @classmethod
    def build(cls, count: int, constraints: Sequence[Any] | None = None, banned: Iterable[Any] | None = None,
              glossary: Glossary | str | os.PathLike[str] | None = None, lines: Sequence[str] = (),
              where: str = "constraints") -> TermRequest:
        """The terms of `count` lines: `constraints` (one list per line), the `glossary` entries each of `lines`
        calls for, after them, and `banned`.

        Raises:
            ConfigError: a list of constraints of another length than the lines, an empty term, a term of
                another type, more than `MAX_CONSTRAINTS` for a line or `MAX_BANNED` banned phrases (named).
        """
        if constraints is not None and (isinstance(constraints, (str, bytes)) or len(constraints) != count):
            raise ConfigError(f"{where}: give one list of terms per line ({count} line(s)), got "
                              f"{len(constraints) if not isinstance(constraints, (str, bytes)) else 'one text'}.")
        glossary = read_glossary(glossary)
        per_line: list[list[Term]] = []
        for i in range(count):
            given = [] if constraints is None else constraints[i]
            if isinstance(given, str) or not isinstance(given, (list, tuple)):
                raise ConfigError(f"{where}: line {i + 1}'s constraints must be a list of terms, got {given!r}.")
            terms = [_forms(item, f"{where}: line {i + 1}'s constraint {j + 1}") for j, item in enumerate(given)]
            if glossary is not None:
                terms += [tuple(targets) for targets in glossary.constraints(lines[i])]
            if len(terms) > MAX_CONSTRAINTS:
                raise ConfigError(f"{where}: line {i + 1} has {len(terms)} constraints (given and from the "
                                  f"glossary); at most {MAX_CONSTRAINTS} per line.")
            per_line.append(terms)
        if isinstance(banned, str):
            banned = [banned]
        phrases = [_forms(item, f"banned: phrase {j + 1}") for j, item in enumerate(banned or ())]
        if any(len(phrase) > 1 for phrase in phrases):
            raise ConfigError("banned: each phrase is one text (alternative forms are for constraints).")
        if len(phrases) > MAX_BANNED:
            raise ConfigError(f"banned: {len(phrases)} phrases; at most {MAX_BANNED} per request.")
        return cls(per_line, phrases)

    def ids(self, tokenize: Callable[[str], list[int]]) -> tuple[list[list[list[list[int]]]], list[list[int]]]:
        """Per line, per constraint, per form, its target ids; and the banned phrases' ids (`tokenize` a term's,
        which raises naming a term without known tokens), each checked against `MAX_TERM_TOKENS`.

        Example:

        >>> TermRequest([[("a b",)]], [("cc",)]).ids(lambda text: [len(word) for word in text.split()])
        ([[[[1, 1]]]], [[2]])
        """
        cache: dict[str, list[int]] = {}

        def term(text: str, what: str) -> list[int]:
            if text not in cache:
                cache[text] = tokenize(text)
            if len(cache[text]) > MAX_TERM_TOKENS:
                raise ConfigError(f"{what} {text!r} is {len(cache[text])} target tokens; at most {MAX_TERM_TOKENS}.")
            return cache[text]

        banned = [term(phrase[0], "The banned phrase") for phrase in self.banned]
        per_line = [[self._allowed(forms, [term(form, "The constraint") for form in forms], banned)
                     for forms in terms] for terms in self.per_line]
        return per_line, banned

    def _allowed(self, forms: Term, ids: list[list[int]], banned: list[list[int]]) -> list[list[int]]:
        """`ids`, the forms of one constraint, less those a banned phrase's ids lie inside (no search can write
        them without the banned phrase).

        Raises:
            ConfigError: every form holds a banned phrase (the constraint and the phrase named).
        """
        def blocked(form: list[int]) -> list[int] | None:
            return next((ban for ban in banned if contains(form, ban)), None)

        kept = [form for form in ids if blocked(form) is None]
        if not kept:
            phrase = next(self.banned[banned.index(ban)][0] for ban in map(blocked, ids) if ban is not None)
            raise ConfigError(f"The constraint {shown(forms)!r} contains the banned phrase {phrase!r}: no "
                              "translation can hold both; drop one of them.")
        return kept


def contains(sequence: Sequence[int], part: Sequence[int]) -> bool:
    """Whether `part` occurs in `sequence` as consecutive items.

    Example:

    >>> contains([5, 6, 7], [6, 7]), contains([5, 6, 7], [5, 7])
    (True, False)
    """
    n = len(part)
    return n > 0 and any(list(sequence[i:i + n]) == list(part) for i in range(len(sequence) - n + 1))


def read_glossary(glossary: Glossary | str | os.PathLike[str] | None) -> Glossary | None:
    """`glossary` as a `Glossary`: a TSV glossary's path read (once, where many calls use it), None as None.

    Example:

    >>> read_glossary(None) is None, read_glossary(Glossary.parse("dog\\tHund\\n")).constraints("A dog.")
    (True, [('Hund',)])
    """
    return glossary if glossary is None or isinstance(glossary, Glossary) else Glossary.read(glossary)


def refuse(engine: str, what: str = "constraints or banned phrases") -> ConfigError:
    """The one-line refusal of an engine that cannot force or ban terms.

    Example:

    >>> print(refuse("ctranslate2"))
    The ctranslate2 engine cannot force or ban terms (constraints or banned phrases given); use the TensorFlow \
engine: a workdir or a SavedModel export.
    """
    return ConfigError(f"The {engine} engine cannot force or ban terms ({what} given); use the TensorFlow engine: "
                       "a workdir or a SavedModel export.")



def shown(term: Term) -> str | list[str]:
    """A constraint as a result reports it: its text, or the list of its forms.

    Example:

    >>> shown(("Vertrag",)), shown(("Fahrrad", "Rad"))
    ('Vertrag', ['Fahrrad', 'Rad'])
    """
    return term[0] if len(term) == 1 else list(term)
