"""`docs/config.md`, the reference of every experiment config key, generated from the schema itself.

The schema is the four sections' dataclasses (`experiment.DataSection` with the
pipeline's `experiment.DataConfig`, `TrainingSection`, `DecodingSection`, and
`config.TransformerConfig` plus `preset` for the model). Each key's type and
default come from its dataclass field; its description is the field's trailing
`# comment` in the source (with the comment lines aligned under it), read with
`tokenize`, so the comment beside the field stays the one place to write it;
a `# --- group ---` line above fields heads their table. The values a key
accepts, where they are a closed set, come from the constants the validation
uses (`CHOICES`).

```
python -m keras_transformer.experiment.reference > docs/config.md
```

`tests/test_config_reference.py` fails when docs/config.md and the schema
disagree, and when a field has no comment. No TensorFlow.
"""

import ast
import dataclasses
import inspect
import io
import pathlib
import re
import sys
import tokenize
import typing

from keras_transformer.config import (
    ACTIVATIONS,
    NORMALIZATIONS,
    POSITION_KINDS,
    PRESET_WARMUP_STEPS,
    PRESETS,
    SINUSOID_LAYOUTS,
    TIE_MODES,
    TransformerConfig,
)
from keras_transformer.data.synthetic import TASKS
from keras_transformer.data.textfile import ERROR_MODES
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.registry import STRATEGIES
from keras_transformer.experiment import (
    BATCH_SCALINGS,
    COMMUNICATIONS,
    DATA_KINDS,
    DISTRIBUTION_STRATEGIES,
    JIT_COMPILE,
    MODEL_TYPES,
    NONFINITE,
    PRECISIONS,
    SUBWORD_DROPOUT_SIDES,
    VERBOSITIES,
    DataConfig,
    DataSection,
    DecodingSection,
    TrainingSection,
)
from keras_transformer.experiment.validation import VALIDATION_METRICS

COMMAND = "python -m keras_transformer.experiment.reference > docs/config.md"

# The closed sets of values a key accepts: the constants its validation checks against.
CHOICES = {
    "model.preset": tuple(PRESETS),
    "model.position": POSITION_KINDS,
    "model.sinusoid_layout": SINUSOID_LAYOUTS,
    "model.activation": ACTIVATIONS,
    "model.normalization": NORMALIZATIONS,
    "model.tie_embeddings": TIE_MODES + (True, False),
    "data.kind": DATA_KINDS,
    "data.task": TASKS,
    "data.errors": ERROR_MODES,
    "data.model_type": MODEL_TYPES,
    "data.subword_dropout_sides": SUBWORD_DROPOUT_SIDES,
    "training.strategy": DISTRIBUTION_STRATEGIES,
    "training.communication": COMMUNICATIONS,
    "training.batch_scaling": BATCH_SCALINGS,
    "training.mixed_precision": PRECISIONS + (True, False),
    "training.jit_compile": JIT_COMPILE,
    "training.chunked_loss": JIT_COMPILE,
    "training.on_nonfinite": NONFINITE,
    "training.verbose": VERBOSITIES,
    "training.validation_metric": VALIDATION_METRICS,
    "decoding.strategy": tuple(STRATEGIES),
}

# Defaults an experiment takes from elsewhere than its dataclass field.
DEFAULTS = {"model.vocab_size": "the data's vocabulary", "training.warmup_steps": "the preset's"}

