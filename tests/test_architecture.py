"""The package's import graph, read from the source: layers that import only downwards, no cycle, no private
name taken across modules, no TensorFlow below the TensorFlow layer, and no Keras internals outside one module."""

import ast
import functools
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"

# The layers, lowest first (README, "Layout"). A module imports only from its own layer or the ones below.
LAYERS = [
    ("stdlib", ["errors", "files", "files.*", "exports", "exports.folder", "workdir", "workdir.layout",
                "workdir.rotation", "workdir.provenance",
                "runtime", "runtime.import_hooks", "runtime.registry", "runtime.registration",
                "runtime.tensorflow_logs",
                "data", "data.textfile", "decoding.registry", "decoding.strategies", "decoding", "decoding.options",
                "decoding.glossary",
                "engines", "engines.interface", "engines.languages", "engines.lines", "engines.details",
                "engines.terms",
                "engines.ctranslate2_cpu", "engines.subwords", "attention", "packed",
                "documents", "documents.*"]),  # numpy, lxml and sentencex too: what engines.interface builds on
    ("core", ["config", "layers", "layers.*", "model", "trainer.losses", "trainer.metrics", "trainer.schedules",
              "trainer.optimizers", "decoding.*", "attention.maps", "runtime.keras_internals", "data.batching",
              "data.stream", "data.synthetic", "packed.data", "trainer", "trainer.footprint",
              "exports.ctranslate2_spec"]),
    ("experiment", ["experiment", "experiment.*"]),
    ("workdir", ["workdir.checkpoints", "workdir.adapters", "evaluation"]),
    ("engines", ["engines.packed", "engines.ctranslate2", "engines.litert"]),  # the engines TensorFlow-free
    ("training", ["trainer.*"]),
    ("tensorflow", ["data.corpus", "data.tokenizers", "data.tokenizers.*", "data.pipeline", "data.pipeline.*",
                    "data.build", "trainer.distribute", "engines.tensorflow", "engines.tensorflow_graph",
                    "engines.tensorflow_chunks", "engines.tensorflow_details", "engines.tensorflow_terms",
                    "engines.tensorflow_attention",
                    "engines.tensorflow_threads", "exports.savedmodel", "exports.ctranslate2", "exports.litert",
                    "exports.warmup",
                    "trainer.tensorflow_callbacks"]),
    ("user", ["engines.loader", "training", "packed.training", "inference", "packed.scoring", "trainer.distillation",
              "serving", "serving.*", "imports", "imports.*"]),
    ("plotting", ["attention.plotting"]),
    ("cli", ["cli", "cli.*"]),
]
TENSORFLOW_LAYER = 6
# Third-party modules a function may import: optional, or heavy and needed by one path only (each site says so),
# and Keras internals, imported where they are used (in keras_internals only, as a test below checks).
LATE_IMPORTS = {"matplotlib", "jax", "ctranslate2", "tensorboard", "tensorflow_datasets", "sentencepiece",
                "keras_nlp", "sacremoses", "keras.src", "tensorflow", "starlette", "uvicorn", "prometheus_client",
                "safetensors", "torch", "huggingface_hub", "ai_edge_litert",
                "fcntl"}  # fcntl: POSIX only (files/locks.py takes no lock without it)


def _module_name(path):
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module):
    for rank, (_, patterns) in enumerate(LAYERS):  # a module named in a layer is there, whatever a pattern says
        if module in patterns:
            return rank
    for rank, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.endswith(".*") and module.startswith(pattern[:-1]):
                return rank
    raise AssertionError(f"keras_transformer.{module} is in no layer of tests/test_architecture.py: add it.")


@functools.cache
def _parsed():
    return tuple((_module_name(path), ast.parse(path.read_text(encoding="utf-8")))
                 for path in sorted(PACKAGE.rglob("*.py")))


def _modules():
    """`{module name: its syntax tree}`, a fresh dict per call. The package is parsed once per run (about a second,
    a dozen tests read it); the trees are only read."""
    return dict(_parsed())


