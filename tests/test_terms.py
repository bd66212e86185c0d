"""Terms through the engines: `translate_lines` / `n_best_lines` / `translate_terms` with constraints, banned
phrases and glossaries, against the search called with the ids directly; refusals by the engines that cannot."""

import json
import pathlib

import numpy as np
import pytest

from keras_transformer import cli, decoding
from keras_transformer.decoding import DecodeOptions, Glossary
from keras_transformer.engines.interface import TranslatorInterface
from keras_transformer.engines.terms import MAX_CONSTRAINTS, MAX_TERM_TOKENS, TermRequest
from keras_transformer.errors import ConfigError

MAX_EXTRA = 6
LINES = ["w5 w6 w7 w8", "w9 w10 w11", "w12 w13 w14 w15 w16 w17"]
TERMS = [["w20 w21"], [], ["w25", ["w26", "w27"]]]


def ids(text):
    return [int(word[1:]) for word in text.split()]


def words(row):
    return " ".join(f"w{i}" for i in row if i > 3)


@pytest.fixture
def translator(trained_copy_model, word_tokenizer):
    from keras_transformer.engines.tensorflow import Translator

    return Translator(trained_copy_model[0], word_tokenizer, beam_size=3, alpha=0.6, max_extra=MAX_EXTRA)


@pytest.mark.slow  # the constrained search against beam search given the ids (7 CPU s)
def test_terms_are_the_search_given_their_ids_and_all_appear(translator, trained_copy_model):
    """The engine's constrained translations are `beam_search`'s with the terms' ids (one- and two-word terms,
    alternative forms), every term in its line's output, and nothing reported unmet."""
    found = translator.translate_terms(LINES, constraints=TERMS, num_return=1)
    source = np.array([ids(line) + [3] + [0] * (6 - len(ids(line))) for line in LINES])
    constraints = [[[ids(term)] if isinstance(term, str) else [ids(form) for form in term] for term in terms]
                   for terms in TERMS]
    tokens, scores = decoding.beam_search(trained_copy_model[0], source, beam_size=3, alpha=0.6, max_extra=MAX_EXTRA,
                                          constraints=decoding.pad_constraints(constraints, forms=True))
    expected = [words(row) for row in np.asarray(tokens)[:, 0]]
    assert [hypotheses[0]["translation"] for hypotheses in found] == expected
    np.testing.assert_allclose([hypotheses[0]["score"] for hypotheses in found], np.asarray(scores)[:, 0], rtol=1e-5)
    assert all(hypotheses[0]["unmet"] == [] for hypotheses in found)
    assert "w20 w21" in expected[0] and "w25" in expected[2].split()
    assert {"w26", "w27"} & set(expected[2].split())
    assert translator.translate_lines(LINES, constraints=TERMS) == expected


@pytest.mark.slow  # every line searched alone and in the batch (7 CPU s)
def test_a_line_s_output_does_not_depend_on_its_batch_mates(translator):
    """Each line's constrained translation (its terms, a banned word) is the same searched alone as in the batch."""
    together = translator.translate_lines(LINES, constraints=TERMS, banned=["w7"])
    alone = [translator.translate_lines([line], constraints=[terms], banned=["w7"])[0]
             for line, terms in zip(LINES, TERMS)]
    assert together == alone
    assert all("w7" not in text.split() for text in together)


@pytest.mark.slow  # constrained searches by glossary and by hand (6 CPU s)
def test_a_glossary_gives_each_line_its_terms(translator, tmp_path):
    """A glossary file gives each line the terms whose source words it holds: the same translations as those
    constraints given by hand, the terms in them, through `translate_lines` and `n_best_lines`."""
    path = tmp_path / "terms.tsv"
    path.write_text("w5\tw22\nw12 w13\tw23 w24\n", encoding="utf-8")
    by_glossary = translator.translate_lines(LINES, glossary=str(path))
    by_hand = translator.translate_lines(LINES, constraints=[["w22"], [], ["w23 w24"]])
    assert by_glossary == by_hand and "w22" in by_glossary[0].split() and "w23 w24" in by_glossary[2]
    assert translator.n_best_lines(LINES[:1], glossary=Glossary.parse("w5\tw22\n"))[0][0][0] == by_hand[0]


