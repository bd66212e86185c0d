"""Every Python block of README.md and docs/*.md runs as written (issue #47, item 4).

Sybil (https://sybil.readthedocs.io) finds the blocks; each block is one test, named by its page and line
(``test_block_runs[docs/data.md:47]``). A page's blocks share one namespace and run in page order, as a reader
runs them top to bottom: a block may use what an earlier block of its page defined, never anything else. Blocks of
other languages (bash, yaml, plain) are not run.

Two HTML comments, invisible on the rendered page, go right before a block:

- ``<!-- skip: next "why" -->`` (Sybil's skip directive): the block is reported as skipped, with the reason. For
  blocks that need a long training run, a GPU or a service.
- ``<!-- slow: why -->``: the block runs, under ``@pytest.mark.slow`` (tests/README.md), so ``make test-fast``
  leaves it out. A slow block runs only as its own test, never for a later block of its page: later blocks must
  not need what it defines.

The blocks run in a scratch copy of the checkout's layout: the working directory is a folder whose
``saved_models/``, ``configs/`` and ``examples/`` link to the repository's, beside a ``shared/`` that links to the
one beside the repository. Relative paths in the docs (``saved_models/multi30k_en_de``,
``../shared/data/multi30k/...``) therefore mean what they mean to a reader in the repository root, and what a
block writes (``runs/...``, ``ct2/...``) lands in the scratch folder, not in the repository.
"""

import ast
import importlib
import inspect
import pathlib
import re
import unittest

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = ("saved_models", "configs", "examples")


class SlowParser:
    """Sybil parser of ``<!-- slow: why -->``: marks the next block's test slow; evaluates to nothing."""

    def __init__(self):
        self.lexer = DirectiveInHTMLCommentLexer("slow", arguments=".+?")

    def __call__(self, document):
        for region in self.lexer(document):
            region.parsed = region.lexemes["arguments"]
            yield region  # no evaluator: evaluating the directive does nothing


SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser(), SlowParser()])


class Page:
    """A parsed page: its examples (blocks and directives) in order, each evaluated once per process."""

    def __init__(self, path):
        self.path = path
        self.examples = list(SYBIL.parse(path).examples())
        self.slow = set()  # indices of the blocks marked slow
        self.outcomes = {}  # example index -> the exception it raised, or None

    def run_through(self, index):
        """Evaluates the examples up to `index` that have not run yet, in page order; returns `index`'s outcome.

        Under ``-k``, ``-m "not slow"`` or ``--lf`` a block's test may run without the tests of the blocks before
        it: those blocks then run here first, as the reader would have run them (slow blocks excepted), and a
        failure among them is reported as such.
        """
        for position in range(index + 1):
            if position in self.outcomes and (position < index or position not in self.slow):
                continue
            if position < index and position in self.slow:
                self.outcomes[position] = None  # passed over; its own test, if it comes, still runs it
                continue
            try:
                self.examples[position].evaluate()
                self.outcomes[position] = None
            except BaseException as error:  # noqa: BLE001 - kept and re-raised by the block's own test
                self.outcomes[position] = error
            if position < index and not isinstance(self.outcomes[position], (type(None), unittest.SkipTest)):
                raise AssertionError(f"{self.name}:{self.examples[position].line}, a block that this one runs "
                                     f"after, failed") from self.outcomes[position]
        return self.outcomes[index]

    @property
    def name(self):
        return self.path.relative_to(ROOT).as_posix()


_PAGES = {path: Page(path) for path in PAGES}


def _cases():
    cases = []
    for page in _PAGES.values():
        slow = False
        for index, example in enumerate(page.examples):
            if example.region.evaluator is None:  # a slow directive
                slow = True
                continue
            if isinstance(example.region.parsed, tuple):  # a skip directive
                continue
            marks = [pytest.mark.xdist_group(f"docs-{page.name}")]  # a page's blocks run in order on one worker
            if slow:
                marks.append(pytest.mark.slow)
                page.slow.add(index)
                slow = False
            cases.append(pytest.param(page.path, index, marks=marks, id=f"{page.name}:{example.line}"))
    return cases


CASES = _cases()


