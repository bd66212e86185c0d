"""`keras_transformer.runtime.registry.Registry`: the one lookup of exporters, engines, strategies and Keras classes."""

import pathlib
import subprocess
import sys

import pytest

from keras_transformer.errors import ConfigError
from keras_transformer.runtime.registry import Registry


def test_a_registry_keeps_order_imports_paths_on_first_use_and_names_the_known_entries():
    registry = Registry("colour")

    @registry.register("red")
    def red():
        return "#f00"

    assert registry.register("fraction", "fractions:Fraction") == "fractions:Fraction"
    assert registry.names() == ("red", "fraction") == tuple(registry) and len(registry) == 2
    assert "red" in registry and "blue" not in registry
    assert registry.get("red") is red and registry.get("red")() == "#f00"
    assert registry.get("fraction").__name__ == "Fraction"
    assert registry.path("fraction") == "fractions:Fraction" and registry.path("red").endswith(":" + red.__qualname__)
    with pytest.raises(ConfigError, match=r"^Unknown colour 'blue'; choose one of red, fraction\.$"):
        registry.get("blue")
    with pytest.raises(ValueError, match="The colour 'red' is registered already"):
        registry.register("red", red)
    registry.unregister("red")
    assert registry.names() == ("fraction",)


def test_the_package_registries_read_their_names_without_importing_their_entries():
    """Every format, engine, strategy and Keras class is named without importing Keras or TensorFlow."""
    code = ("import sys\n"
            "from keras_transformer.exports import EXPORTERS\n"
            "from keras_transformer.engines.loader import ENGINES\n"
            "from keras_transformer.decoding import STRATEGIES\n"
            "from keras_transformer.runtime.registration import SERIALIZABLE\n"
            "print(list(EXPORTERS), list(ENGINES), list(STRATEGIES), len(SERIALIZABLE) > 10,\n"
            "      sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=pathlib.Path(__file__).resolve().parents[1])
    assert result.stdout.split() == ["['savedmodel',", "'ctranslate2',", "'litert']", "['tensorflow',",
                                     "'ctranslate2',", "'packed',", "'litert']", "['beam',", "'greedy',", "'sample']",
                                     "True", "[]"]
