"""Every `keras-transformer` command line and every YAML config block of README.md and docs/*.md is one the
package takes as written (issue #64): tests/test_docs.py runs the pages' Python blocks, this file the rest.

- **Command lines** (in ``bash`` and plain blocks; ``\\`` continuations joined, ``NAME=value`` lines of the page
  expanded where ``$NAME`` is used, as a shell would) are parsed by the real argument parser
  (`keras_transformer.cli.arguments.build_parser`). The files a command reads (``--config``, ``--source``,
  ``--reference``, ``--tokenized-reference``) must exist where a reader in the repository root finds them (the
  Multi30k data at ``../shared/data/multi30k``), a shipped model named by ``--model saved_models/...`` must be
  there (or written by an earlier command of the page), and a ``--checkpoint`` inside a ``--model`` or
  ``--workdir`` folder must be at a path the workdir layout writes.
- **YAML blocks** are configs: each goes through ``keras-transformer train --dry-run`` in a scratch folder with
  tiny stand-in files at the paths its ``data:`` section names (gzip where the name ends in ``.gz``).

A block that is deliberately partial says so with ``<!-- partial: why -->`` right before it: its ``...`` stand
for arguments left out (dropped before parsing), and a YAML block marked so is only parsed. Elsewhere ``...`` in a
command line fails, as a reader pasting it would.
"""

import contextlib
import gzip
import io
import pathlib
import re
import shlex
import shutil

import pytest
import yaml

from keras_transformer import cli
from keras_transformer.cli import arguments
from keras_transformer.workdir import layout

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PARTIAL = re.compile(r"<!--\s*partial:\s*(.+?)\s*-->\s*$")
SHELL_LINE = re.compile(r"^(?:export\s+)?(?:[A-Za-z_]\w*=\S*\s*)*(?:timeout\s+\d+\s+)?(?:keras-transformer\b|$)"
                        r"|^(?:export\s+)?[A-Za-z_]\w*=")
INPUT_FILES = ("config", "source", "reference", "tokenized_reference")


def blocks(text):
    """`(line, language, body, partial)` of each fenced block of a page (`partial`: the marker's reason or None)."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = PARTIAL.search(before)
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2),
                      marker.group(1) if marker else None))
    return found


def command_lines(body, variables):
    """The `keras-transformer` argument lists of a shell block, in order, as `(text, argv)`.

    Continuations are joined; `NAME=value` lines (`export` or not) set `variables` (the page's, shared by its
    blocks in order); environment prefixes (`KERAS_BACKEND=jax`) and `timeout N` are passed over.
    """
    commands = []
    for line in re.sub(r"\\\n\s*", " ", body).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not SHELL_LINE.match(line):
            continue  # another program's line (pip, curl, python) or prose in a plain block
        expanded = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)
        try:
            words = shlex.split(expanded, comments=True)
        except ValueError as error:
            commands.append((line, [f"<not valid shell: {error}>"]))
            continue
        if words[:1] == ["export"]:
            words = words[1:]
        assignments = []
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            assignments.append(words.pop(0).split("=", 1))
        if not words:
            variables.update(assignments)
            continue
        if words[0] == "timeout":
            words = words[2:]
        if words[:1] == ["keras-transformer"]:
            ends = [i for i, word in enumerate(words) if word in ("&", "&&", "|", "||", ";")
                    or re.fullmatch(r"\d?[<>].*", word)]  # the command ends there: background, pipe, redirection
            commands.append((line, words[1:ends[0] if ends else None]))
    return commands


def _cases():
    commands, configs = [], []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        variables, written = {}, set()
        for line, language, body, partial in blocks(text):
            if language in ("yaml", "yml"):
                configs.append(pytest.param(body, partial, id=f"{name}:{line}"))
            elif language != "python":
                for number, (source, argv) in enumerate(command_lines(body, variables)):
                    commands.append(pytest.param(source, argv, partial, frozenset(written),
                                                 id=f"{name}:{line}:{number}"))
                    written.update(_outputs(argv))
    return commands, configs


def _outputs(argv):
    """The folders a command writes (`--out`, `--workdir`), which later commands of its page may read."""
    return {value for flag, value in zip(argv, argv[1:]) if flag in ("--out", "--workdir")}


COMMANDS, CONFIGS = _cases()


def parse(argv):
    """The real parser's namespace of `argv`, or AssertionError with what argparse printed."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return arguments.build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(errors.getvalue().strip().splitlines()[-1]) from None


