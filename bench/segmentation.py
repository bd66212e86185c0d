"""Sentence segmenters on Multi30k test2016 paragraphs: agreement with the true sentence boundaries, and speed.

    .venv/bin/python bench/segmentation.py [--seed 0] [--repeats 3] [--no-timing]

The 1,000 English sentences of test2016, in file order, are grouped into paragraphs of 3-8 sentences (sizes drawn
with `random.Random(seed)`) joined by one space: the paragraphs a user pastes. Each segmenter splits each paragraph;
a sentence counts as recovered when it comes back as one segment, exactly (whitespace around it aside). Two
columns: the sentences as they are (52 of the 1,000 lack final punctuation, so no segmenter can see where they end),
and with a period given to those 52 (the boundaries a segmenter can see). Boundary recall and precision count the
starts of sentences after the first of each paragraph. Speed: paragraphs per second, the best of `--repeats` passes
over all paragraphs (process CPU time, so the figure does not depend on what else the machine runs as much as wall
time would; still, time on an idle machine, or pass `--no-timing`).
"""

import argparse
import gzip
import pathlib
import random
import time

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def paragraphs(sentences, seed, low=3, high=8):
    """`[(paragraph text, [sentence start offsets])]`: consecutive sentences, 3-8 per paragraph, joined by a space."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(sentences):
        group = sentences[i:i + rng.randint(low, high)]
        i += len(group)
        starts, offset = [], 0
        for sentence in group:
            starts.append(offset)
            offset += len(sentence) + 1
        out.append((" ".join(group), starts, group))
    return out


def spans(segments, text):
    """The start offsets of `segments` (pieces of `text`, in order, perhaps stripped) in `text`."""
    starts, position = [], 0
    for segment in segments:
        segment = segment.strip()
        if not segment:
            continue
        position = text.index(segment, position)
        starts.append(position)
        position += len(segment)
    return starts


def segmenters():
    import pysbd
    import sentencex

    pysbd_en = pysbd.Segmenter(language="en", clean=False)
    return {
        f"sentencex {_version('sentencex')}": lambda text: list(sentencex.segment("en", text)),
        f"pysbd {_version('pysbd')}": pysbd_en.segment,
    }


def _version(name):
    from importlib.metadata import version

    return version(name)


def score(segment, groups):
    """`(sentences recovered, sentences, boundary recall, boundary precision)` of `segment` on `groups`."""
    recovered = total = found = true = predicted = 0
    for text, starts, group in groups:
        got = spans(segment(text), text)
        ends = got[1:] + [len(text) + 1]
        pieces = {(start, end) for start, end in zip(got, ends)}
        for start, sentence in zip(starts, group):
            total += 1
            recovered += (start, start + len(sentence) + 1) in pieces
        truth, guess = set(starts[1:]), set(got[1:])
        found, true, predicted = found + len(truth & guess), true + len(truth), predicted + len(guess)
    return recovered, total, found / true, found / max(predicted, 1)


def speed(segment, groups, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for text, _, _ in groups:
            segment(text)
        best = min(best, time.process_time() - start)
    return len(groups) / best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(DATA / "test_2016_flickr.en.gz"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-timing", action="store_true", help="agreement only (a loaded machine)")
    args = parser.parse_args(argv)
    with gzip.open(args.source, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f.read().split("\n") if line.strip()]
    punctuated = [s if s[-1] in ".!?" else s + "." for s in sentences]
    raw, fixed = paragraphs(sentences, args.seed), paragraphs(punctuated, args.seed)
    print(f"{len(sentences)} sentences of {pathlib.Path(args.source).name} in {len(raw)} paragraphs of 3-8 "
          f"(seed {args.seed}); {sum(s != p for s, p in zip(sentences, punctuated))} lack final punctuation")
    print("| segmenter | sentences recovered | with final punctuation | boundary recall / precision | "
          "paragraphs/s (CPU) |")
    print("| --- | --- | --- | --- | --- |")
    for name, segment in segmenters().items():
        got, total, _, _ = score(segment, raw)
        got_fixed, _, recall, precision = score(segment, fixed)
        rate = "unmeasured" if args.no_timing else f"{speed(segment, raw, args.repeats):,.0f}"
        print(f"| {name} | {got}/{total} ({got / total:.1%}) | {got_fixed}/{total} ({got_fixed / total:.1%}) | "
              f"{recall:.1%} / {precision:.1%} | {rate} |")


if __name__ == "__main__":
    main()
