"""Every public name has a docstring with a short example."""

import inspect

import pytest

import keras_transformer as kt


@pytest.mark.parametrize("name", [n for n in kt.__all__ if n != "PRESETS"])
def test_public_name_has_a_docstring_with_an_example(name):
    obj = getattr(kt, name)
    doc = inspect.getdoc(obj) or ""
    assert len(doc.splitlines()) >= 3, f"{name} has no real docstring"
    assert ">>>" in doc, f"{name}'s docstring has no example"


CORE_MODULES = ["config", "masking", "model", "losses", "metrics", "schedules", "optimizers", "decoding",
                "data.synthetic", "data.textfile", "layers.attention", "layers.decoder", "layers.embedding",
                "layers.encoder", "layers.options", "layers.feed_forward", "layers.normalization", "layers.position", "layers.sublayer",
                "arrays", "distillation"]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_model_code_examples_run(module):
    import doctest
    import importlib

    import keras
    import numpy as np

    mod = importlib.import_module(f"keras_transformer.{module}")
    result = doctest.testmod(mod, extraglobs={"keras": keras, "np": np}, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} failing example(s) in keras_transformer.{module}"
