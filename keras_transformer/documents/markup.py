"""HTML and XML documents translated with their markup: `translate_markup(text, translate, ...)`, or in two steps,
`read_markup` (the sentences) and `MarkupDocument.render` (their translations put back).

The document is parsed by lxml: HTML as browsers do (lxml.html's recovering parser: unclosed tags closed, stray end
tags dropped), XML and XHTML strictly (a document that is not well-formed is refused in one line naming the line
and column). Then:

- **Blocks** (every element not in `INLINE`: ``p``, ``li``, ``td``, ``h1``, ``div``, ``title``...) are translation
  units: the text and inline elements between two blocks form one run, segmented into sentences
  (`segmentation.split_sentences`; a ``br`` also ends a sentence). Whitespace inside a run is collapsed to one space,
  as a browser shows it; the whitespace at the run's edges is kept.
- **Inline elements** (``b``, ``i``, ``a``, ``span``, ``em``, ``strong``, ``u``, ``sub``, ``br``, ``img``...) are
  taken out of the text for translation and put back around the translation of the words they enclosed: an
  aligner (`alignment`) says which target words translate which source words; each element gets the adjacent
  target words aligned to its source words (of several such runs, the one of most weight), kept inside its
  parent and after its preceding sibling, so the output has the same elements in the same nesting and order. An
  element whose words align to nothing gets the proportional place, sentence boundaries kept exact; an empty one
  (``br``, ``img``) the place of the word it stood before. A tag inside a word encloses the whole word.
- **Left untouched**: ``code``, ``pre``, ``script``, ``style``, ``kbd``, ``samp``, ``var``, ``textarea``, ``svg``,
  ``math``, and every element with ``translate="no"`` (or class ``notranslate``), with all they hold. Inline
  ones (``<code>`` in a sentence) stay in their sentence, whose translation sees their text, and come back
  as they were at their aligned place.
- Attributes stay as they were; the text of ``alt`` and ``title`` is translated (`attributes=()` keeps them).
  Entities come back as the characters they stand for (``&nbsp;`` as U+00A0), with ``&amp;``, ``&lt;`` and
  ``&gt;`` escaped again; comments, processing instructions and the doctype are kept.

Generic XML has no notion of inline: its elements are blocks unless their name is one of `INLINE` (XHTML's are).

Standard library, numpy and lxml only.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import html
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from lxml import etree
from lxml import html as lxml_html

from keras_transformer.documents.alignment import Aligner, proportional_alignment
from keras_transformer.documents.segmentation import has_words, split_sentences
from keras_transformer.errors import DocumentError

INLINE = frozenset("a abbr b bdi bdo big br cite code data del dfn em font i img ins kbd label mark q s samp small "
                   "span strike strong sub sup time tt u var wbr".split())
UNTOUCHED = frozenset("code pre script style kbd samp var textarea svg math".split())
_EMPTY = frozenset({"br", "wbr", "img"})
_DOCUMENT_START = re.compile(r"\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*(?:<!doctype|<(?:html|head|body)[\s>])",
                             re.I | re.S)
_DOCTYPE = re.compile(r"<!doctype", re.I)
_SPACE = " \t\n\r\f"  # HTML's whitespace: a no-break space (U+00A0) is text, not a word boundary
_XML_DECLARATION = re.compile(r"\s*<\?xml[^>]*\?>")
_PUNCTUATION = re.compile(r"[^\w\s]+")


def _name(node: Any) -> str | None:
    """An element's local name, lowercase; None for a comment, processing instruction or entity."""
    if not isinstance(node.tag, str):
        return None
    return etree.QName(node).localname.lower()


def _untouched(node: Any) -> bool:
    return (_name(node) in UNTOUCHED or node.get("translate", "").lower() == "no"
            or "notranslate" in (node.get("class") or "").split())


def _inline(node: Any) -> bool:
    """True for what belongs in a run: inline elements holding no block, comments and the like."""
    name = _name(node)
    if name is None:
        return True
    if name not in INLINE:
        return False
    return all(_name(inner) is None or _name(inner) in INLINE for inner in node.iterdescendants())


@dataclasses.dataclass
class _Node:
    """An inline element of a run: its source word range, then its target one."""

    element: Any
    opaque: bool  # copied back as it was (untouched, a comment)
    children: list[_Node] = dataclasses.field(default_factory=list)
    chars: tuple[int, int] = (0, 0)
    source: tuple[int, int] = (0, 0)
    target: tuple[int, int] = (0, 0)
    punctuation_outside: tuple[bool, bool] = (False, False)  # the source word's punctuation before / after it
    spaces: tuple[bool, bool] = (True, True)  # an empty element: whitespace before / after it in the source