def _imports(tree, modules):
    """`(node, imported module or None, names, is_top_level, external name)` for every import statement.

    The imports of a module-level `if TYPE_CHECKING:` block (names for annotations, never imported at run time)
    count as top-level ones, and still sit in the layers."""
    top = {id(node) for node in tree.body}
    top |= {id(statement) for node in tree.body
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for statement in node.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                internal = name[len("keras_transformer."):] if name.startswith("keras_transformer.") else None
                yield node, internal, [], id(node) in top, name
        elif isinstance(node, ast.ImportFrom) and node.module:
            name = node.module
            if name == "keras_transformer" or name.startswith("keras_transformer."):
                base = name[len("keras_transformer."):] if name != "keras_transformer" else ""
                for alias in node.names:
                    submodule = f"{base}.{alias.name}".strip(".")
                    if submodule in modules:  # `from keras_transformer import training`
                        yield node, submodule, [], id(node) in top, name
                    else:
                        yield node, base, [alias.name], id(node) in top, name
            else:
                yield node, None, [alias.name for alias in node.names], id(node) in top, name


def _graph():
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, tree in modules.items():
        for _, imported, _, _, _ in _imports(tree, modules):
            if imported is not None and imported != name and imported in modules and name != "":
                graph[name].add(imported)
    return modules, graph


def test_every_module_sits_in_a_layer_and_imports_only_its_own_or_lower_layers():
    modules, graph = _graph()
    upward = []
    for name, imported in graph.items():
        if name == "":  # the package's __init__ names everything lazily
            continue
        for other in imported:
            if other and _layer(other) > _layer(name):
                upward.append(f"{name} ({LAYERS[_layer(name)][0]}) imports {other} ({LAYERS[_layer(other)][0]})")
    assert not upward, "\n".join(sorted(upward))


# The modules that stay at the top of the package, each for a reason; every other module belongs to a package.
TOP_LEVEL = {
    "": "the public API",
    "training": "user-facing: train, train_and_evaluate, pack_arrays",
    "inference": "user-facing: translate, evaluate",
    "evaluation": "user-facing: bleu, the Multi30k protocol",
    "config": "the model: TransformerConfig", "model": "the model: build_model",
    "errors": "every package raises them",
}
MAX_TOP_LEVEL = 8  # modules directly under keras_transformer/, __init__ included (issue #85)


def test_only_entry_points_and_shared_modules_stay_at_the_top_of_the_package():
    top = {name for name in _modules() if "." not in name and name not in _packages()} | {""}
    assert len(TOP_LEVEL) <= MAX_TOP_LEVEL
    assert top == set(TOP_LEVEL), (f"top-level modules not in TOP_LEVEL (move them into a package, or say why they "
                                   f"stay): {sorted(top - set(TOP_LEVEL))}; gone: {sorted(set(TOP_LEVEL) - top)}")


def test_every_package_sits_no_higher_than_its_modules():
    """Importing any module of a package first runs the package's `__init__`: it sits in the lowest layer of its
    modules (it imports nothing above them), so that `workdir.layout`, `engines.interface` or `packed.data` stay
    as light as they are."""
    modules, packages = _modules(), _packages() - {""}
    higher = []
    for package in sorted(packages):
        inside = [name for name in modules if name.startswith(package + ".")]
        lowest = min(_layer(name) for name in inside)
        if _layer(package) > lowest:
            higher.append(f"{package} ({LAYERS[_layer(package)][0]}) is above its modules' lowest layer "
                          f"({LAYERS[lowest][0]})")
    assert not higher, "\n".join(higher)


MAX_MODULE_LINES = 600  # a module past it holds more than one concern: split it by concern (issue #85)


def test_no_module_of_the_package_exceeds_the_line_bound():
    lines = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in PACKAGE.rglob("*.py")}
    assert len(lines) > 50  # the package was found
    over = sorted(f"{path}: {count} lines" for path, count in lines.items() if count > MAX_MODULE_LINES)
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split each by concern):\n" + "\n".join(over)


