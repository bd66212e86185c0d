"""The suite's own rules (tests/README.md): a test marked slow says in its docstring what it checks that a fast
test cannot, so that the two tiers stay what they claim (`make test-fast` the inner loop, `make test` all)."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def _marked_slow(node):
    return any("slow" in ast.unparse(decorator) for decorator in node.decorator_list)


def _slow_tests():
    """`(file, test function)` for every test marked slow, by decorator or by its module's `pytestmark`."""
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_slow = any(isinstance(node, ast.Assign) and "slow" in ast.unparse(node.value)
                          and any(getattr(target, "id", None) == "pytestmark" for target in node.targets)
                          for node in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and \
                    (module_slow or _marked_slow(node)):
                yield path.name, node


def test_the_reading_finds_the_slow_tests():
    assert len(list(_slow_tests())) > 50


def test_every_slow_test_says_why_it_cannot_be_fast():
    silent = [f"{name}::{node.name}" for name, node in _slow_tests() if not ast.get_docstring(node)]
    assert not silent, ("marked slow without a docstring saying what it checks that a fast test cannot "
                        "(tests/README.md, 'The slow marker'): " + ", ".join(silent))