@dataclasses.dataclass
class _Run:
    """The text and inline elements between two blocks: `items` as they were (strings and elements)."""

    items: list[Any]
    roots: list[_Node] = dataclasses.field(default_factory=list)
    text: str = ""
    words: list[str] = dataclasses.field(default_factory=list)
    sentences: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # word ranges
    indices: list[int | None] = dataclasses.field(default_factory=list)  # each sentence's place in the batch

    def read(self, language: str | None) -> None:
        """Fills `roots`, `text`, `words` and `sentences` from `items`."""
        parts: list[str] = []
        breaks: list[int] = []
        length = [0]

        def add(text: str | None) -> None:
            if text:
                parts.append(text)
                length[0] += len(text)

        def visit(node: Any, siblings: list[_Node]) -> None:
            name = _name(node)
            entry = _Node(node, opaque=name is None or _untouched(node))
            start = length[0]
            if name in _EMPTY:
                if name == "br":
                    breaks.append(length[0])
                add(" ")
            elif entry.opaque:
                add("".join(node.itertext()) if name is not None else None)
            else:
                add(node.text)
                for child in node:
                    visit(child, entry.children)
                    add(child.tail)
            entry.chars = (start, length[0])
            siblings.append(entry)

        for item in self.items:
            if isinstance(item, str):
                add(item)
            else:
                visit(item, self.roots)
        self.text = "".join(parts)
        spans = [match.span() for match in re.finditer(f"[^{_SPACE}]+", self.text)]
        self.words = [self.text[a:b] for a, b in spans]
        starts, ends = [a for a, _ in spans], [b for _, b in spans]
        self._ranges(self.roots, spans, starts, ends)
        cuts = sorted({bisect.bisect_left(starts, offset) for offset in breaks} | {0, len(spans)})
        for a, b in zip(cuts, cuts[1:]):
            self.sentences += _sentences(self.words, a, b, language)

    def untouched_words(self) -> set[int]:
        """The indices of the words inside untouched elements: a sentence of those only is not translated."""
        words: set[int] = set()
        stack = list(self.roots)
        while stack:
            node = stack.pop()
            if node.opaque:
                words.update(range(*node.source))
            else:
                stack += node.children
        return words

    def _ranges(self, nodes: list[_Node], spans: list[tuple[int, int]], starts: list[int], ends: list[int]) -> None:
        """Each node's source word range, from its character range."""
        for node in nodes:
            first, end = node.chars
            # the words that overlap [first, end): those ending after `first` and starting before `end`
            low, high = bisect.bisect_right(ends, first), bisect.bisect_left(starts, end)
            if high > low and end > first:
                node.source = (low, high)
                head, tail = self.text[spans[low][0]:first], self.text[end:spans[high - 1][1]]
                node.punctuation_outside = (bool(_PUNCTUATION.fullmatch(head)), bool(_PUNCTUATION.fullmatch(tail)))
            else:
                position = bisect.bisect_left(starts, first)
                node.source = (position, position)
                node.spaces = (first == 0 or self.text[first - 1].isspace(),
                               end >= len(self.text) or self.text[end].isspace())
            self._ranges(node.children, spans, starts, ends)


def _sentences(words: list[str], start: int, end: int, language: str | None) -> list[tuple[int, int]]:
    """The word ranges of the sentences of `words[start:end]`."""
    if start >= end:
        return []
    offsets, position = [], 0
    for word in words[start:end]:
        offsets.append(position)
        position += len(word) + 1
    boundaries = [a for a, _ in split_sentences(" ".join(words[start:end]), language)] or [0]
    owner = [max(bisect.bisect_right(boundaries, offset) - 1, 0) for offset in offsets]
    ranges, first = [], 0
    for i in range(1, len(owner) + 1):
        if i == len(owner) or owner[i] != owner[first]:
            ranges.append((start + first, start + i))
            first = i
    return ranges


def _fill(element: Any, items: list[Any]) -> None:
    """`element`'s content (text and children; not its tail) replaced by `items`, strings and elements."""
    element.text = None
    for child in list(element):
        element.remove(child)
    last = None
    for item in items:
        if isinstance(item, str):
            if not item:
                continue
            if last is None:
                element.text = (element.text or "") + item
            else:
                last.tail = (last.tail or "") + item
        else:
            item.tail = None
            element.append(item)
            last = item


