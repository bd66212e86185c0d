"""A multilingual model's language token from the code a user knows: `de` is M2M-100's `__de__`, NLLB's
`deu_Latn` and mBART's `de_DE`, as transformers' `M2M100Tokenizer.get_lang_id("de")` takes it.

`language_token` returns the token itself where the model has it, M2M-100's `__xx__` for `xx` (or its ISO
639-3 code), MADLAD-400's `<2xx>` for `xx` (a target-language token that opens the source: `names_target_language`),
and for NLLB's
`xxx_Script` codes the one code of the language: by ISO 639-3 for a two-letter ISO 639-1 code (`es` is Spanish,
`spa_Latn`, though Estonian's `est_Latn` starts with it), else the one code that starts with what was given; and
for mBART's `xx_YY` codes the one that opens with the two-letter code (`de` or `deu`: `de_DE`). A code that names
several (`zho`: `zho_Hans` and `zho_Hant`) or none is refused, the candidates named. Standard
library only.
"""

import re
from collections.abc import Sequence

from keras_transformer.errors import ConfigError

# ISO 639-1 -> the ISO 639-3 code NLLB-200 writes the language with (its macrolanguages' standard member:
# Standard Malay zsm for ms, Standard Latvian lvs for lv, Halh Mongolian khk for mn, ...).
ISO_639_3 = dict(pair.split(":") for pair in """
af:afr am:amh ar:arb as:asm az:azj ba:bak be:bel bg:bul bm:bam bn:ben bo:bod bs:bos ca:cat cs:ces cy:cym da:dan
de:deu dz:dzo ee:ewe el:ell en:eng eo:epo es:spa et:est eu:eus fa:pes ff:fuv fi:fin fj:fij fo:fao fr:fra ga:gle
gd:gla gl:glg gn:grn gu:guj ha:hau he:heb hi:hin hr:hrv ht:hat hu:hun hy:hye id:ind ig:ibo is:isl it:ita ja:jpn
jv:jav ka:kat kg:kon ki:kik kk:kaz km:khm kn:kan ko:kor ks:kas ku:kmr ky:kir lb:ltz lg:lug li:lim ln:lin lo:lao
lt:lit lv:lvs mg:plt mi:mri mk:mkd ml:mal mn:khk mr:mar ms:zsm mt:mlt my:mya nb:nob ne:npi nl:nld nn:nno no:nob
ny:nya oc:oci om:gaz or:ory pa:pan pl:pol ps:pbt pt:por qu:quy rn:run ro:ron ru:rus rw:kin sa:san sc:srd sd:snd
sg:sag si:sin sk:slk sl:slv sm:smo sn:sna so:som sq:als sr:srp ss:ssw st:sot su:sun sv:swe sw:swh ta:tam te:tel
tg:tgk th:tha ti:tir tk:tuk tl:tgl tn:tsn tr:tur ts:tso tt:tat ug:uig uk:ukr ur:urd uz:uzn vi:vie wo:wol xh:xho
yi:ydd yo:yor zh:zho zu:zul
""".split())


TARGET_LANGUAGE_TOKEN = re.compile(r"<2[^<>\s]+>")  # MADLAD-400's <2de>, <2zh_Latn>: "translate to"


def names_target_language(token: str) -> bool:
    """Whether `token` is a target-language token of the kind that opens a source (MADLAD-400's `<2de>`).

    Example:

    >>> names_target_language("<2de>"), names_target_language("__de__")
    (True, False)
    """
    return TARGET_LANGUAGE_TOKEN.fullmatch(token) is not None


def _shown(codes: Sequence[str]) -> str:
    return ", ".join(sorted(codes)[:12]) + (", ..." if len(codes) > 12 else "")


def language_token(code: str, languages: Sequence[str], side: str = "target", caller: str = "translator") -> str:
    """The language token of `languages` (a model's tokens: `__de__`, `deu_Latn`) that `code` names.

    Raises:
        ConfigError: a model without language tokens; a code that names none of them, or several (named).

    Example:

    >>> language_token("de", ["__en__", "__de__"]), language_token("__de__", ["__en__", "__de__"])
    ('__de__', '__de__')
    >>> language_token("de", ["eng_Latn", "deu_Latn"]), language_token("es", ["est_Latn", "spa_Latn"])
    ('deu_Latn', 'spa_Latn')
    >>> language_token("de", ["en_XX", "de_DE"]), language_token("deu", ["en_XX", "de_DE"])
    ('de_DE', 'de_DE')
    >>> language_token("de", ["<2en>", "<2de>"])
    '<2de>'
    >>> language_token("zh", ["zho_Hans", "zho_Hant"])
    Traceback (most recent call last):
    ...
    keras_transformer.errors.ConfigError: translator: target language 'zh' names several of this model's: ...
    """
    languages = tuple(languages)
    if not languages:
        raise ConfigError(f"{caller}: {side} language {code!r}: this model has no language tokens (it is not a "
                          "multilingual model)" + ("; give its translations a start with a target prefix instead."
                                                   if side == "target" else "."))
    if code in languages:
        return code
    lower = code.lower()
    two = next((short for short, long in ISO_639_3.items() if long == lower), lower)  # deu -> de
    for name in (lower, two):
        for token in (f"__{name}__", f"<2{name}>"):  # M2M-100's and MADLAD-400's token of a code
            if token in languages:
                return token
    stem = ISO_639_3.get(lower) if len(code) == 2 else None
    if stem is not None:  # NLLB's deu_Latn, mBART's de_DE
        candidates = [token for token in languages if token.split("_")[0] in (stem, lower)]
    else:  # the codes that start with it, M2M-100's without their underscores
        candidates = [token for token in languages if code and token.strip("_").lower().startswith(lower)]
        if not candidates and two != lower:  # an ISO 639-3 code of mBART's de_DE
            candidates = [token for token in languages if token.split("_")[0] == two]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise ConfigError(f"{caller}: {side} language {code!r} names several of this model's: "
                          f"{_shown(candidates)}; give one of them.")
    raise ConfigError(f"{caller}: unknown {side} language {code!r}; this model's {side} languages "
                      f"({len(languages)}): {_shown(languages)}.")


def target_language_in_source(source_languages: Sequence[str], target_languages: Sequence[str]) -> bool:
    """Whether a model's source language tokens name the target language (MADLAD-400's `<2de>`: "to German"), its
    target having none: `target_lang` then opens the source, and the model names no source language.

    Example:

    >>> target_language_in_source(["<2de>", "<2fr>"], []), target_language_in_source(["eng_Latn"], ["deu_Latn"])
    (True, False)
    """
    return (not target_languages and bool(source_languages)
            and all(names_target_language(token) for token in source_languages))


def source_side_token(target_lang: str | None, source_languages: Sequence[str], target_languages: Sequence[str],
                      caller: str = "translator") -> str | None:
    """The token of `target_lang` that opens the source, for a model whose source languages are target-language
    tokens (MADLAD-400's `<2de>`: `names_target_language`) and whose target has none; None for any other model
    (its target language is a target prefix) or without `target_lang`.

    Raises:
        ConfigError: a `target_lang` this model has no token for (its languages named).

    Example:

    >>> source_side_token("de", ["<2de>", "<2fr>"], []), source_side_token("de", ["eng_Latn"], ["deu_Latn"])
    ('<2de>', None)
    """
    if target_lang is None or not target_language_in_source(source_languages, target_languages):
        return None
    return language_token(target_lang, source_languages, "target", caller)


__all__ = ["ISO_639_3", "TARGET_LANGUAGE_TOKEN", "language_token", "names_target_language", "source_side_token",
           "target_language_in_source"]
