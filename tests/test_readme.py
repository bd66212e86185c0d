"""README.md and the pages it links to say what is: the layout section names every module of the package and none
that is gone, every relative link of the documentation leads to a file and a heading that exist, and the README stays
a page a newcomer reads to the end (issue #57, item 7).

The layout section is the fenced block under README's ``## Layout``, read as follows:

- ``keras_transformer/`` opens it; each entry below starts at the entry indent with a path relative to the package:
  a module (``errors.py``), a module of a subpackage (``decoding/options.py``), a subpackage (``layers/``) or several
  names separated by commas (``losses.py, metrics.py``). Lines indented further continue the entry above.
- A ``*.py`` name anywhere in an entry without a folder (``beam.py``) belongs to the subpackage the entry starts with
  (``decoding/`` for ``decoding/search.py ... beam.py``), or to the package itself when the entry starts with a
  top-level name. A name with a folder (``data/batching.py``) means that file.
- A subpackage (``layers/``) stands for its ``__init__.py``; ``__init__.py`` is listed for the package itself.
- ``#`` lines are headings of the import layers; the first line back at the left margin ends the tree.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "keras_transformer"
README = ROOT / "README.md"
LIMIT_BYTES = 12_000

MODULE = re.compile(r"(?<![\w./])((?:\w+/)*\w+\.py)\b")  # errors.py, decoding/options.py; not keras.saving, a/b.md


def _layout_block(text):
    """The lines of the fenced block of README's "## Layout" section."""
    section = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md has no '## Layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "README's layout section has no fenced block"
    return block.group(1).splitlines()


def _entries(lines):
    """The entries of the tree, each one string (its line and its continuation lines)."""
    assert lines and lines[0].strip() == "keras_transformer/", "the layout block opens with 'keras_transformer/'"
    entries, indent = [], None
    for line in lines[1:]:
        if not line.strip():
            continue
        if not line.startswith(" "):  # back at the left margin: configs/ examples/ ...
            break
        depth = len(line) - len(line.lstrip(" "))
        if line.lstrip().startswith("#"):
            continue
        if indent is None:
            indent = depth
        if depth == indent:
            entries.append(line.strip())
        else:
            assert entries and depth > indent, f"layout line indented less than its entries: {line!r}"
            entries[-1] += " " + line.strip()
    return entries


def listed_modules(text):
    """Paths relative to the package (``errors.py``, ``layers/__init__.py``) that the layout section names."""
    listed = set()
    for entry in _entries(_layout_block(text)):
        head = re.match(r"((?:\w+/)*\w+(?:\.py|/))((?:, *(?:\w+/)*\w+(?:\.py|/))*)", entry)
        assert head, f"a layout entry that does not start with a module or a package: {entry!r}"
        names = [head.group(1), *filter(None, (n.strip() for n in head.group(2).split(",")))]
        folder = names[0].rpartition("/")[0] if "/" in names[0] else ""
        for name in names:
            if name.endswith("/"):
                listed.add(f"{name}__init__.py")
        for name in MODULE.findall(entry):
            listed.add(name if "/" in name or not folder else f"{folder}/{name}")
    return listed


def tree_modules():
    """Paths relative to the package of every Python file in it (caches and other folders' files left out)."""
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if "__pycache__" not in path.parts}


def test_layout_section_names_every_module_and_only_those():
    listed, present = listed_modules(README.read_text(encoding="utf-8")), tree_modules()
    missing, gone = sorted(present - listed), sorted(listed - present)
    assert not missing and not gone, (f"README's layout section: not listed {missing}; listed but not in "
                                      f"keras_transformer/ {gone}")


def test_layout_section_gives_each_package_its_own_entry_with_its_purpose():
    """The tree is drawn by role: every package (``workdir/``, ``data/tokenizers/``) opens an entry of its own,
    and the entry says what the package is for before (or around) the modules it lists."""
    entries = _entries(_layout_block(README.read_text(encoding="utf-8")))
    heads = {entry.split()[0].rstrip(","): entry for entry in entries}
    packages = {path.parent.relative_to(PACKAGE).as_posix() + "/" for path in PACKAGE.rglob("__init__.py")
                if path.parent != PACKAGE and "__pycache__" not in path.parts}
    missing = sorted(packages - set(heads))
    assert not missing, f"README's layout section: no entry of their own for the packages {missing}"
    bare = sorted(package for package in packages
                  if not re.sub(r"(?:\w+/)*\w+\.py|[\s,;:()]", "", heads[package][len(package):]))
    assert not bare, f"README's layout section: packages listed without a word of their purpose {bare}"


def test_layout_reading_resolves_each_name_within_its_entry():
    text = ("## Layout\n\n```\nkeras_transformer/\n  __init__.py   the API\n  # a layer\n"
            "  decoding/search.py  the loop, and beam.py,\n                      greedy.py\n"
            "  layers/       attention.py; registration.py is data/batching.py's\n"
            "  losses.py, metrics.py  keras.saving, docs/config.md\nconfigs/  tests/\n```\n")
    assert listed_modules(text) == {"__init__.py", "decoding/search.py", "decoding/beam.py", "decoding/greedy.py",
                                    "layers/__init__.py", "layers/attention.py", "layers/registration.py",
                                    "data/batching.py", "losses.py", "metrics.py"}


def test_readme_opens_with_the_package_and_its_two_commands_and_stays_short():
    text = README.read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    assert size < LIMIT_BYTES, f"README.md is {size} bytes; move detail into docs/ (the limit is {LIMIT_BYTES})"
    opening = text[:text.index("\n## ")]
    assert "Transformer" in opening and "make demo" in opening and "make test" in opening
    # .ci/run runs the test command README gives
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------- links between the pages
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading):
    """GitHub's anchor for a Markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(match) for match in re.findall(r"^#{1,6} +(.+?) *$", text, re.M)}


def test_every_relative_link_of_the_docs_leads_to_a_file_and_a_heading():
    pages = [README, ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "history").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


PAGE_LIMIT_BYTES = 20_000


def test_docs_stay_reference_sized_and_benchmarks_hold_current_tables_only():
    """docs/ says what is true today, in pages of one topic each, each under 20 KB (BENCHMARKS.md included);
    measurement stories live in history/."""
    over = [f"docs/{page.name} is {page.stat().st_size} bytes; the limit is {PAGE_LIMIT_BYTES}"
            for page in sorted((ROOT / "docs").glob("*.md")) if page.stat().st_size >= PAGE_LIMIT_BYTES]
    assert not over, "\n".join(over)
    benchmarks = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    # No commit ids, times of day or superseded runs: each table says its command, date and machine instead.
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", benchmarks)
    assert not re.findall(r"\b\d{1,2}:\d{2}\b", benchmarks)
    assert not re.findall(r"earlier run|superseded", benchmarks, flags=re.IGNORECASE)