@pytest.mark.slow
def test_a_document_s_sentences_each_get_their_own_glossary_terms(translator):
    """`translate_document` with a glossary on the TensorFlow engine: each sentence's matches are its
    constraints (not its neighbours'), the banned word is in no sentence, and the records carry the constrained
    hypotheses' signals. Five constrained searches, run eagerly (about 15 s); the fast tests fake the engine."""
    glossary = Glossary.parse("w5\tw22\nw9\tw23 w24\n")
    sentences = ["w5 w6 w7", "w9 w10", "w11 w12"]
    text = f"{sentences[0]}\n\n- {sentences[1]}\n  {sentences[2]}\n"
    expected = translator.translate_lines(sentences, glossary=glossary, banned=["w12"])
    assert "w22" in expected[0].split() and "w23 w24" in expected[1] and "w22" not in expected[1].split()
    assert "w12" not in expected[2].split() and expected != translator.translate_lines(sentences)
    assert translator.translate_document(text, glossary=glossary, banned=["w12"]) == \
        f"{expected[0]}\n\n- {expected[1]}\n  {expected[2]}\n"
    records = translator.translate_document(text, glossary=glossary, banned=["w12"], details=True)["sentences"]
    assert [r["translation"] for r in records] == expected
    assert [r["tokens"] for r in records] == [len(t.split()) + 1 for t in expected]
    assert all(r["mean_log_prob"] < 0 for r in records)


def test_a_term_that_cannot_fit_is_reported_not_crashed_on(trained_copy_model, word_tokenizer):
    """A line may produce its source length + max_extra tokens (with eos): an 8-token term does not fit after a
    one-word line with max_extra 2, so that line gets its unconstrained translation and the term is reported."""
    from keras_transformer.engines.tensorflow import Translator

    short = Translator(trained_copy_model[0], word_tokenizer, beam_size=3, alpha=0.6, max_extra=2)
    long_term = " ".join(f"w{i}" for i in range(20, 20 + MAX_TERM_TOKENS))
    found = short.translate_terms(["w5", "w6 w7"], constraints=[[long_term], ["w9"]])
    translation = short.translate_lines(["w5"])[0]
    assert found[0][0] == {"translation": translation, "score": pytest.approx(
        short.n_best_lines(["w5"])[0][0][1], rel=1e-5), "unmet": [long_term],
        "tokens": len(translation.split()) + 1}  # its words and eos
    assert found[0][0]["translation"] and found[1][0]["unmet"] == [] and "w9" in found[1][0]["translation"]


@pytest.mark.slow  # every entry point run with and without terms (6 CPU s)
def test_without_terms_nothing_changes(trained_copy_model, word_tokenizer):
    """A request without terms runs the unconstrained search itself: the same outputs as a translator that never
    saw a term, the same traced functions, and no constrained function built."""
    from keras_transformer.engines.tensorflow import Translator

    used = Translator(trained_copy_model[0], word_tokenizer, beam_size=3, max_extra=MAX_EXTRA)
    fresh = Translator(trained_copy_model[0], word_tokenizer, beam_size=3, max_extra=MAX_EXTRA)
    used.translate_lines(LINES, constraints=TERMS)
    assert used.translate_lines(LINES) == fresh.translate_lines(LINES)
    assert used.n_best_lines(LINES) == fresh.n_best_lines(LINES)
    assert used.translate.experimental_get_tracing_count() == fresh.translate.experimental_get_tracing_count()
    assert "_term_function" not in vars(fresh)


