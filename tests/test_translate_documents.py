"""`keras-transformer translate --input FILE --output FILE --format text|html|xml|lines`: a file translated as a
document with its layout kept, written whole or not at all, bad input refused in one line, and the shipped model
translating a file as it translates its sentences one by one."""

import io
import json
import os
import pathlib
import sys

import lxml.html
import pytest

from keras_transformer import cli
from keras_transformer.cli import commands
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.documents.document import MAX_DOCUMENT_BYTES
from keras_transformer.engines.interface import TranslatorInterface

REPO = pathlib.Path(__file__).resolve().parents[1]

LAYOUT = ("Title\n"
          "\n"
          "A dog runs. A cat sleeps.\n"
          "  - Two children play.\n"
          "  1. One more.\n"
          "\n")


class Upper(TranslatorInterface):
    """A model that upper-cases, recording its batches; `fail_after` batches, it raises (a fault midway)."""

    engine, strategies = "upper", ("beam",)
    n_best_batch = score_batch = None
    options = DecodeOptions()

    def __init__(self, fail_after=None):
        self.batches, self.fail_after = [], fail_after

    def translate_batch(self, texts, prefixes=None):
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise RuntimeError("the engine failed midway")
        self.batches.append(list(texts))
        return [text.upper() for text in texts]

    def details_batch(self, texts, prefixes=None):  # each text's upper-casing, its score -1 per word
        from keras_transformer.engines.details import Translation
        return [Translation(text, -1.0 * len(text.split()), -1.0 * len(text.split()), len(text.split()))
                for text in self.translate_batch(texts, prefixes)]


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """`run(argv, engine=Upper(), stdin=b"")`: `cli.main` in this process with `engine` as the model (a folder
    `m` that passes the checks before loading), without importing TensorFlow; gives `(status, stdout, stderr)`."""
    from keras_transformer.engines import loader
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m" / "data" / "vocab").mkdir(parents=True)
    (tmp_path / "m" / "model.yaml").write_text("d_model: 64\n", encoding="utf-8")
    monkeypatch.setattr(commands, "import_tensorflow_quietly", lambda: None)

    def call(argv, engine=None, stdin=b""):
        engine = engine or Upper()
        monkeypatch.setattr(loader, "load_translator", lambda *args, **options: engine)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        status = cli.main(["translate", "--model", "m", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return call


def test_a_file_is_translated_as_a_document_with_its_layout_and_written_whole(run, tmp_path):
    (tmp_path / "doc.txt").write_text(LAYOUT, encoding="utf-8")
    engine = Upper()
    status, out, err = run(["--input", "doc.txt", "--output", "doc.de.txt"], engine)
    assert status == 0 and out == ""
    assert err.splitlines() == ["Decoding: beam: beam_size 4, alpha 0.6, max_extra 50"]  # no bar: not a terminal
    assert (tmp_path / "doc.de.txt").read_text(encoding="utf-8") == LAYOUT.upper()
    assert sorted(engine.batches[0]) == sorted(["Title", "A dog runs.", "A cat sleeps.", "Two children play.",
                                                "One more."])  # sentences, not lines, in one batch
    assert sorted(os.listdir(tmp_path)) == ["doc.de.txt", "doc.txt", "m"]  # no temporary left

    status, out, _ = run(["--input", "doc.txt"])  # no --output: stdout
    assert status == 0 and out == LAYOUT.upper()
    status, out, _ = run(["--input", "doc.txt", "--format", "lines"])  # one sentence per line, as stdin's
    assert status == 0 and out == "TITLE\n\nA DOG RUNS. A CAT SLEEPS.\n  - TWO CHILDREN PLAY.\n  1. ONE MORE.\n\n"


def test_stdin_stays_lines_and_format_text_reads_it_whole_as_one_document(run):
    engine = Upper()
    status, out, _ = run([], engine, stdin=b"A dog runs. A cat sleeps.\nTwo men.\n")
    assert status == 0 and out == "A DOG RUNS. A CAT SLEEPS.\nTWO MEN.\n"
    assert engine.batches == [["Two men.", "A dog runs. A cat sleeps."]]  # each line one sentence
    engine = Upper()
    status, out, _ = run(["--format", "text"], engine, stdin=b"A dog runs. A cat sleeps.\n\n  - Two men.\n")
    assert status == 0 and out == "A DOG RUNS. A CAT SLEEPS.\n\n  - TWO MEN.\n"
    assert sorted(engine.batches[0]) == ["A cat sleeps.", "A dog runs.", "Two men."]


def test_html_keeps_its_markup_and_json_gives_each_sentence(run, tmp_path):
    page = "<!DOCTYPE html>\n<html><body><p>A <b>big</b> dog. It runs.</p><pre>keep me.</pre></body></html>\n"
    (tmp_path / "page.html").write_text(page, encoding="utf-8")
    status, out, _ = run(["--input", "page.html", "--output", "page.de.html", "--format", "html"])
    written = (tmp_path / "page.de.html").read_text(encoding="utf-8")
    assert status == 0 and written.startswith("<!DOCTYPE html>")
    tree = lxml.html.document_fromstring(written)
    assert tree.find(".//p").text_content() == "A BIG DOG. IT RUNS." and tree.find(".//b") is not None
    assert tree.find(".//pre").text == "keep me."
    status, out, _ = run(["--input", "page.html", "--format", "html", "--json"])
    answer = json.loads(out)
    assert status == 0 and answer["translation"] == written and answer["format"] == "html"
    assert [(s["source"], s["translation"]) for s in answer["sentences"]] == [("A big dog.", "A BIG DOG."),
                                                                             ("It runs.", "IT RUNS.")]
    assert answer["decoding"]["beam_size"] == 4


def test_the_progress_bar_counts_sentences_on_stderr_when_asked(run, tmp_path):
    (tmp_path / "long.txt").write_text(" ".join(f"Sentence {i}." for i in range(150)), encoding="utf-8")
    status, _, err = run(["--input", "long.txt", "--output", "long.de.txt", "--progress", "--batch-size", "64"])
    frames = err.rstrip("\n").split("\n")[-1].split("\r")[1:]
    assert status == 0 and [frame.split("] ")[1].split(" sentences,")[0] for frame in frames] == [
        "0/150", "64/150", "128/150", "150/150"]
    assert frames[-1].endswith(" sentences/s") and err.endswith("\n")


def test_a_translation_that_fails_midway_writes_nothing_and_leaves_the_old_output(run, tmp_path):
    (tmp_path / "long.txt").write_text(" ".join(f"Sentence {i}." for i in range(150)), encoding="utf-8")
    status, _, err = run(["--input", "long.txt", "--output", "new.txt", "--batch-size", "16"], Upper(fail_after=3))
    assert status != 0 and "the engine failed midway" in err
    (tmp_path / "old.txt").write_text("the earlier translation\n", encoding="utf-8")
    status, _, _ = run(["--input", "long.txt", "--output", "old.txt", "--batch-size", "16"], Upper(fail_after=3))
    assert status != 0 and (tmp_path / "old.txt").read_text(encoding="utf-8") == "the earlier translation\n"
    assert sorted(os.listdir(tmp_path)) == ["long.txt", "m", "old.txt"]  # no new.txt, no temporary


def test_bad_input_is_refused_in_one_line_and_nothing_is_written(run, tmp_path):
    (tmp_path / "binary.bin").write_bytes(b"PK\x03\x04" + bytes(range(256)))
    (tmp_path / "latin1.txt").write_bytes(b"A caf\xe9 noir.")
    (tmp_path / "bad.xml").write_text("<doc><p>Hi</doc>", encoding="utf-8")
    (tmp_path / "huge.txt").write_bytes(b"a" * (MAX_DOCUMENT_BYTES + 1))
    (tmp_path / "doc.txt").write_text("A dog.", encoding="utf-8")
    cases = [(["--input", "binary.bin", "--output", "o.txt"], "looks binary (a NUL byte at byte offset 4)"),
             (["--input", "latin1.txt", "--output", "o.txt"], "not valid UTF-8: byte 0xe9 at byte offset 5"),
             (["--input", "bad.xml", "--output", "o.txt", "--format", "xml"], "the XML document is not well-formed"),
             (["--input", "huge.txt", "--output", "o.txt"], "huge.txt (8.0 MiB) is over the limit of 8.0 MiB for "
                                                            f"one document (max_bytes={MAX_DOCUMENT_BYTES})"),
             (["--output", "o.txt"], "--output needs --input FILE"),
             (["--input", "doc.txt", "A cat."], "--input doc.txt and sentences as arguments (1): give one"),
             (["--format", "html", "A cat."], "--format html translates a document from --input FILE or stdin"),
             (["--input", "doc.txt", "--n-best", "2"], "--n-best is for sentences (--format lines)"),
             (["--input", "doc.txt", "--format", "lines", "--n-best", "2"], "--n-best is for sentences given as "
                                                                            "arguments or on stdin"),
             (["--input", "doc.txt", "--format", "lines", "--json"], "--json is for documents"),
             (["--input", "missing.txt"], "missing.txt")]
    for argv, message in cases:
        engine = Upper()
        status, out, err = run(argv, engine)
        lines = [line for line in err.splitlines() if not line.startswith("Decoding: ")]
        assert status == 2 and out == "" and len(lines) == 1, (argv, err)
        assert lines[0].startswith("keras-transformer translate: error: ") and message in lines[0], (argv, err)
        assert engine.batches == [] and not (tmp_path / "o.txt").exists()


def test_an_empty_document_gives_an_empty_output_file(run, tmp_path):
    for name, text in (("empty.txt", ""), ("blank.txt", "\n\n  \n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        status, _, err = run(["--input", name, "--output", f"{name}.de"])
        assert status == 0 and (tmp_path / f"{name}.de").read_text(encoding="utf-8") == text
        assert f"{name}: no text to translate; the output is the document as it was." in err


@pytest.mark.slow
def test_the_shipped_model_translates_a_file_as_it_translates_its_sentences(tmp_path, capsys):
    """Loads the shipped EN-DE SavedModel through the command line and decodes five sentences by beam search
    (TensorFlow's import and the search's tracing: about 30 s of CPU): the TensorFlow engine behind
    `translate --input --output`, which the fast tests replace by a fake engine."""
    from keras_transformer import load_translator
    model = str(REPO / "saved_models" / "multi30k_en_de")
    sentences = ["A man in an orange hat is looking at something.", "A dog runs on the grass.",
                 "Two children play in the snow.", "A woman sits on a bench.", "She reads a book."]
    document = f"{sentences[0]} {sentences[1]}\n\n  - {sentences[2]}\n  - {sentences[3]} {sentences[4]}\n"
    (tmp_path / "doc.txt").write_text(document, encoding="utf-8")
    assert cli.main(["translate", "--model", model, "--input", str(tmp_path / "doc.txt"), "--output",
                     str(tmp_path / "doc.de.txt")]) == 0
    alone = load_translator(model).translate_lines(sentences)
    assert (tmp_path / "doc.de.txt").read_text(encoding="utf-8") == (
        f"{alone[0]} {alone[1]}\n\n  - {alone[2]}\n  - {alone[3]} {alone[4]}\n")
    assert capsys.readouterr().out == ""