class _Translation:
    """One document's runs and attributes, collected, translated in one call, and written back."""

    def __init__(self, language: str | None, attributes: Sequence[str]):
        self.language, self.attributes = language, tuple(attributes)
        self.sentences: list[str] = []
        self.containers: list[tuple[Any, list[Any]]] = []  # (block, its content: runs and child blocks)
        self.attribute_slots: list[tuple[Any, str, int]] = []

    def _add(self, sentence: str) -> int:
        self.sentences.append(sentence)
        return len(self.sentences) - 1

    def collect(self, block: Any) -> None:
        if _untouched(block):
            return
        self._collect_attributes(block)
        content: list[Any] = []
        run = _Run([block.text or ""])
        for child in list(block):
            if _inline(child):
                run.items += [child, child.tail or ""]
                if _name(child) is not None and not _untouched(child):
                    for inner in child.iter():
                        if isinstance(inner.tag, str) and not any(_untouched(a) for a in _ancestors(inner, child)):
                            self._collect_attributes(inner)
            else:
                content.append(run)
                content.append(child)
                self.collect(child)
                run = _Run([child.tail or ""])
        content.append(run)
        for item in content:
            if isinstance(item, _Run):
                item.read(self.language)
                kept = item.untouched_words()
                item.indices = [self._add(" ".join(item.words[a:b]))
                                if has_words(" ".join(item.words[a:b])) and not set(range(a, b)) <= kept else None
                                for a, b in item.sentences]
        self.containers.append((block, content))

    def _collect_attributes(self, element: Any) -> None:
        for name in self.attributes:
            value = element.get(name)
            if value and has_words(value):
                self.attribute_slots.append((element, name, self._add(" ".join(value.split()))))

    def write(self, translations: list[str], align: Aligner) -> None:
        for element, name, index in self.attribute_slots:
            element.set(name, translations[index])
        for block, content in self.containers:
            items: list[Any] = []
            for item in content:
                items += _render_run(item, translations, align) if isinstance(item, _Run) else [item]
            _fill(block, items)


def _ancestors(element: Any, top: Any) -> list[Any]:
    """`element` and its ancestors up to `top`, both included."""
    chain = [element]
    while chain[-1] is not top and chain[-1].getparent() is not None:
        chain.append(chain[-1].getparent())
    return chain


def _render_run(run: _Run, translations: list[str], align: Aligner) -> list[Any]:
    """The run's new content: its edge whitespace, and the translated words with its inline elements placed."""
    if all(index is None for index in run.indices):
        return [item for item in run.items if not isinstance(item, str) or item]
    target: list[str] = []
    bounds: list[tuple[int, int, int, int]] = []  # (source start, end, target start, end) per sentence
    for (a, b), index in zip(run.sentences, run.indices):
        words = run.words[a:b] if index is None else re.findall(f"[^{_SPACE}]+", translations[index])
        bounds.append((a, b, len(target), len(target) + len(words)))
        target += words
    if run.roots:
        best = np.full(len(target), -1)  # per target word, the source word it aligns to best (-1: none)
        strength = np.zeros(len(target))  # and that weight
        for (a, b, c, d), index in zip(bounds, run.indices):
            if b > a and d > c:
                weights = np.eye(b - a) if index is None else np.asarray(align(run.words[a:b], target[c:d]), float)
                aligned = weights.max(axis=0) > 0
                best[c:d] = np.where(aligned, a + weights.argmax(axis=0), -1)
                strength[c:d] = np.where(aligned, weights.max(axis=0), 0.0)
        _place(run.roots, 0, len(target), (best, strength), bounds, len(target))
    lead = run.text[:len(run.text) - len(run.text.lstrip(_SPACE))]
    trail = run.text[len(run.text.rstrip(_SPACE)):] if run.text.strip(_SPACE) else ""
    return [lead] + _render(run.roots, 0, len(target), target) + [trail]


def _position(source: int, bounds: list[tuple[int, int, int, int]], total: int) -> int:
    """A source word boundary's place among the target words: exact at sentence boundaries, proportional inside."""
    for a, b, c, d in bounds:
        if a <= source < b:
            return c + round((source - a) * (d - c) / (b - a))
    return total


def _aligned_span(alignment: tuple[np.ndarray, np.ndarray], source: tuple[int, int], low: int,
                  high: int) -> tuple[int, int] | None:
    """The target words of `[low, high)` that align best to a word of `source` (`alignment`: per target word, its
    best source word and that weight), as a span: of the runs of adjacent such words, the one of most weight (a
    stray word elsewhere in the sentence does not stretch the tag over the words between); None when no word
    aligns there."""
    s0, s1 = source
    if s1 <= s0 or high <= low:
        return None
    best, strength = alignment
    window = best[low:high]
    hits = [low + int(j) for j in np.flatnonzero((window >= s0) & (window < s1))]
    if not hits:
        return None
    runs, start = [], hits[0]
    for previous, j in zip(hits, hits[1:] + [-1]):
        if j != previous + 1:
            runs.append((start, previous + 1))
            start = j
    return max(runs, key=lambda run: float(strength[run[0]:run[1]].sum()))