@pytest.mark.slow  # three translators searched with terms (6 CPU s)
def test_greedy_is_beam_one_and_sampling_refuses_terms_but_honours_bans(trained_copy_model, word_tokenizer):
    """Greedy decoding with terms is beam search of width 1 with them; sampling refuses forced terms in one line and
    never draws a banned one."""
    from keras_transformer.engines.tensorflow import Translator

    model = trained_copy_model[0]
    greedy = Translator(model, word_tokenizer, strategy="greedy", max_extra=MAX_EXTRA)
    beam_one = Translator(model, word_tokenizer, beam_size=1, alpha=0.0, max_extra=MAX_EXTRA)
    assert greedy.translate_lines(LINES, constraints=TERMS) == beam_one.translate_lines(LINES, constraints=TERMS)
    sampler = Translator(model, word_tokenizer, strategy="sample", seed=3, max_extra=MAX_EXTRA)
    with pytest.raises(ConfigError, match="Sampling cannot force terms: constraints need strategy 'beam' or"):
        sampler.translate_lines(LINES, constraints=TERMS)
    plain = sampler.translate_lines(LINES * 3)
    banned = sorted({word for text in plain for word in text.split()})[:4]
    assert all(not set(banned) & set(text.split()) for text in sampler.translate_lines(LINES * 3, banned=banned))


@pytest.mark.parametrize("constraints, message", [
    ([[""]], "constraints: line 1's constraint 1 is empty"),
    ([["zz qq"]], "The constraint 'zz qq' has only unknown tokens"),
    ([["w5 zz"]], "The term 'w5 zz' holds text the target vocabulary does not have"),
    ([["w5"] * (MAX_CONSTRAINTS + 1)], f"line 1 has {MAX_CONSTRAINTS + 1} constraints .* at most {MAX_CONSTRAINTS}"),
    ([[" ".join(["w5"] * (MAX_TERM_TOKENS + 1))]], f"is {MAX_TERM_TOKENS + 1} target tokens; at most"),
    ([["w5"], ["w6"]], r"give one list of terms per line \(1 line\(s\)\)"),
    ([[5]], "line 1's constraint 1 must be a text or a list of texts"),
])
def test_bad_terms_are_named(translator, constraints, message):
    with pytest.raises(ConfigError, match=message):
        translator.translate_lines(LINES[:1], constraints=constraints)


def test_a_constraint_holding_a_banned_phrase_is_refused_and_a_form_holding_one_dropped(translator):
    """No search can write a term that holds a banned phrase: the constraint is refused by name (it used to run the
    search to its length limit), and of alternative forms only those without the phrase are searched for."""
    with pytest.raises(ConfigError, match="The constraint 'w20 w21' contains the banned phrase 'w21'"):
        translator.translate_lines(LINES[:1], constraints=[["w20 w21"]], banned=["w21"])
    request = TermRequest.build(2, constraints=[[["w20 w21", "w22"]], ["w21 w20"]], banned=["w21 w20", "w9"])
    with pytest.raises(ConfigError, match="'w21 w20' contains the banned phrase 'w21 w20'"):
        request.ids(ids)
    kept = TermRequest.build(1, constraints=[[["w20 w21", "w22"]]], banned=["w21"]).ids(ids)
    assert kept == ([[[[22]]]], [[21]])


@pytest.mark.parametrize("engine", ["ctranslate2", "packed"])
def test_engines_without_a_constrained_search_refuse_in_one_line(engine):
    from keras_transformer.engines.loader import ENGINES

    translator = object.__new__(ENGINES.get(engine))  # refused before anything of the model is read
    for terms in ({"constraints": [["Vertrag"]]}, {"banned": ["Mist"]}, {"glossary": Glossary.parse("a\tb\n")}):
        with pytest.raises(ConfigError, match=f"^The {engine} engine cannot force or ban terms .*; use the "
                                              "TensorFlow engine: a workdir or a SavedModel export.$"):
            translator.translate_lines(["A contract."], **terms)


# ------------------------------------------------------------------------------------------- the command line

class Recorder(TranslatorInterface):
    """An engine that forces terms by appending them, recording what each call got (no TensorFlow)."""

    engine, strategies = "recorder", ("beam",)
    n_best_batch = score_batch = None
    options = DecodeOptions()

    def __init__(self):
        self.calls = []

    def translate_batch(self, texts, prefixes=None):
        return texts

    def translate_terms(self, lines, constraints=None, banned=None, glossary=None, batch_size=64, target_prefix=None,
                        target_lang=None, num_return=1):
        self.calls.append((list(lines), constraints, banned, glossary))
        request = TermRequest.build(len(lines), constraints, banned, glossary, list(lines))
        return [[{"translation": " ".join([line] + [forms[0] for forms in terms]), "score": 0.0, "unmet": [],
                  "tokens": 1}] for line, terms in zip(lines, request.per_line)]


