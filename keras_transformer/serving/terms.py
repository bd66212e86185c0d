"""`/translate`'s terms: `constraints` (a list per sentence), a `glossary` object and `banned`, read and checked.

A request's terms are checked whole before it joins a batch (`parse_terms`, whose `ConfigError` is the
request's 400): its fields' types, the limits of `engines.terms`, and every term against the served model's
target vocabulary, so a bad term is its own request's 400, never its batch's failure; an engine that cannot
force terms answers 400 naming itself.

Example:

>>> parse_terms({"sentences": ["A dog."]}, ["A dog."], None, False) is None
True
"""

from collections.abc import Sequence
from typing import Any

from keras_transformer.decoding.glossary import Glossary
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.terms import FORM_SEPARATOR, MAX_BANNED, MAX_CONSTRAINTS, TermRequest, refuse, shown
from keras_transformer.errors import ConfigError

TERM_FIELDS = ("constraints", "glossary", "banned")


def request_glossary(value: Any) -> Glossary:
    """A `glossary` field, `{"source term": "target term" | ["form", ...]}`, as a `Glossary` (the TSV rules:
    whole words, a term with a capital letter matches as written).

    Example:

    >>> request_glossary({"bike": ["Fahrrad", "Rad"]}).constraints("A bike.")
    [('Fahrrad', 'Rad')]
    """
    if not isinstance(value, dict):
        raise ConfigError(f"glossary must be an object {{\"source term\": \"target term\" or [forms]}}, got "
                                f"{type(value).__name__}.")
    lines = []
    for source, targets in value.items():
        forms = [targets] if isinstance(targets, str) else targets
        if not isinstance(forms, list) or not all(isinstance(form, str) for form in forms):
            raise ConfigError(f"glossary[{source!r}] must be a target term or a list of them.")
        if any(any(c in text for c in "\t\r\n") for text in [source, *forms]):
            raise ConfigError(f"glossary[{source!r}]: a term holds a tab or a line break.")
        lines.append("\t".join([source, *forms]))
    return Glossary.parse("\n".join(lines) + "\n", "glossary, entry")  # "glossary, entry line N": its Nth


def parse_terms(body: dict[str, Any], sentences: list[str], translator: TranslatorInterface | None,
                sampling: bool) -> tuple[list[tuple[tuple[str, ...], ...]], tuple[str, ...]] | None:
    """The terms of a `/translate` body: per sentence its constraints (each a tuple of forms, the glossary's
    after the given ones) and the banned phrases; None when the body has none. Checked with the served
    `translator`'s target vocabulary (`term_tokens`).

    Raises:
        ConfigError: (the request's 400) naming the field: a bad type, an empty term, a term the vocabulary
            lacks, a request over the limits (`engines.terms`), sampling with constraints, an engine that cannot
            force terms.
    """
    if all(body.get(name) is None for name in TERM_FIELDS):
        return None
    tokens = getattr(translator, "term_tokens", None)
    if translator is None or tokens is None:
        raise refuse(getattr(translator, "engine", "served"))
    glossary = body.get("glossary")
    banned = body.get("banned")
    if banned is not None and (not isinstance(banned, list) or not all(isinstance(term, str) for term in banned)):
        raise ConfigError("banned must be a list of target terms (strings).")
    terms = TermRequest.build(len(sentences), body.get("constraints"), banned,
                              None if glossary is None else request_glossary(glossary), sentences)
    if sampling and terms.positive:
        raise ConfigError("constraints: sampling cannot force terms; use strategy 'beam' or 'greedy' (sampling "
                          "honours banned phrases only).")
    terms.ids(tokens)
    return [tuple(line) for line in terms.per_line], tuple(phrase[0] for phrase in terms.banned)


def slot_terms(row: Sequence[str]) -> list[tuple[str, ...]]:
    """A row of the `translate_constrained` signature's `constraints` slots as the constraints it gives: each
    non-blank slot, its forms split at tabs (`engines.terms.FORM_SEPARATOR`), blank forms dropped.

    Example:

    >>> slot_terms(["Fahrrad\\tRad", "", "Hund"])
    [('Fahrrad', 'Rad'), ('Hund',)]
    """
    terms = [tuple(form.strip() for form in slot.split(FORM_SEPARATOR) if form.strip()) for slot in row]
    return [term for term in terms if term]


def predict_terms(sentences: Sequence[str], slots: Sequence[Sequence[str]], banned: Sequence[Sequence[str]],
                  translator: TranslatorInterface | None, sampling: bool) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The `translate_constrained` signature's inputs (`constraints` and `banned`, one row of slots per sentence,
    "" for none) as /translate's terms: `(items, banned)`, the items `(sentence, None, constraints)` triples.
    A request bans one list of phrases here, so its rows must ban the same (the SavedModel takes a list per row).

    Raises:
        ConfigError: (the request's 400) a row of more slots than the limits, rows banning different phrases,
            and what `parse_terms` refuses.
    """
    for name, rows, limit in (("constraints", slots, MAX_CONSTRAINTS), ("banned", banned, MAX_BANNED)):
        for index, row in enumerate(rows):
            if len(row) > limit:
                raise ConfigError(f"{name}: row {index + 1} has {len(row)} slots; at most {limit} per line.")
    phrases = {tuple(phrase.strip() for phrase in row if phrase.strip()) for row in banned}
    if len(phrases) > 1:
        raise ConfigError("banned: this server bans one list of phrases per request; give every row the same "
                          "banned phrases.")
    common = list(phrases.pop()) if phrases else []
    if any(FORM_SEPARATOR in phrase for phrase in common):
        raise ConfigError("banned: a phrase holds a tab; each slot is one phrase.")
    terms = parse_terms({"constraints": [slot_terms(row) for row in slots], "banned": common or None}, list(sentences),
                        translator, sampling)
    assert terms is not None  # constraints were given
    return tuple(zip(sentences, [None] * len(sentences), terms[0])), terms[1]


def slot_flags(row: Sequence[str], unmet: Sequence[Any]) -> list[bool]:
    """Per slot of a `constraints` row, whether the translation contains its constraint, from the engine's
    `unmet` list (`engines.terms.shown` terms, in slot order; True for an empty slot). Of identical constraints,
    the later ones are the unmet (`decoding.constraints.constraints_met`), so they are matched from the end.

    Example:

    >>> slot_flags(["Hund", "", "Hund", "Katze"], ["Hund"])
    [True, True, False, True]
    """
    left = list(unmet)
    flags = []
    for slot in reversed(row):
        term = slot_terms([slot])
        missing = bool(term) and bool(left) and left[-1] == shown(term[0])
        if missing:
            left.pop()
        flags.append(not missing)
    return flags[::-1]