def _place(nodes: list[_Node], low: int, high: int, alignment: tuple[np.ndarray, np.ndarray],
           bounds: list[tuple[int, int, int, int]], total: int) -> None:
    """Each node's target word range: its aligned words' span, within `[low, high)` and after its elder sibling."""
    cursor = low
    for node in nodes:
        s0, s1 = node.source
        span = _aligned_span(alignment, node.source, low, high)
        if span:
            t0, t1 = span
        else:
            t0 = _position(s0, bounds, total)
            t1 = max(_position(s1, bounds, total), t0 + 1) if s1 > s0 else t0
        t0 = min(max(t0, cursor), high)
        t1 = min(max(t1, t0), high)
        node.target = (t0, t1)
        _place(node.children, t0, t1, alignment, bounds, total)
        cursor = t1


def _render(nodes: list[_Node], low: int, high: int, words: list[str]) -> list[Any]:
    """Target words `[low, high)` as strings and elements, one space between adjacent words, outside the tags that
    start or end between them."""
    items: list[Any] = []
    k, i = low, 0
    while True:
        empty = []
        while i < len(nodes) and nodes[i].target[1] == nodes[i].target[0] <= k:
            empty.append(nodes[i])
            i += 1
        inner = low < k < high
        if empty:  # the source's whitespace around them, where there is a space to place
            items += ([" "] if inner and empty[0].spaces[0] else []) + [_element(node, words) for node in empty]
            items += [" "] if inner and empty[-1].spaces[1] else []
        elif inner:
            items.append(" ")
        if i < len(nodes) and nodes[i].target[0] <= k:
            items += _with_punctuation_outside(nodes[i], _element(nodes[i], words), words)
            k = max(k, nodes[i].target[1])
            i += 1
            continue
        if k >= high:
            break
        items.append(words[k])
        k += 1
    while i < len(nodes):  # placed past the end: none should be, kept all the same
        items.append(_element(nodes[i], words))
        i += 1
    return items


def _with_punctuation_outside(node: _Node, element: Any, words: list[str]) -> list[Any]:
    """`[element]`, with the punctuation that opens or closes its text moved out of it where the source's tag left
    its word's punctuation out (``<b>dog</b>.`` gives ``<b>Hund</b>.``, not ``<b>Hund.</b>``); for an untouched
    element, copied as it was, the punctuation of the target words it replaces."""
    if node.opaque:
        t0, t1 = node.target
        first = re.match(r"[^\w\s]+", words[t0]) if node.punctuation_outside[0] and t1 > t0 else None
        last = re.search(r"[^\w\s]+$", words[t1 - 1]) if node.punctuation_outside[1] and t1 > t0 else None
        return ([first.group(0)] if first else []) + [element] + ([last.group(0)] if last else [])
    before, after = "", ""
    if node.punctuation_outside[0] and element.text:
        match = re.match(r"[^\w\s]+", element.text)
        if match and match.end() < len(element.text):
            before, element.text = match.group(0), element.text[match.end():]
    last = element[-1] if len(element) else None
    text = element.text if last is None else last.tail
    if node.punctuation_outside[1] and text:
        match = re.search(r"[^\w\s]+$", text)
        if match and (match.start() > 0 or last is not None):
            after, text = match.group(0), text[:match.start()]
            if last is None:
                element.text = text
            else:
                last.tail = text
    return [item for item in (before, element, after) if not isinstance(item, str) or item]


def _element(node: _Node, words: list[str]) -> Any:
    if node.opaque:
        return copy.deepcopy(node.element)
    original = node.element
    element = original.makeelement(original.tag, dict(original.attrib), nsmap=original.nsmap)
    _fill(element, _render(node.children, node.target[0], node.target[1], words))
    return element


