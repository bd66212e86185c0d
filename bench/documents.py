"""Documents through `translate_document` on the shipped EN-DE model: segmentation, BLEU, speed and HTML tags.

    python bench/documents.py [--model saved_models/multi30k_en_de] [--seed 0] [--limit N] [--rounds 3] \
        [--no-timing | --timing-only]

Multi30k test2016 (1,000 captions, in file order) is grouped into paragraphs of 3-8 sentences joined by a space
(sizes drawn with `random.Random(seed)`, the paragraphs of `bench/segmentation.py`); `--limit N` takes the first N
paragraphs. The paragraphs go to the model three ways:

- **sentence by sentence**: `translate_lines` over the true sentences, each paragraph's translations joined by a
  space (what a user who splits sentences perfectly gets);
- **document path**: `translate_document` over one text holding every paragraph, blank lines between them (one
  call, the engine batching all sentences by length), its output split back at the blank lines;
- **paragraph as one line**: `translate_lines` over the paragraphs (what an engine that takes a string as one
  sentence gives).

All three are scored alike, **paragraph by paragraph**: each paragraph's output against the paragraph's reference
sentences joined by a space, with cased sacreBLEU and by the published protocol (lowercased, Moses-tokenized output
against the joined `*.lc.norm.tok.de` lines; `evaluation.evaluate_translations`). The length ratio is the output's
over the reference's, in sacreBLEU's tokens. 52 captions lack final punctuation, so no segmenter can see where they
end; the first three systems take the captions as they are, and the sentence and document paths are scored again
with a period given to those 52 (the boundaries a segmenter can see). Segmentation agreement: a sentence counts when
the document path's segmenter (`documents.segmentation.segment`) gives it back as one sentence, exactly.

Speed: sentences per second of the document path and of `translate_lines` over the same sentences (the paragraphs
with final periods, so that both give the model the same sentences), in `--rounds` rounds after the quality passes
(with `--timing-only`, one untimed pass of each), which trace every batch shape. Each round times both, their order
alternating; the figure is the median of the rounds' ratios, by wall time and by the process's CPU time (which
others' work on the machine moves less). Run it on an idle machine (the highest load average seen is printed), or
pass `--no-timing`, and `--timing-only` later.

HTML: the same paragraphs as `<p>` elements over `--pages` pages; in each sentence, 0-2 inline tags (`b`, `i`,
`a href`, `em`, `span class`) around one word (70%) or a phrase of 2-3 words, a one-word tag nested in some of the
phrases. Every page goes through `translate_document(format="html")`. Checked: each page parses as XML
(well-formed), and each paragraph's elements, attributes and nesting are the source's. Placement of a tag around
one English word, judged without the aligner: a lexicon of the word's German translations, derived from Multi30k
train (29,000 pairs) by co-occurrence (Dice coefficient), says which output word translates it. A tag is judged
when its word occurs once in the source paragraph and lexicon translations of it occur exactly once in the output
paragraph (so there is one right place); it is placed right when it encloses that occurrence. Judged for the
model's cross-attention aligner (the default) and for position alone (`proportional_alignment`), on the same pages.
"""

import argparse
import collections
import html
import os
import pathlib
import random
import re
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from segmentation import paragraphs  # noqa: E402  (bench/segmentation.py: the same paragraphs)

from keras_transformer import evaluation  # noqa: E402
from keras_transformer.documents.segmentation import segment  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "multi30k"
TAGS = (("b", ""), ("i", ""), ("a", ' href="#w{n}"'), ("em", ""), ("span", ' class="hl"'))
_EDGES = re.compile(r"^(\W*)(.*?)(\W*)$")  # a word's leading punctuation, its core, its trailing punctuation


def words(text):
    """The lowercased words of `text` (letters and digits), for the lexicon and the placement check."""
    return re.findall(r"\w+", text.lower())


def recovered(groups, language="en"):
    """`(sentences the document path's segmenter gives back exactly, sentences)` over `groups`."""
    found = total = 0
    for text, starts, group in groups:
        got, position = set(), 0
        for sentence in segment(text, language).sentences:
            position = text.index(sentence, position)
            got.add((position, len(sentence)))
            position += len(sentence)
        found += sum((start, len(sentence)) in got for start, sentence in zip(starts, group))
        total += len(group)
    return found, total