def command_problems(argv, partial, written):
    """Why a reader's copy of the command would fail: the parser's refusal, a file it reads that is not there,
    a shipped model that is not there, a checkpoint at a path no workdir has."""
    if "..." in argv:
        if not partial:
            return ["'...' in a command of a block not marked <!-- partial: why -->"]
        argv = [word for word in argv if word != "..."]
    try:
        args = parse(argv)
    except AssertionError as error:
        return [f"refused by the parser: {error}"]
    problems = []
    for name in INPUT_FILES:
        value = getattr(args, name, None) if args.command != "import" else None  # import's SOURCE: a folder or id
        if isinstance(value, str) and value != "-" and not (ROOT / value).exists():
            problems.append(f"--{name.replace('_', '-')} {value}: no such file (from the repository root)")
    models = getattr(args, "model", None)
    models = models if isinstance(models, list) else [models] if models else []
    for model in models:
        if model.startswith("saved_models/") and not (ROOT / model).exists() and model not in written:
            problems.append(f"--model {model}: not shipped, and no earlier command of the page writes it")
    folders = models + (args.workdir if isinstance(getattr(args, "workdir", None), list)
                        else [args.workdir] if isinstance(getattr(args, "workdir", None), str) else [])
    checkpoints = getattr(args, "checkpoint", None)
    for checkpoint in checkpoints if isinstance(checkpoints, list) else [checkpoints] if checkpoints else []:
        for folder in folders:
            if checkpoint.startswith(folder.rstrip("/") + "/"):
                inside = checkpoint[len(folder.rstrip("/")) + 1:]
                if not (re.fullmatch(rf"{layout.CHECKPOINTS_DIR}/[^/]+\.weights\.h5", inside)
                        or inside == layout.AVERAGED_WEIGHTS):
                    problems.append(f"--checkpoint {checkpoint}: a workdir keeps its checkpoints in "
                                    f"{folder}/{layout.CHECKPOINTS_DIR}/ (and average writes "
                                    f"{folder}/{layout.AVERAGED_WEIGHTS})")
    return problems


def test_the_pages_have_command_lines_and_configs():
    assert len(COMMANDS) >= 60 and len(CONFIGS) >= 2
    pages = {case.id.split(":")[0] for case in COMMANDS}
    assert {"README.md", "docs/command_line.md", "docs/serving.md", "docs/decoding.md"} <= pages


@pytest.mark.parametrize(("source", "argv", "partial", "written"), COMMANDS)
def test_every_command_line_of_the_docs_is_taken_as_written(source, argv, partial, written):
    problems = command_problems(argv, partial, written)
    assert not problems, f"{source}\n" + "\n".join(problems)


def test_the_command_checks_fail_on_what_a_reader_would_trip_on():
    """The checks above can fail: each mistake the docs once had is caught, and the partial marker is read."""
    root_written = frozenset()
    assert command_problems(["evaluate", "--model", "runs/a", "--source", "test.en", "--reference", "test.de"],
                            None, root_written)[0].startswith("--source test.en: no such file")
    assert "runs/a/checkpoints/" in command_problems(
        ["evaluate", "--model", "runs/a", "--checkpoint", "runs/a/best.weights.h5", "--source",
         "../shared/data/multi30k/val.en.gz", "--reference", "../shared/data/multi30k/val.de.gz"],
        None, root_written)[0]
    assert command_problems(["translate", "--model", "saved_models/none", "A dog."], None, root_written)
    assert not command_problems(["translate", "--model", "saved_models/none", "A dog."], None,
                                frozenset({"saved_models/none"}))
    assert command_problems(["translate", "--beam-size", "x", "--model", "saved_models/multi30k_en_de"], None,
                            root_written)[0].startswith("refused by the parser")
    assert command_problems(["train", "--config", "...", "--workdir", "runs/x"], None, root_written)[0].startswith(
        "'...'")
    page = ("text\n<!-- partial: options left out -->\n```bash\n"
            "keras-transformer average --workdir runs/x ... --last 3\n```\n")
    (line, language, body, partial), = blocks(page)
    (_, argv), = command_lines(body, {})
    assert partial == "options left out" and not command_problems(argv, partial, root_written)
    variables = {}
    assert command_lines('D=../data\nexport X="--last 2"\nKERAS_BACKEND=jax keras-transformer average '
                         '--workdir $D/w $X  # note\nkeras-transformer serve --model m > log 2>&1 &\n', variables) == [
        ('KERAS_BACKEND=jax keras-transformer average --workdir $D/w $X  # note',
         ["average", "--workdir", "../data/w", "--last", "2"]),
        ("keras-transformer serve --model m > log 2>&1 &", ["serve", "--model", "m"])]