_GROUP = re.compile(r"^#\s*-{3,}\s*(.*?)\s*-*$")


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key as the reference shows it."""

    name: str  # "section.key"
    type: str  # e.g. "int or null"
    default: str  # as Markdown
    accepts: tuple  # the closed set of values, or ()
    comment: str  # the field's comment, on one line
    group: typing.Optional[str] = None  # the `# --- group ---` heading above it


def field_comments(cls: type) -> dict[str, tuple[typing.Optional[str], typing.Optional[str]]]:
    """`{field: (group, comment)}` of a dataclass, read from its source file with `tokenize`.

    A field's comment is the `# ...` after it on its line, continued by the
    comment-only lines right below that start in the same column; its group is
    the text of the last `# --- group ---` line above it (None before the first).

    Raises:
        ValueError: a comment-only line among the fields that is neither a group line nor a continuation.

    Example:

    >>> field_comments(DecodingSection)["batch_size"]
    (None, 'sentences decoded together when evaluating')
    """
    source = pathlib.Path(typing.cast(str, inspect.getsourcefile(cls))).read_text(encoding="utf-8")
    lines = source.splitlines()
    comments: dict[int, tuple[int, str, bool]] = {}  # row -> (column, text, alone on its line)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            comments[row] = (column, token.string, not lines[row - 1][:column].strip())
    node = next(node for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ClassDef) and node.name == cls.__name__)
    fields = [(statement.lineno, typing.cast(int, statement.end_lineno), typing.cast(ast.Name, statement.target).id)
              for statement in node.body if isinstance(statement, ast.AnnAssign)]
    found: dict[str, tuple[typing.Optional[str], typing.Optional[str]]] = {}
    group: typing.Optional[str] = None
    row = node.lineno  # from the class line: a group line may head the first field
    for first, last, name in fields:
        for above in range(row + 1, first):  # the lines between the previous field and this one
            if above in comments:
                column, text, alone = comments[above]
                match = _GROUP.match(text)
                if not (alone and match):
                    raise ValueError(f"{cls.__name__}: line {above} is a comment of no field: {text!r}")
                group = match.group(1)
        comment = comments.get(last)
        if comment is None or comment[2]:
            found[name] = (group, None)
            row = last
            continue
        column, parts, row = comment[0], [comment[1]], last
        while row + 1 in comments and comments[row + 1][2] and comments[row + 1][0] == column:
            row += 1
            parts.append(comments[row][1])
        found[name] = (group, " ".join(part.lstrip("#").strip() for part in parts))
    return found


def _yaml(value: typing.Any) -> str:
    """A value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _type(annotation: typing.Any, choices: typing.Sequence[typing.Any] = ()) -> str:
    """A field's annotation in YAML words: `int`, `str or null`, ..."""
    if annotation is typing.Any:  # a bool or a word: the types of the values it accepts
        names = []
        for value in choices:
            name = "bool" if isinstance(value, bool) else type(value).__name__
            names += [name] if name not in names else []
        return " or ".join(names) or "any"
    if typing.get_origin(annotation) is typing.Union:
        kinds = [_type(argument) for argument in typing.get_args(annotation) if argument is not type(None)]
        return " or ".join(kinds + ["null"])
    return {int: "int", float: "float", bool: "bool", str: "str", list: "list", dict: "mapping"}[annotation]


def _default(field: typing.Any) -> str:
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    return f"`{_yaml(value)}`"


def section_keys(section: str, cls: type, skip: typing.Collection[str] = ()) -> list[Key]:
    """The `Key`s of a dataclass's fields as the keys of `section`, in the order of the source.

    Raises:
        ValueError: a field without a comment (named).

    Example:

    >>> [key.name for key in section_keys("decoding", DecodeOptions)][:2]
    ['decoding.strategy', 'decoding.beam_size']
    """
    comments = field_comments(cls)
    keys = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        name = f"{section}.{field.name}"
        group, comment = comments[field.name]
        if not comment:
            raise ValueError(f"{cls.__name__}.{field.name} ({name}) has no comment: write what it is beside it, "
                             "it is the key's description in docs/config.md.")
        choices = CHOICES.get(name, ())
        keys.append(Key(name, _type(field.type, choices), DEFAULTS.get(name, _default(field)), choices, comment,
                        group))
    return keys


def schema_keys() -> dict[str, list[Key]]:
    """`{section: [Key, ...]}`: every key an experiment config accepts, as the reference lists them.

    Example:

    >>> keys = schema_keys()
    >>> list(keys), keys["model"][0].name, keys["training"][0].type
    (['model', 'data', 'training', 'decoding'], 'model.preset', 'float')
    """
    preset = Key("model.preset", "str or null", "`null`", CHOICES["model.preset"],
                 "start from these sizes (table below); the model keys given override them")
    start = Key("model.from", "str or null", "`null`", (),
                "start from the fields of this workdir's, export's or file's model.yaml (an imported model to "
                "fine-tune; not with preset) and its decoding defaults; the model and decoding keys given override "
                "them, and a run from an import keeps its imported.json (source, licence)")
    data = section_keys("data", DataSection, skip=("pipeline",))
    own = {key.name for key in data}
    pipeline = [dataclasses.replace(key, group=f"{key.group} (kind: text or tfds)")
                for key in section_keys("data", DataConfig) if key.name not in own]
    return {"model": [preset, start] + section_keys("model", TransformerConfig), "data": data + pipeline,
            "training": section_keys("training", TrainingSection),
            "decoding": section_keys("decoding", DecodeOptions)
            + section_keys("decoding", DecodingSection, skip=("options",))}