def test_the_import_graph_has_no_cycle():
    _, graph = _graph()
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                cycles.append(" -> ".join(stack[stack.index(other):] + [other]))
            elif other not in state:
                visit(other, stack + [other])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_no_module_imports_another_module_s_private_names():
    modules = _modules()
    taken = []
    for name, tree in modules.items():
        aliases = {}
        for node, imported, names, _, _ in _imports(tree, modules):
            if imported is None:
                continue
            taken += [f"{name}: from keras_transformer.{imported} import {n}" for n in names
                      if n.startswith("_") and imported != name]
            if not names:
                for alias in node.names:
                    aliases[alias.asname or alias.name.split(".")[-1]] = imported
        for node in ast.walk(tree):  # module._name
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__"):
                taken.append(f"{name}: {node.value.id}.{node.attr}")
    assert not taken, "\n".join(taken)


def _packages():
    """The modules that are a package's `__init__` (`""` is keras_transformer's own)."""
    return {_module_name(path) for path in PACKAGE.rglob("__init__.py")}


def _defined(tree):
    """The names a module defines at its top level (functions, classes, assignments), not those it imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def test_no_module_re_exports_a_name_it_imports_from_another_keras_transformer_module():
    """A name has one home: a module that imports a name from another module of the package uses it (no shim that
    keeps it importable from a second place), and does not rename it (`average = workdir.average_checkpoints`).
    A package's `__init__` (keras_transformer's own, `decoding/`, `layers/`) is its package's public API and may."""
    modules, packages = _modules(), _packages()
    found = []
    for name, tree in modules.items():
        if name in packages:
            continue
        imported = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "keras_transformer":
                imported.update((alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update((alias.asname or alias.name.split(".")[0], alias.name) for alias in node.names
                                if alias.name.split(".")[0] == "keras_transformer")
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        found += [f"{name}: imports {origin} and never uses it" for local, origin in imported.items()
                  if local not in used]
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if root.id in imported:
                    found.append(f"{name} line {node.lineno}: {ast.unparse(node)} (a second name for an import)")
    assert not found, "\n".join(sorted(found))


def test_each_name_is_imported_from_the_module_that_defines_it():
    """`from keras_transformer import load_translator`, never the same function through a module that
    happens to import it; a package's `__init__` is a place to import its public names from."""
    modules, packages = _modules(), _packages()
    defined = {name: _defined(tree) for name, tree in modules.items()}
    elsewhere = []
    for name, tree in modules.items():
        for node, imported, names, _, _ in _imports(tree, modules):
            if imported is None or imported in packages:
                continue
            elsewhere += [f"{name} line {node.lineno}: from keras_transformer.{imported} import {n}" for n in names
                          if n not in defined[imported]]
    assert not elsewhere, "\n".join(elsewhere)


def test_tensorflow_is_imported_only_at_the_tensorflow_layer_and_above():
    modules = _modules()
    below = []
    for name, tree in modules.items():
        if name == "" or _layer(name) >= TENSORFLOW_LAYER:
            continue
        for node, imported, _, _, external in _imports(tree, modules):
            if imported is None and external.split(".")[0] in ("tensorflow", "tensorflow_text"):
                below.append(f"{name} line {node.lineno}: {external}")
    assert not below, "\n".join(below)


def test_imports_inside_functions_are_for_optional_or_heavy_dependencies_only():
    modules = _modules()
    late = []
    for name, tree in modules.items():
        for node, imported, _, top_level, external in _imports(tree, modules):
            if top_level:
                continue
            # the command line defers its commands (fast --help), the loader its engines (no TensorFlow unless needed)
            if imported is not None and name not in ("cli.commands", "engines.loader"):
                late.append(f"{name} line {node.lineno}: keras_transformer.{imported}")
            elif imported is None and not any(external == allowed or external.startswith(allowed + ".")
                                              for allowed in LATE_IMPORTS):
                late.append(f"{name} line {node.lineno}: {external}")
    assert not late, "\n".join(late)


def test_keras_internals_are_touched_in_one_module_only_and_imported_where_used():
    """A Keras release that moves a private module then breaks only the function that uses it, not every import
    of the package (tests/test_keras_internals.py runs the translate path without one)."""
    modules = _modules()
    internal = [(name, node, top_level, external) for name, tree in modules.items()
                for node, imported, _, top_level, external in _imports(tree, modules)
                if imported is None and external.startswith("keras.src")]
    outside = [f"{name} line {node.lineno}: {external}" for name, node, _, external in internal
               if name != "runtime.keras_internals"]
    assert not outside, "\n".join(outside)
    top_level = [f"{name} line {node.lineno}: {external}" for name, node, top, external in internal if top]
    assert not top_level, "\n".join(top_level)


def test_decoding_strategies_live_only_in_the_decoding_package():
    """A search is the incremental decoder step in a loop that picks tokens: outside `decoding/` (and the model
    code that defines the step), no call takes the step's cache; and every module of `decoding/` that is not
    shared machinery is a strategy registered in `decoding.STRATEGIES`, so none is reachable by another door."""
    from keras_transformer.decoding import STRATEGIES

    defines_the_step = ("model", "layers.")
    outside = []
    for name, tree in _modules().items():
        if name == "decoding" or name.startswith("decoding.") or name.startswith(defines_the_step):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(k.arg in ("self_attention_cache", "cache_index")
                                                  for k in node.keywords):
                outside.append(f"{name} line {node.lineno}: a cached decoder step outside keras_transformer/decoding/")
    assert not outside, "\n".join(outside)
    shared = {"__init__", "registry", "strategies", "options", "search", "scoring", "constraints", "glossary"}
    strategies = {path.stem for path in (PACKAGE / "decoding").glob("*.py")} - shared
    searches = {STRATEGIES.get(name).search.split(":")[0].rsplit(".", 1)[-1] for name in STRATEGIES}
    assert strategies == searches, "every strategy module is registered in decoding/registry.py"


@pytest.mark.parametrize("statement", ["import keras_transformer",
                                       "from keras_transformer.decoding import DecodeOptions",
                                       "from keras_transformer.engines.ctranslate2 import CTranslate2Translator",
                                       "from keras_transformer.engines.litert import LiteRTTranslator",
                                       "from keras_transformer.engines.loader import load_translator",
                                       "from keras_transformer import serving; serving.check_installed()",
                                       "import keras_transformer.experiment; import keras_transformer.errors",
                                       "from keras_transformer import cli; cli.build_parser()",
                                       "from keras_transformer.exports import EXPORTERS, folder"])
def test_the_package_the_experiment_config_ct2_serving_and_the_command_line_load_without_tensorflow(statement):
    code = f"import sys; {statement}; print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=PACKAGE.parent)
    assert result.stdout.strip() == "[]"


def test_help_prints_no_tensorflow_log_lines_and_commands_print_none_unless_asked(tmp_path):
    help_run = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "--help"], capture_output=True,
                              text=True, cwd=PACKAGE.parent)
    assert help_run.returncode == 0 and "usage: keras-transformer" in help_run.stdout and not help_run.stderr
    # A command that imports TensorFlow: the missing folder is the only line on stderr.
    run = subprocess.run([sys.executable, "-m", "keras_transformer.cli", "translate", "--model",
                          str(tmp_path / "missing"), "A dog."], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"keras-transformer translate: error: Model folder not found: {tmp_path / 'missing'} (expected a training "
        "workdir, a SavedModel export or a CTranslate2 export)."]


def test_only_the_command_line_parses_arguments():
    """One command line: `cli.commands` runs it and `cli.arguments` defines its flags; no other module imports argparse
    (a second `python -m` program would write the shared flags again, and drift from them)."""
    parsing = sorted(name for name, tree in _modules().items()
                     for _, _, _, _, external in _imports(tree, {}) if external.split(".")[0] == "argparse")
    assert set(parsing) <= {"cli.arguments", "cli.commands"}, parsing