# ------------------------------------------------------------------ YAML configs
def _data_files(config):
    """The file paths a config's `data:` section names (the keys `check_files` checks)."""
    data = (config or {}).get("data") or {}
    paths = [value for key, value in data.items()
             if isinstance(value, str) and (key.endswith(("_source", "_target")))]
    for corpus in data.get("corpora") or []:
        paths += [corpus[side] for side in ("source", "target") if isinstance(corpus.get(side), str)]
    return paths


def _checkpoint_files(config):
    """The checkpoint a config starts from (`training.init_checkpoint`), written by an earlier command of its page."""
    value = ((config or {}).get("training") or {}).get("init_checkpoint")
    return [value] if isinstance(value, str) else []


def _model_sources(config):
    """The folder whose model.yaml a config's model section starts from (`model.from`: an earlier import)."""
    value = ((config or {}).get("model") or {}).get("from")
    return [value] if isinstance(value, str) else []


def write_stand_ins(folder, config, lines):
    """Writes `lines` (the same number in every file, so that each split aligns) at every data path of `config`,
    relative to `folder`; gzip where the name ends in .gz. A `model.from` folder gets the shipped EN-DE model's
    model.yaml, and an init_checkpoint an empty file (a dry run checks that it is there)."""
    for name in _data_files(config):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(f"{line}\n" for line in lines).encode("utf-8")
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    for name in _checkpoint_files(config):  # an empty stand-in: a dry run checks that it is there
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    for name in _model_sources(config):
        (folder / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "saved_models" / "multi30k_en_de" / "assets.extra" / "model.yaml", folder / name)


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    with gzip.open(multi30k_dir / "val.en.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(60)]


@pytest.mark.parametrize(("body", "partial"), CONFIGS)
def test_every_config_block_of_the_docs_passes_train_dry_run(body, partial, tmp_path, monkeypatch, sentences,
                                                              capsys):
    config = yaml.safe_load(body)
    assert isinstance(config, dict), "a YAML block of the docs is a config mapping"
    if partial:
        return  # parsed only, as the marker says
    write_stand_ins(tmp_path, config, sentences)
    (tmp_path / "config.yaml").write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    status = cli.main(["train", "--config", "config.yaml", "--workdir", "run", "--dry-run"])
    assert status == 0, capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_a_dry_run_lists_weighted_corpora_with_their_line_counts_and_caps(tmp_path, monkeypatch, sentences,
                                                                          capsys):
    config = {"model": {"preset": "tiny"}, "data": {"corpora": [
        {"name": "a", "source": "a.en", "target": "a.de"},
        {"name": "b", "source": "b.en.gz", "target": "b.de.gz", "weight": 3, "max_pairs": 10}]},
        "training": {"steps_per_epoch": 2}}  # no data.kind: files given make it text
    write_stand_ins(tmp_path, config, sentences)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--config", "config.yaml", "--workdir", "run", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("# data files: corpus a 60 lines (weight 1), corpus b 60 lines (weight 3, the first 10 read: "
            "max_pairs)") in out
    assert "kind: text" in out


@pytest.mark.slow
def test_the_weighted_corpora_example_of_docs_data_trains_from_its_config_file(tmp_path, monkeypatch, sentences,
                                                                              caplog):
    """docs/data.md "Several corpora with weights", with stand-in files at its paths (plain and gzip), trains a
    few updates through the `train` command's own code path."""
    text = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
    body, = [body for _, language, body, _ in blocks(text) if language == "yaml" and "corpora:" in body]
    config = yaml.safe_load(body)
    assert {name.endswith(".gz") for name in _data_files(config)} == {True, False}  # both kinds of file
    write_stand_ins(tmp_path, config, sentences)
    (tmp_path / "config.yaml").write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    status = cli.main(["train", "--config", "config.yaml", "--workdir", "run", "--set", "model.preset=tiny",
                       "--set", "data.vocab_size=500", "--set", "training.steps_per_epoch=2",
                       "--set", "training.epochs=1", "--set", "training.tensorboard=false",
                       "--set", "data.window=128"])  # a window of the stand-ins, not of 262,144 lines
    assert status == 0
    assert (tmp_path / "run" / "checkpoints" / "ckpt-0001.weights.h5").is_file()
    mixed = [message for message in caplog.messages if message.startswith("Training data: ")]
    assert mixed and all(f"{name} (" in mixed[0] for name in ("europarl", "news", "crawl"))
    assert "weight 3" in mixed[0]