def document_path(translator, groups):
    """Each paragraph's translation by one `translate_document` call over all of them, blank lines between."""
    out = translator.translate_document("\n\n".join(text for text, _, _ in groups)).split("\n\n")
    if len(out) != len(groups):
        raise SystemExit(f"the document path gave {len(out)} paragraphs for {len(groups)}")
    return out


def sentence_path(translator, groups):
    """Each paragraph's sentences translated one by one (one `translate_lines` call), joined by a space."""
    flat = translator.translate_lines([sentence for _, _, group in groups for sentence in group])
    out, position = [], 0
    for _, _, group in groups:
        out.append(" ".join(flat[position:position + len(group)]))
        position += len(group)
    return out


def score(hypotheses, groups, references, tokenized):
    """`(cased BLEU, lc.tok BLEU, length ratio)` of paragraph outputs against the joined reference sentences.

    The output is Moses-tokenized before it is lowercased (`evaluation.multi30k_bleu` lowercases first, right for a
    sentence): Moses splits a period off a word only when the next word is not lowercase, so a paragraph lowercased
    first would keep "hut." as one token where the joined reference lines have "hut ."."""
    joined, joined_tokenized, position = [], [], 0
    for _, _, group in groups:
        joined.append(" ".join(references[position:position + len(group)]))
        joined_tokenized.append(" ".join(tokenized[position:position + len(group)]))
        position += len(group)
    cased = evaluation.bleu(hypotheses, joined)
    tokens = [line.lower() for line in evaluation.moses_preprocess(hypotheses, "de", lowercase=False)]
    return cased.score, evaluation.bleu(tokens, joined_tokenized, tokenize="none").score, cased.sys_len / cased.ref_len


