"""The import paths users rely on still import: every public name of `keras_transformer`, and every
`from keras_transformer... import ...`, `import keras_transformer...` and dotted `keras_transformer.a.b` path that
README.md, docs/ and examples/ show. A module that moves takes the pages that name it along (issue #63, item 1)."""

import importlib
import pathlib
import re

import pytest

import keras_transformer

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*"))]
FROM = re.compile(r"\bfrom (keras_transformer(?:\.\w+)*) import ([\w ,]+)")
IMPORT = re.compile(r"(?<![\w.])import (keras_transformer(?:\.\w+)*)")
DOTTED = re.compile(r"(?<![\w./-])(keras_transformer(?:\.\w+)+)")


def _texts():
    return [(page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8")) for page in PAGES
            if page.is_file() and page.suffix in (".md", ".py", ".sh")]


def _paths():
    """`(page, module, name or None)` for every import and dotted path the pages show."""
    found = set()
    for page, text in _texts():
        for module, names in FROM.findall(text):
            for name in names.split(","):
                if name.split():
                    found.add((page, module, name.split()[0]))  # `packed as trainer`: packed
        found.update((page, module, None) for module in IMPORT.findall(text))
        found.update((page, path, None) for path in DOTTED.findall(text))
    return sorted(found, key=lambda item: (item[0], item[1], item[2] or ""))


def _resolve(path):
    """The object a dotted path names: its longest importable module prefix, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("name", keras_transformer.__all__)
def test_every_public_name_imports(name):
    assert getattr(keras_transformer, name) is not None


def test_the_pages_show_imports_to_check():
    assert len(_paths()) > 50  # the reading finds them (README, docs/, examples/)


@pytest.mark.parametrize("page, module, name", _paths(), ids=lambda value: str(value))
def test_every_import_path_the_pages_show_imports(page, module, name):
    value = _resolve(module)
    if name is not None and not hasattr(value, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: `from keras_transformer.data import pipeline`


@pytest.mark.parametrize("old, new", sorted(keras_transformer.MOVED_MODULES.items()))
def test_a_module_that_moved_into_a_package_still_imports_by_its_old_name(old, new):
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__name__ == new and module.__spec__.name == new
    assert old.rpartition(".")[2] not in {path.stem for path in (ROOT / "keras_transformer").glob("*.py")}
