"""bench/documents.py: its figures are consistent with each other, and its placement judge is the lexicon it says."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import documents

    return documents


class _Same(dict):
    """A lexicon in which every word translates to itself."""

    def get(self, word, default=None):
        return {word} if word else default


def test_an_identity_translator_scores_alike_on_every_path(bench, monkeypatch, capsys):
    # A translator that gives each sentence back unchanged: sentence by sentence, the document path and each
    # paragraph as one line must give the same paragraphs, hence the same BLEU, wherever the segmenter finds the
    # sentences; with an unchanged sentence, position alone puts every tag back on its own word.
    import keras_transformer
    from keras_transformer.engines.interface import TranslatorInterface

    class Same(TranslatorInterface):
        n_best_batch = score_batch = None

        def translate_batch(self, texts, prefixes=None):
            return list(texts)

    monkeypatch.setattr(keras_transformer, "load_translator", lambda model: Same())
    monkeypatch.setattr(bench, "lexicon", lambda english, german: _Same())
    assert bench.main(["--limit", "12", "--rounds", "1", "--pages", "2"]) == 0
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")}
    groups = bench.paragraphs(bench.evaluation.read_lines(bench.DATA / "test_2016_flickr.en.gz"), 0)[:12]
    sentences = sum(len(group) for _, _, group in groups)
    with_periods = rows["segmentation: with a period given to the captions that lack one"]
    assert with_periods == f"{sentences}/{sentences} (100.0%)"
    as_is = int(rows["segmentation: sentences recovered, captions as they are"].split("/")[0])
    unpunctuated = sum(not sentence.endswith((".", "!", "?")) for _, _, group in groups for sentence in group[:-1])
    assert as_is == sentences - 2 * unpunctuated  # each such caption merges with the next: two sentences lost
    bleu = {name: rows[f"BLEU cased / lc.tok, length ratio: {name}"].split(" (")[0].split(",")[0]
            for name in ("sentence by sentence, captions as they are", "document path, captions as they are",
                         "paragraph as one line, captions as they are", "document path, captions with final periods")}
    assert len(set(bleu.values())) == 1, bleu
    assert rows["BLEU cased / lc.tok, length ratio: document path, captions with final periods"].split(
        " (")[1].startswith("+0.00 / +0.00)")
    for clock in ("wall", "cpu"):
        rate = rows[f"throughput: sentences per {clock} second, document path / translate_lines (medians of 1 rounds)"]
        figures = re.fullmatch(r"([\d.]+) / ([\d.]+): ([\d.]+)x \(rounds ([\d.]+)\)", rate)
        document, lines, ratio, single = figures.groups()
        assert ratio == single and float(ratio) == pytest.approx(float(document) / float(lines), rel=0.05, abs=0.01)
    tags = rows[next(name for name in rows if name.startswith("HTML: pages well-formed"))]
    assert tags == "2/2 (100.0%); 12/12 (100.0%)"
    for aligner in ("cross-attention (default)", "proportional"):  # no attention maps here: both proportional
        judged = rows[f"HTML: one-word tags enclosing the word's lexicon translation, {aligner}"]
        right, total = re.match(r"(\d+)/(\d+)", judged).groups()
        assert right == total and int(total) > 10


def test_lexicon_is_dice_by_hand(bench):
    english = ["A man.", "a man runs", "a dog", "the dog"]
    german = ["Ein Mann.", "ein Mann rennt", "ein Hund", "der Hund"]
    # Dice 2 c(e, d) / (c(e) + c(d)), from the counts by hand: a-ein 6/6 = 1.0, a-mann 4/5 = 0.8, man-mann 1.0,
    # man-ein 0.8, man-rennt 2/3, runs-rennt 1.0, runs-mann 2/3, dog-hund 1.0, dog-der 2/3, the-der 1.0,
    # the-hund 2/3, a-rennt 2/4, a-hund and dog-ein 2/5; every word's best is 1.0.
    assert bench.lexicon(english, german, min_count=1, share=0.85) == {
        "a": {"ein"}, "man": {"mann"}, "runs": {"rennt"}, "dog": {"hund"}, "the": {"der"}}
    assert bench.lexicon(english, german, min_count=1, share=0.6) == {
        "a": {"ein", "mann"}, "man": {"ein", "mann", "rennt"}, "runs": {"mann", "rennt"}, "dog": {"hund", "der"},
        "the": {"der", "hund"}}
    assert bench.lexicon(english, german, min_count=2, share=0.85) == {"a": {"ein"}, "man": {"mann"}, "dog": {"hund"}}
    assert bench.lexicon(english, german, min_count=1, min_dice=0.9, share=0.0) == bench.lexicon(
        english, german, min_count=1, share=0.85)