def throughput(translator, groups, rounds):
    """`{"wall": ..., "cpu": ...}`, each `(document sentences/s, lines sentences/s, [ratio per round])`: rates are
    medians over `rounds` paired rounds, by wall time and by this process's CPU time (all its threads)."""
    sentences = sum(len(group) for _, _, group in groups)
    rates = {clock: {"document": [], "lines": []} for clock in ("wall", "cpu")}
    for index in range(rounds):
        runs = [("document", document_path), ("lines", sentence_path)]
        for name, run in runs if index % 2 == 0 else runs[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            run(translator, groups)
            rates["wall"][name].append(sentences / (time.perf_counter() - wall))
            rates["cpu"][name].append(sentences / (time.process_time() - cpu))
    return {clock: (statistics.median(r["document"]), statistics.median(r["lines"]),
                    [d / line for d, line in zip(r["document"], r["lines"])]) for clock, r in rates.items()}


def lexicon(english, german, min_count=5, min_dice=0.3, share=0.75):
    """`{english word: {german words}}`: per English word seen `min_count` times, the German words whose Dice
    coefficient of co-occurrence in the same sentence pair is at least `min_dice`, and at least `share` of the best
    of either word (so "man" gets "mann", not the "ein" that goes with "a" even more often)."""
    count_en, count_de, pairs = collections.Counter(), collections.Counter(), collections.Counter()
    for en, de in zip(english, german):
        en_words, de_words = set(words(en)), set(words(de))
        count_en.update(en_words)
        count_de.update(de_words)
        pairs.update((e, d) for e in en_words for d in de_words)
    dice = {(e, d): 2 * both / (count_en[e] + count_de[d]) for (e, d), both in pairs.items()
            if count_en[e] >= min_count and count_de[d] >= min_count}
    best_en, best_de = collections.Counter(), collections.Counter()
    for (e, d), value in dice.items():
        best_en[e], best_de[d] = max(best_en[e], value), max(best_de[d], value)
    out = collections.defaultdict(set)
    for (e, d), value in dice.items():
        if value >= min_dice and value >= share * best_en[e] and value >= share * best_de[d]:
            out[e].add(d)
    return dict(out)


def tag_sentence(sentence, rng, tags):
    """`sentence` as HTML with 0-2 inline tags; appends `(kind, english word or None)` to `tags` per tag, in
    document order (an outer tag before the tag nested in it)."""
    tokens = sentence.split(" ")
    spans = []  # (start, end, kind, attributes, depth, word)
    for _ in range(rng.choice((0, 1, 1, 2))):
        length = 1 if rng.random() < 0.7 else rng.randint(2, 3)
        free = [i for i in range(len(tokens) - length + 1)
                if all(i + length <= s or i >= e for s, e, *_ in spans) and _EDGES.match(tokens[i]).group(2)
                and _EDGES.match(tokens[i + length - 1]).group(2)]
        if not free:
            continue
        start = rng.choice(free)
        kind, attributes = rng.choice(TAGS)
        attributes = attributes.format(n=len(tags) + len(spans))
        word = _EDGES.match(tokens[start]).group(2).lower() if length == 1 else None
        spans.append((start, start + length, kind, attributes, 0, word))
        if length > 1 and rng.random() < 0.3:  # a one-word tag nested in the phrase
            inner = rng.randrange(start, start + length)
            if _EDGES.match(tokens[inner]).group(2):
                kind2, attributes2 = rng.choice([t for t in TAGS if t[0] != kind])
                attributes2 = attributes2.format(n=len(tags) + len(spans))
                spans.append((inner, inner + 1, kind2, attributes2, 1, _EDGES.match(tokens[inner]).group(2).lower()))
    for span in sorted(spans, key=lambda s: (s[0], s[4])):
        tags.append((span[2], span[5]))
    out = []
    for i, token in enumerate(tokens):
        lead, core, trail = _EDGES.match(token).groups()
        opens = sorted((s for s in spans if s[0] == i), key=lambda s: s[4])
        closes = sorted((s for s in spans if s[1] == i + 1), key=lambda s: -s[4])
        out.append(html.escape(lead, quote=False)
                   + "".join(f"<{s[2]}{s[3]}>" for s in opens)
                   + html.escape(core, quote=False) + "".join(f"</{s[2]}>" for s in closes)
                   + html.escape(trail, quote=False))
    return " ".join(out)


def pages(groups, seed, count):
    """`(pages, tags per paragraph)`: the paragraphs as `<p>` elements of `count` HTML pages."""
    rng = random.Random(seed)
    paragraphs_html, tags = [], []
    for _, _, group in groups:
        tags.append([])
        paragraphs_html.append("<p>" + " ".join(tag_sentence(s, rng, tags[-1]) for s in group) + "</p>")
    size = -(-len(paragraphs_html) // count)
    return ["<!DOCTYPE html>\n<html><body>\n" + "\n".join(paragraphs_html[i:i + size]) + "\n</body></html>\n"
            for i in range(0, len(paragraphs_html), size)], tags


def structure(element):
    """The elements under `element` in document order: `(depth, tag, attributes)`."""
    out = []

    def walk(node, depth):
        for child in node:
            if isinstance(child.tag, str):
                out.append((depth, child.tag, tuple(sorted(child.attrib.items()))))
                walk(child, depth + 1)

    walk(element, 0)
    return out


def check_html(sources, outputs, tags, lexicon_):
    """`(pages well-formed, paragraphs with the same elements, paragraphs, judged, placed right)`."""
    from lxml import etree

    well_formed = same = total = judged = right = 0
    index = 0
    for source, output in zip(sources, outputs):
        source_ps = etree.fromstring(source.encode()).iter("p")
        try:
            output_ps = list(etree.fromstring(output.encode()).iter("p"))
            well_formed += 1
        except etree.XMLSyntaxError:
            output_ps = []
        for n, source_p in enumerate(source_ps):
            paragraph_tags, index = tags[index], index + 1
            total += 1
            output_p = output_ps[n] if n < len(output_ps) else None
            if output_p is None or structure(output_p) != structure(source_p):
                continue
            same += 1
            source_words = words("".join(source_p.itertext()))
            output_words = words("".join(output_p.itertext()))
            elements = [e for e in output_p.iter() if e is not output_p]
            for (_, word), element in zip(paragraph_tags, elements):
                translations = lexicon_.get(word or "", set())
                if not translations or source_words.count(word) != 1 or \
                        sum(w in translations for w in output_words) != 1:
                    continue
                judged += 1
                right += any(w in translations for w in words("".join(element.itertext())))
    return well_formed, same, total, judged, right


def percent(part, whole):
    return f"{part:,}/{whole:,} ({part / max(whole, 1):.1%})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "saved_models" / "multi30k_en_de"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="the first N paragraphs (0: all)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each path")
    parser.add_argument("--pages", type=int, default=4, help="HTML pages the paragraphs are spread over")
    parser.add_argument("--no-timing", action="store_true", help="quality only (a loaded machine)")
    parser.add_argument("--timing-only", action="store_true", help="throughput only (an idle machine again)")
    args = parser.parse_args(argv)

    from keras_transformer import load_translator
    from keras_transformer.documents.alignment import proportional_alignment

    source = evaluation.read_lines(DATA / "test_2016_flickr.en.gz")
    references = evaluation.read_lines(DATA / "test_2016_flickr.de.gz")
    tokenized = evaluation.read_lines(DATA / "test_2016_flickr.lc.norm.tok.de.gz")
    punctuated = [s if s[-1] in ".!?" else s + "." for s in source]
    raw, fixed = paragraphs(source, args.seed), paragraphs(punctuated, args.seed)
    if args.limit:
        raw, fixed = raw[:args.limit], fixed[:args.limit]
    sentences = sum(len(group) for _, _, group in raw)
    load = os.getloadavg()[0]
    translator = load_translator(args.model)
    print(f"{sentences} sentences of test2016 in {len(raw)} paragraphs of 3-8 (seed {args.seed})", file=sys.stderr)

    if args.timing_only:  # one untimed pass of each traces every batch shape
        document_path(translator, fixed), sentence_path(translator, fixed)
    else:
        outputs = {"sentence by sentence": sentence_path(translator, raw),
                   "document path": document_path(translator, raw),
                   "paragraph as one line": translator.translate_lines([text for text, _, _ in raw])}
        scores = {name: score(hypotheses, raw, references, tokenized) for name, hypotheses in outputs.items()}
        scores_fixed = {"sentence by sentence": score(sentence_path(translator, fixed), fixed, references, tokenized),
                        "document path": score(document_path(translator, fixed), fixed, references, tokenized)}
        print("quality done", file=sys.stderr, flush=True)
    if not args.no_timing:
        speed = throughput(translator, fixed, args.rounds)
    load = max(load, os.getloadavg()[0])
    if not args.timing_only:
        html_pages, tags = pages(raw, args.seed, min(args.pages, len(raw)))
        train_en = evaluation.read_lines(DATA / "train.en.gz")
        train_de = evaluation.read_lines(DATA / "train.de.gz")
        lexicon_ = lexicon(train_en, train_de)
        placement = {}
        for name, align in (("cross-attention (default)", None), ("proportional", proportional_alignment)):
            translated = [translator.translate_document(page, format="html", align=align) for page in html_pages]
            placement[name] = check_html(html_pages, translated, tags, lexicon_)
        load = max(load, os.getloadavg()[0])

    print(f"\n{sentences:,} sentences of Multi30k test2016 in {len(raw)} paragraphs of 3-8 (seed {args.seed}); "
          f"{os.path.basename(args.model)}; paragraph-level BLEU; highest 1-minute load average seen: {load:.1f}\n")
    print("| measure | result | goal |")
    print("| --- | --- | --- |")
    if not args.timing_only:
        found, total = recovered(raw)
        found_fixed, _ = recovered(fixed)
        print(f"| segmentation: sentences recovered, captions as they are | {percent(found, total)} | |")
        print(f"| segmentation: with a period given to the captions that lack one | {percent(found_fixed, total)} "
              "| at least 99% |")
        for captions, table in (("as they are", scores), ("with final periods", scores_fixed)):
            for name, value in table.items():
                reference = table["sentence by sentence"]
                difference = ("" if name == "sentence by sentence" else
                              f" ({value[0] - reference[0]:+.2f} / {value[1] - reference[1]:+.2f})")
                goal = "within 0.2 of sentence by sentence" if name == "document path" else ""
                print(f"| BLEU cased / lc.tok, length ratio: {name}, captions {captions} | {value[0]:.2f} / "
                      f"{value[1]:.2f}{difference}, {value[2]:.2f} | {goal} |")
    if args.no_timing:
        print("| throughput: document path / translate_lines | unmeasured | at least 0.9x |")
    else:
        for clock, (document_rate, lines_rate, ratios) in speed.items():
            print(f"| throughput: sentences per {clock} second, document path / translate_lines (medians of "
                  f"{args.rounds} rounds) | {document_rate:.1f} / {lines_rate:.1f}: {statistics.median(ratios):.2f}x "
                  f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}) | at least 0.9x |")
    if not args.timing_only:
        well_formed, same, total_p, _, _ = placement["cross-attention (default)"]
        tag_count = sum(len(t) for t in tags)
        print(f"| HTML: pages well-formed; paragraphs with every tag ({tag_count:,} tags), attributes and nesting "
              f"kept | {percent(well_formed, len(html_pages))}; {percent(same, total_p)} | 100% |")
        for name, (_, _, _, judged, right) in placement.items():
            print(f"| HTML: one-word tags enclosing the word's lexicon translation, {name} | {percent(right, judged)} "
                  "| |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