class MarkupDocument:
    """An HTML or XML document parsed and its sentences collected (`read_markup`): `sentences` to translate, then
    `render(translations)` writes them into its tree and gives the document back (once: the tree is changed)."""

    def __init__(self, translation: _Translation, serialize: Callable[[], str]) -> None:
        self._translation, self._serialize, self._rendered = translation, serialize, False

    @property
    def sentences(self) -> list[str]:
        """The document's sentences (and attribute texts) to translate, in document order."""
        return list(self._translation.sentences)

    def render(self, translations: Sequence[str], align: Aligner | None = None) -> str:
        """The document with `translations` (one per sentence of `sentences`) in place of its sentences, inline
        elements placed by `align` (None: `proportional_alignment`).

        Raises:
            ValueError: another number of translations than sentences, or a second render (both named).
        """
        if len(translations) != len(self._translation.sentences):
            raise ValueError(f"{len(self._translation.sentences)} sentence(s) but {len(translations)} "
                             "translation(s).")
        if self._rendered:
            raise ValueError("a markup document is rendered once (its tree now holds the translation).")
        self._rendered = True
        self._translation.write(list(translations), align or proportional_alignment)
        return self._serialize()


def read_markup(text: str, language: str | None = "en", format: str = "html",
                attributes: Sequence[str] = ("alt", "title")) -> MarkupDocument:
    """`text`, an HTML or XML document (or fragment), parsed and its sentences collected for translation.

    Args:
        text: the document.
        language: the source language (for the segmenter).
        format: "html" (lxml.html: recovers as browsers do) or "xml" (XML or XHTML, well-formed).
        attributes: the attributes whose text is translated.

    Raises:
        DocumentError: XML that is not well-formed (line and column named), or text lxml finds no document in.

    Example:

    >>> markup = read_markup('<p>A <b>big</b> dog. <code>x = 1</code></p>')
    >>> markup.sentences
    ['A big dog.']
    >>> markup.render(["A BIG DOG."])
    '<p>A <b>BIG</b> DOG. <code>x = 1</code></p>'
    """
    if format not in ("html", "xml"):
        raise DocumentError(f"unknown markup format {format!r}; choose html or xml.")
    lead = text[:len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()):]
    translation = _Translation(language, attributes)
    if format == "xml":
        declaration = _XML_DECLARATION.match(text)
        parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)
        try:
            root = etree.fromstring(text.strip().encode("utf-8"), parser)
        except etree.XMLSyntaxError as error:
            raise DocumentError(f"the XML document is not well-formed: {error.msg} (line {error.lineno}, column "
                                f"{error.position[1]}); fix it, or give it as html to parse it as a browser "
                                "would.") from None
        translation.collect(root)
        prefix = declaration.group(0).strip() + "\n" if declaration else ""
        return MarkupDocument(translation, lambda: lead + prefix + etree.tostring(
            root.getroottree(), encoding="unicode") + trail)
    try:
        if _DOCUMENT_START.match(text):
            page = lxml_html.document_fromstring(text)
            translation.collect(page)

            def serialize_page() -> str:
                out = etree.tostring(page.getroottree(), encoding="unicode", method="html").strip()
                if not _DOCTYPE.search(text):  # lxml supplies one; a document without stays without
                    out = re.sub(r"^<!DOCTYPE[^>]*>\s*", "", out)
                return lead + out + trail

            return MarkupDocument(translation, serialize_page)
        wrapper = lxml_html.fragment_fromstring(text.strip(), create_parent="div")
    except (etree.ParserError, ValueError) as error:
        raise DocumentError(f"no HTML document could be read: {error}.") from None
    translation.collect(wrapper)
    return MarkupDocument(translation, lambda: lead + html.escape(wrapper.text or "", quote=False) + "".join(
        etree.tostring(child, encoding="unicode", method="html", with_tail=True) for child in wrapper) + trail)


def translate_markup(text: str, translate: Callable[[list[str]], list[str]], language: str | None = "en",
                     align: Aligner | None = None, format: str = "html",
                     attributes: Sequence[str] = ("alt", "title")) -> str:
    """`text`, an HTML or XML document (or fragment), with its sentences translated and its markup kept
    (`read_markup`, then `MarkupDocument.render`).

    Args:
        text: the document.
        translate: a batch translation: a list of sentences in, one translation each out. It is called once,
            with every sentence of the document (and the attributes' texts).
        language: the source language (for the segmenter).
        align: an aligner (`alignment`); None: `proportional_alignment`.
        format: "html" (lxml.html: recovers as browsers do) or "xml" (XML or XHTML, well-formed).
        attributes: the attributes whose text is translated.

    Raises:
        DocumentError: XML that is not well-formed (line and column named), or text lxml finds no document in.

    Example:

    >>> upper = lambda sentences: [s.upper() for s in sentences]
    >>> translate_markup('<p>A <b>big</b> dog. <code>x = 1</code></p>', upper)
    '<p>A <b>BIG</b> DOG. <code>x = 1</code></p>'
    """
    markup = read_markup(text, language, format, attributes)
    return markup.render(translate(markup.sentences), align)