class Unmet(Recorder):
    """A `Recorder` that cannot fit a constraint of several forms: left out and reported unmet."""

    def translate_terms(self, lines, constraints=None, banned=None, glossary=None, batch_size=64, target_prefix=None,
                        target_lang=None, num_return=1):
        request = TermRequest.build(len(lines), constraints, banned, glossary, list(lines))
        return [[{"translation": " ".join([line] + [t[0] for t in terms if len(t) == 1]), "score": -1.5,
                  "tokens": 3, "unmet": [list(t) for t in terms if len(t) > 1]}]
                for line, terms in zip(lines, request.per_line)]


class Refuser(Recorder):
    translate_terms = TranslatorInterface.translate_terms  # the interface's default: it cannot force terms


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """`run(argv, engine)`: `cli.main(["translate", "--model", "m", *argv])` in this process with `engine` as the
    model (a folder `m` that passes the checks before loading): `(status, stdout, stderr lines but "Decoding")`."""
    from keras_transformer.cli import commands
    from keras_transformer.engines import loader
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m" / "data" / "vocab").mkdir(parents=True)
    (tmp_path / "m" / "model.yaml").write_text("d_model: 64\n", encoding="utf-8")
    monkeypatch.setattr(commands, "import_tensorflow_quietly", lambda: None)

    def call(argv, engine):
        monkeypatch.setattr(loader, "load_translator", lambda *args, **options: engine)
        status = cli.main(["translate", "--model", "m", *argv])
        out, err = capsys.readouterr()
        return status, out, [line for line in err.splitlines() if not line.startswith("Decoding: ")]

    return call


def test_translate_gives_every_sentence_the_constraints_and_each_its_glossary_terms(run, tmp_path):
    (tmp_path / "terms.tsv").write_text("bike\tVelo\tRad\n", encoding="utf-8")
    engine = Recorder()
    status, out, _ = run(["--constraint", "Mann", "--constraint", "heute", "--glossary", "terms.tsv", "--ban", "Mist",
                          "A man rides a bike.", "A man walks."], engine)
    assert status == 0 and out == "A man rides a bike. Mann heute Velo\nA man walks. Mann heute\n"
    lines, constraints, banned, glossary = engine.calls[0]
    assert constraints == [["Mann", "heute"]] * 2 and banned == ["Mist"] and glossary.constraints("bike") == [
        ("Velo", "Rad")]
    status, out, _ = run(["A man walks."], engine)  # no terms: the plain path
    assert (status, out, len(engine.calls)) == (0, "A man walks.\n", 1)


def test_translate_gives_each_sentence_of_a_document_its_glossary_terms(run, tmp_path):
    """`translate --input FILE --glossary G --ban X`: each sentence (one call for the document) gets the
    constraints of the glossary entries found in it, and the output keeps the document's layout."""
    (tmp_path / "terms.tsv").write_text("bike\tVelo\tRad\nhorse\tPferd\n", encoding="utf-8")
    (tmp_path / "doc.txt").write_text("A man rides a bike. A dog.\n\n  - A horse runs.\n", encoding="utf-8")
    engine = Recorder()
    status, out, err = run(["--input", "doc.txt", "--output", "doc.de", "--glossary", "terms.tsv", "--ban", "Mist"],
                           engine)
    assert (status, out, err) == (0, "", [])
    assert (tmp_path / "doc.de").read_text(encoding="utf-8") == \
        "A man rides a bike. Velo A dog.\n\n  - A horse runs. Pferd\n"
    [(lines, constraints, banned, glossary)] = engine.calls
    assert lines == ["A man rides a bike.", "A dog.", "A horse runs."] and constraints is None
    assert banned == ["Mist"] and glossary.constraints("a horse") == [("Pferd",)]
    status, out, _ = run(["--input", "doc.txt", "--glossary", "terms.tsv", "--json"], engine)
    records = json.loads(out)["sentences"]
    assert status == 0 and [r["translation"] for r in records] == ["A man rides a bike. Velo", "A dog.",
                                                                    "A horse runs. Pferd"]
    assert {"score", "mean_log_prob"} <= set(records[0])
    status, out, _ = run(["--input", "doc.txt", "--format", "lines", "--constraint", "Hund"], Recorder())
    lines = out.splitlines()  # per line, the line's translation with the constraint
    assert status == 0 and (lines[0], lines[2]) == ("A man rides a bike. A dog. Hund", "  - A horse runs. Hund")
    status, out, err = run(["--input", "doc.txt", "--glossary", "terms.tsv"], Refuser())
    assert status == 2 and out == "" and len(err) == 1 and "The recorder engine cannot force or ban terms" in err[0]


