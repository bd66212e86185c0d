"""The shipped EN->DE model translates as it did before the package was restructured.

`golden/multi30k_en_de.test2016.first50.de` holds what `keras-transformer translate --model
saved_models/multi30k_en_de` printed for the first 50 sentences of Multi30k test2016 at commit 0f3f59d,
before the restructuring: the model loader, the Translator and the SavedModel must still give those lines.
"""

import pathlib

import pytest

from keras_transformer import evaluation, inference

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "multi30k_en_de.test2016.first50.de"


@pytest.fixture(scope="module")
def first_50(multi30k_dir):
    return evaluation.read_lines(multi30k_dir / "test_2016_flickr.en.gz")[:50]


@pytest.mark.slow
def test_shipped_german_model_translates_the_first_50_test_sentences_as_before(first_50):
    expected = GOLDEN.read_text(encoding="utf-8").splitlines()
    translations = inference.translate(ROOT / "saved_models" / "multi30k_en_de", first_50)
    assert [evaluation.one_line(line) for line in translations] == expected
