"""Terms through the engines: `translate_lines` / `n_best_lines` / `translate_terms` with constraints, banned
phrases and glossaries, against the search called with the ids directly; refusals by the engines that cannot."""

import numpy as np
import pytest

from keras_transformer import decoding
from keras_transformer.decoding import Glossary
from keras_transformer.engines.terms import MAX_CONSTRAINTS, MAX_TERM_TOKENS
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


def test_a_line_s_output_does_not_depend_on_its_batch_mates(translator):
    together = translator.translate_lines(LINES, constraints=TERMS, banned=["w7"])
    alone = [translator.translate_lines([line], constraints=[terms], banned=["w7"])[0]
             for line, terms in zip(LINES, TERMS)]
    assert together == alone
    assert all("w7" not in text.split() for text in together)


def test_a_glossary_gives_each_line_its_terms(translator, tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("w5\tw22\nw12 w13\tw23 w24\n", encoding="utf-8")
    by_glossary = translator.translate_lines(LINES, glossary=str(path))
    by_hand = translator.translate_lines(LINES, constraints=[["w22"], [], ["w23 w24"]])
    assert by_glossary == by_hand and "w22" in by_glossary[0].split() and "w23 w24" in by_glossary[2]
    assert translator.n_best_lines(LINES[:1], glossary=Glossary.parse("w5\tw22\n"))[0][0][0] == by_hand[0]


def test_a_term_that_cannot_fit_is_reported_not_crashed_on(trained_copy_model, word_tokenizer):
    """A line may produce its source length + max_extra tokens (with eos): an 8-token term does not fit after a
    one-word line with max_extra 2, so that line gets its unconstrained translation and the term is reported."""
    from keras_transformer.engines.tensorflow import Translator

    short = Translator(trained_copy_model[0], word_tokenizer, beam_size=3, alpha=0.6, max_extra=2)
    long_term = " ".join(f"w{i}" for i in range(20, 20 + MAX_TERM_TOKENS))
    found = short.translate_terms(["w5", "w6 w7"], constraints=[[long_term], ["w9"]])
    assert found[0][0] == {"translation": short.translate_lines(["w5"])[0], "score": pytest.approx(
        short.n_best_lines(["w5"])[0][0][1], rel=1e-5), "unmet": [long_term]}
    assert found[0][0]["translation"] and found[1][0]["unmet"] == [] and "w9" in found[1][0]["translation"]


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


def test_greedy_is_beam_one_and_sampling_refuses_terms_but_honours_bans(trained_copy_model, word_tokenizer):
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


@pytest.mark.parametrize("engine", ["ctranslate2", "packed"])
def test_engines_without_a_constrained_search_refuse_in_one_line(engine):
    from keras_transformer.engines.loader import ENGINES

    translator = object.__new__(ENGINES.get(engine))  # refused before anything of the model is read
    for terms in ({"constraints": [["Vertrag"]]}, {"banned": ["Mist"]}, {"glossary": Glossary.parse("a\tb\n")}):
        with pytest.raises(ConfigError, match=f"^The {engine} engine cannot force or ban terms .*; use the "
                                              "TensorFlow engine: a workdir or a SavedModel export.$"):
            translator.translate_lines(["A contract."], **terms)