def test_translate_names_each_line_whose_constraints_are_not_met_and_json_carries_them(run, tmp_path):
    (tmp_path / "terms.tsv").write_text("bike\tVelo\tRad\n", encoding="utf-8")
    argv = ["--constraint", "Mann", "--glossary", "terms.tsv", "A man walks.", "A man rides a bike.", "A bike."]
    status, out, err = run(argv, Unmet())
    assert status == 0 and out == "A man walks. Mann\nA man rides a bike. Mann\nA bike. Mann\n"
    assert err == ["Line 2: constraints not met: 'Velo' or 'Rad'", "Line 3: constraints not met: 'Velo' or 'Rad'"]
    mean = round(-1.5 * ((5 + 3) / 6) ** 0.6 / 3, 6)  # log P (the score times GNMT's penalty, alpha 0.6) a token
    status, out, err = run(argv + ["--json"], Unmet())
    assert status == 0 and len(err) == 2
    assert [json.loads(line) for line in out.splitlines()] == [
        {"line": 1, "translation": "A man walks. Mann", "score": -1.5, "mean_log_prob": mean, "unmet": []},
        {"line": 2, "translation": "A man rides a bike. Mann", "score": -1.5, "mean_log_prob": mean,
         "unmet": [["Velo", "Rad"]]},
        {"line": 3, "translation": "A bike. Mann", "score": -1.5, "mean_log_prob": mean, "unmet": [["Velo", "Rad"]]}]
    status, out, err = run(["--constraint", "Mann", "--n-best", "1", "A man walks."], Unmet())
    assert (status, out, err) == (0, f"0\t-1.5000\t{mean:.4f}\tA man walks. Mann\n", [])  # as n-best without terms


def test_translate_refuses_bad_terms_in_one_line(run, tmp_path):
    (tmp_path / "bad.tsv").write_text("bike\tVelo\nno tab here\n", encoding="utf-8")
    (tmp_path / "doc.txt").write_text("A dog.", encoding="utf-8")
    cases = [(["--glossary", "bad.tsv", "A dog."], Recorder(), "bad.tsv line 2"),
             (["--constraint", "", "A dog."], Recorder(), "line 1's constraint 1 is empty"),
             (["--constraint", "Hund", "A dog."], Refuser(), "The recorder engine cannot force or ban terms"),
             (["--ban", "Hund", "A dog."], Refuser(), "The recorder engine cannot force or ban terms"),
             (["--input", "doc.txt", "--constraint", "Hund"], Recorder(), "--constraint is for sentences"),
             (["--input", "doc.txt", "--format", "lines", "--json", "--ban", "Hund"], Recorder(),
              "given as arguments or on stdin"),
             (["--json", "A dog."], Recorder(), "--json is for documents")]
    for argv, engine, message in cases:
        status, out, err = run(argv, engine)
        assert status == 2 and out == "" and len(err) == 1, (argv, err)
        assert err[0].startswith("keras-transformer translate: error: ") and message in err[0], (argv, err)