def _summary(cls: type) -> str:
    """The first paragraph of a class's docstring, on one line."""
    return " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


_INTRO = {
    "model": f"{_summary(TransformerConfig)} The section holds `TransformerConfig` fields "
             "(`keras_transformer/config.py`), alone or over a `preset`. The vocabulary sizes default to the "
             "data's (the learned tokenizer's, or `data.vocab_size` for synthetic data).",
    "data": f"{_summary(DataSection)} Written flat under `data:` (`keras_transformer/experiment/data_section.py`, "
            "`DataSection`); the `DataConfig` fields of the text pipeline (`experiment/data_config.py`) apply to "
            "`kind: text` and `tfds`, and `kind: synthetic` refuses them by name.",
    "training": f"{_summary(TrainingSection)} (`keras_transformer/experiment/training_section.py`, "
                "`TrainingSection`.)",
    "decoding": f"{_summary(DecodingSection)} (`keras_transformer/experiment/decoding_section.py`, "
                "`DecodingSection`; the old names `length_penalty` and `max_decode_extra` are read as `alpha` and "
                "`max_extra`.)",
}


def _table(keys: typing.Sequence[Key]) -> list[str]:
    rows = ["| key | type | default | accepts | what it is |", "| --- | --- | --- | --- | --- |"]
    for key in keys:
        accepts = "".join(f" `{_yaml(value)}`," for value in key.accepts).rstrip(",")  # "" when any value goes
        rows.append(f"| `{key.name}` | {key.type} | {_cell(key.default)} |{accepts} | {_cell(key.comment)} |")
    return rows


def _presets() -> list[str]:
    names = [field.name for field in dataclasses.fields(TransformerConfig)
             if any(field.name in values for values in PRESETS.values())]
    rows = ["| key | " + " | ".join(f"`{name}`" for name in PRESETS) + " |", "| --- |" + " --- |" * len(PRESETS)]
    for name in names:
        default = getattr(TransformerConfig, name)
        rows.append(f"| `model.{name}` | " + " | ".join(f"{_yaml(values.get(name, default))}"
                                                         for values in PRESETS.values()) + " |")
    rows.append("| `training.warmup_steps` | " + " | ".join(str(PRESET_WARMUP_STEPS[name])
                                                                     for name in PRESETS) + " |")
    return rows


def reference() -> str:
    """The Markdown of docs/config.md.

    Example:

    >>> text = reference()
    >>> text.startswith("# Experiment config reference"), "| `training.strategy` | str | `auto` |" in text
    (True, True)
    """
    lines = [
        "# Experiment config reference",
        "",
        f"<!-- Generated from the schema by `{COMMAND}`; do not edit by hand:",
        "     tests/test_config_reference.py fails when this file and the schema disagree. -->",
        "",
        "An experiment config is YAML with four sections, `model`, `data`, `training` and `decoding`. Later",
        "`--config` files override earlier ones key by key, then `--set section.key=value` (YAML values) in order.",
        "An unknown key is refused with its name and the closest known one, a bad value with its key, before any",
        "data work. `keras-transformer train --dry-run` prints a config with every key below resolved. `null` is",
        "YAML's None.",
    ]
    for section, keys in schema_keys().items():
        lines += ["", f"## {section}", "", _INTRO[section]]
        groups: list[tuple[typing.Optional[str], list[Key]]] = []
        for key in keys:
            if not groups or groups[-1][0] != key.group:
                groups.append((key.group, []))
            groups[-1][1].append(key)
        for group, members in groups:
            if group is not None:
                lines += ["", f"### {section}: {group}"]
            lines += [""] + _table(members)
        if section == "model":
            lines += ["", "### model: presets", "",
                      "`preset:` starts from these values (`config.PRESETS`); the other fields keep their defaults.",
                      ""] + _presets()
    return "\n".join(lines) + "\n"


def main(argv: typing.Optional[list[str]] = None) -> None:
    """`python -m keras_transformer.experiment.reference`: writes the reference to stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        sys.exit(f"usage: {COMMAND}")
    sys.stdout.write(reference())


if __name__ == "__main__":
    main()
