"""The shipped EN->DE model translates as it did before the package was restructured, and early exit.

`golden/multi30k_en_de.test2016.first50.de` holds what `keras-transformer translate --model
saved_models/multi30k_en_de` printed for the first 50 sentences of Multi30k test2016 at commit 0f3f59d,
before the restructuring: the model loader, the Translator and the SavedModel must still give those lines
with the exact stopping rule (the shipped models now decode with `early_exit`, which changes a few
translations: docs/decoding.md).
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import evaluation, inference, plotting

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "multi30k_en_de.test2016.first50.de"


@pytest.fixture(scope="module")
def first_50(multi30k_dir):
    return evaluation.read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:50]


@pytest.mark.slow
def test_shipped_german_model_translates_the_first_50_test_sentences_as_before(first_50):
    expected = GOLDEN.read_text(encoding="utf-8").splitlines()
    translations = inference.translate(ROOT / "saved_models" / "multi30k_en_de", first_50, early_exit=False)
    assert [evaluation.one_line(line) for line in translations] == expected


@pytest.mark.slow
def test_early_exit_changes_the_translations_the_written_out_rule_changes(multi30k_dir, tmp_path):
    """Validation sentences 75 and 119 are two of the 10 (of 1,014) whose translation the shipped EN->DE model's
    early exit changes; sentence 0 keeps its. The early exit gives what the written-out search gives (the exact
    rule's agreement with it: tests/test_decoding.py), and the attention plot draws the translation served."""
    from reference_search import reference_beam_search

    from keras_transformer.translation import Translator

    sentences = [evaluation.read_lines(multi30k_dir / "val.en.gz")[i] for i in (75, 119, 0)]
    early = inference.load_translator(ROOT / "saved_models" / "multi30k_en_de")
    assert early.early_exit  # the shipped config's setting
    exact = Translator(early.model, early.source_tokenizer, early.target_tokenizer, beam_size=early.beam_size,
                       alpha=early.alpha, max_extra=early.max_extra, early_exit=False)
    served, exhaustive = early(sentences), exact(sentences)
    assert [a != b for a, b in zip(exhaustive, served)] == [True, True, False]
    maps, _ = plotting.plot_attention_for_path(ROOT / "saved_models" / "multi30k_en_de", sentences[0], tmp_path,
                                               kinds=("cross",), dpi=40)
    assert maps.translation == served[0]
    source = early.encode_sources(tf.constant(sentences)).numpy()
    tokens = np.asarray(early.translate_ids(source, num_return=1)[0])[:, 0]
    for row, ids in enumerate(source):
        expected, _ = reference_beam_search(early.model, ids.tolist(), beam_size=early.beam_size, alpha=early.alpha,
                                            max_extra=early.max_extra, early_exit=True)
        assert tokens[row][tokens[row] != 0].tolist() == expected[0][0], row