@pytest.mark.slow
def test_the_shipped_model_puts_each_term_in_from_the_command_line(tmp_path, capsys):
    """Slow: loads the shipped EN-DE SavedModel through the command line twice and decodes by constrained beam
    search (TensorFlow's import and the model's load, tens of seconds): the TensorFlow engine behind
    `translate --glossary` and `--constraint`, which the fast tests replace by a recording engine."""
    model = str(pathlib.Path(__file__).resolve().parents[1] / "saved_models" / "multi30k_en_de")
    (tmp_path / "terms.tsv").write_text("bike\tVelo\nman\tHerr\n", encoding="utf-8")
    assert cli.main(["translate", "--model", model, "--glossary", str(tmp_path / "terms.tsv"),
                     "A man rides a bike."]) == 0
    out = capsys.readouterr().out
    assert "Velo" in out and "Herr" in out, out
    assert cli.main(["translate", "--model", model, "--constraint", "Gebäude", "--constraint", "schnell",
                     "A man rides a bike.", "Two dogs play in the snow."]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("Gebäude" in line and "schnell" in line for line in out), out


@pytest.mark.slow
def test_compiled_and_graph_constrained_searches_equal_the_eager_one(trained_copy_model, word_tokenizer):
    """Slow: compiles the constrained search with XLA (seconds per shape). A translator with `jit_compile`, and
    an uncompiled one given more than `EAGER_TERM_SENTENCES` lines (its `tf.function`), give the eager search's
    constrained translations, and a repeated call runs the traced graph again without tracing it anew; an ensemble of
    one model twice gives that model's."""
    from keras_transformer.engines.tensorflow import Translator
    from keras_transformer.engines.tensorflow_terms import EAGER_TERM_SENTENCES

    model = trained_copy_model[0]
    settings = dict(beam_size=3, alpha=0.6, max_extra=MAX_EXTRA)
    eager = Translator(model, word_tokenizer, **settings)
    expected = eager.translate_lines(LINES, constraints=TERMS, banned=["w7"])
    compiled = Translator(model, word_tokenizer, jit_compile=True, **settings)
    assert compiled.translate_lines(LINES, constraints=TERMS, banned=["w7"]) == expected
    many = LINES * (EAGER_TERM_SENTENCES // len(LINES) + 1)
    assert eager.translate_lines(many, constraints=TERMS * (len(many) // len(LINES)), banned=["w7"]) == (
        expected * (len(many) // len(LINES)))
    traces = eager.__dict__["_term_function"].experimental_get_tracing_count()
    assert eager.translate_lines(many, constraints=TERMS * (len(many) // len(LINES)), banned=["w7"]) == (
        expected * (len(many) // len(LINES)))
    assert eager.__dict__["_term_function"].experimental_get_tracing_count() == traces  # the same call: no new trace
    assert eager.translate_lines(LINES, constraints=TERMS, banned=["w7"]) == expected  # small, through the graph
    assert Translator.ensemble([eager, eager]).translate_lines(LINES, constraints=TERMS, banned=["w7"]) == expected


def test_a_term_is_tokenized_as_it_appears_after_a_space_in_a_sentence():
    """The subword caveat, decided: with the shipped model's SentencePiece vocabulary, a term's tokens are those
    it has after a space inside a sentence (one-word, two-word, non-ASCII terms), so a whole word of the output
    matches it."""
    import types

    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.engines.tensorflow_terms import TermSearch

    vocab = pathlib.Path(__file__).resolve().parents[1] / "saved_models" / "multi30k_en_de" / "assets.extra" / "vocab"
    target = load_tokenizers(vocab)[1]
    translator = types.SimpleNamespace(target_tokenizer=target)
    for term in ("Velo", "weißen Schnee", "Gebäude", "Fahrradfahrer"):
        ids = TermSearch.term_tokens(translator, term)
        in_sentence = target.tokenize([f"Ein Mann sieht {term}"]).to_list()[0]
        assert in_sentence[-len(ids):] == ids and len(in_sentence) > len(ids), term
    # Its byte pieces spell any character: a term this vocabulary has no piece for is forced byte by byte (the
    # word tokenizer above, without them, refuses one: test_bad_terms_are_named).
    snowmen = TermSearch.term_tokens(translator, "☃☃")
    assert target.detokenize([snowmen]).numpy()[0].decode("utf-8") == "☃☃"