@pytest.fixture(scope="session")
def checkout(tmp_path_factory, multi30k_dir):
    """A scratch folder laid out as the repository's root (see the module docstring); one per test run."""
    root = tmp_path_factory.mktemp("docs")
    (root / "shared").symlink_to(multi30k_dir.parents[1], target_is_directory=True)
    folder = root / ROOT.name
    folder.mkdir()
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    return folder


def test_every_page_with_python_blocks_is_collected():
    pages = {case.values[0] for case in CASES}
    for name in ("README.md", "docs/data.md", "docs/decoding.md", "docs/serving.md", "docs/attention.md"):
        assert ROOT / name in pages, name
    blocks = sum(path.read_text(encoding="utf-8").count("\n```python\n") for path in PAGES)
    assert len(CASES) == blocks  # every fenced Python block is a test


@pytest.mark.parametrize(("path", "index"), CASES)
def test_block_runs(path, index, checkout, monkeypatch):
    monkeypatch.chdir(checkout)
    outcome = _PAGES[path].run_through(index)
    if isinstance(outcome, unittest.SkipTest):
        pytest.skip(str(outcome))
    if outcome is not None:
        raise outcome


# ------------------------------------------------------------------ every block, skipped or not, read statically
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(path):
    """`(line, source)` of each fenced Python block of a page."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 2, match.group(1)) for match in BLOCK.finditer(text)]


def _package_names(tree, names):
    """Adds to `names` what the block's imports of keras_transformer bind: local name -> module or object."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "keras_transformer":
                    local = alias.asname or alias.name.split(".")[0]
                    names[local] = importlib.import_module(alias.name if alias.asname else "keras_transformer")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "keras_transformer":
            module = importlib.import_module(node.module)
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = value


def _resolve(node, names):
    """The package object an expression such as `kt.TransformerConfig.preset` names, or None."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, names)
        return None if owner is None else getattr(owner, node.attr, None)
    return None


def _documented(target, parameter):
    """The text the `Args:` section of `target`'s docstring gives `parameter` ("" if none)."""
    doc = inspect.getdoc(target) or ""
    match = re.search(rf"^(\s*){re.escape(parameter)}(?:, [\w, ]+)?:(.*(?:\n\1\s+.*)*)", doc.split("Args:", 1)[-1],
                      re.M)
    return match.group(2) if match else ""


def _signature_problems(call, target, names, built):
    """Why `call` cannot reach `target` as written: arguments its signature refuses, or an object built by a
    package class passed positionally to a parameter whose documentation does not name that class."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return []
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    try:
        bound = signature.bind(*call.args, **{k.arg: k.value for k in call.keywords})
    except TypeError as error:
        return [f"{ast.unparse(call)}: {error}"]
    problems = []
    for parameter, value in bound.arguments.items():
        kind = signature.parameters[parameter].kind
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        origin = value.func if isinstance(value, ast.Call) else value
        cls = _resolve(origin, names) if isinstance(value, ast.Call) else built.get(getattr(value, "id", None))
        if isinstance(cls, type) and _documented(target, parameter) and \
                cls.__name__ not in _documented(target, parameter):
            problems.append(f"{ast.unparse(call)}: a {cls.__name__} goes to `{parameter}`, documented as "
                            f"{_documented(target, parameter).strip()[:80]!r}")
    return problems


def test_every_block_parses_and_calls_the_package_as_its_signatures_allow():
    """Skipped blocks too (a long run, a GPU, a service): each parses, and each call of a keras_transformer function
    or class binds to its signature, with no package object in a parameter documented as something else."""
    problems = []
    for path in PAGES:
        names, built = {}, {}  # a page's imports and `x = PackageClass(...)` variables, in page order
        for line, source in _blocks(path):
            where = f"{path.relative_to(ROOT).as_posix()}:{line}"
            try:
                tree = ast.parse(source)
            except SyntaxError as error:
                problems.append(f"{where}: {error}")
                continue
            _package_names(tree, names)
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                        isinstance(_resolve(node.value.func, names), type):
                    built.update((t.id, _resolve(node.value.func, names)) for t in node.targets
                                 if isinstance(t, ast.Name))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and callable(target := _resolve(node.func, names)):
                    problems += [f"{where}: {problem}" for problem in _signature_problems(node, target, names, built)]
    assert not problems, "\n".join(problems)
