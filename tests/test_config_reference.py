"""docs/config.md: the reference of every experiment config key, generated from the schema, and kept equal to it."""

import dataclasses
import typing

import pytest
from factories import REPO

from keras_transformer.errors import ConfigError
from keras_transformer.experiment import ExperimentConfig
from keras_transformer.experiment import reference as config_reference

TEXT_FILES = {"train_source": "a.en", "train_target": "a.de"}  # never read: loading a config checks no file


def test_docs_config_md_is_what_the_schema_generates():
    """A field added, renamed, retyped, given another default or another comment changes the reference: the
    file must be regenerated with the change."""
    written = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert written == config_reference.reference(), f"docs/config.md is out of date: run {config_reference.COMMAND}"


def test_each_key_has_its_type_default_accepted_values_and_whole_comment():
    keys = {key.name: key for keys in config_reference.schema_keys().values() for key in keys}
    assert keys["training.steps_per_epoch"].type == "int or null"
    assert keys["training.steps_per_epoch"].default == "`null`"
    assert keys["training.strategy"].accepts == ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
    assert keys["training.mixed_precision"].type == "str or bool"  # typing.Any: the types of the values it takes
    assert keys["model.layer_norm_epsilon"].default == "`1e-06`" and keys["model.vocab_size"].default == \
        "the data's vocabulary"  # an experiment takes the data's, not TransformerConfig's 37000
    # a comment continued on the lines below joins into one line
    assert keys["training.rdrop_alpha"].comment.endswith("(losses.RDropLoss); a batch computes twice the positions")
    # the `# --- group ---` line above a field heads its table; the pipeline's fields apply to two kinds
    assert keys["model.dropout"].group == "regularization"
    assert keys["data.tokens_per_batch"].group == "batching (kind: text or tfds)"
    assert "data.pipeline" not in keys and list(keys).count("data.vocab_size") == 1  # one key, two dataclasses


@dataclasses.dataclass(frozen=True)
class _Documented:
    size: int = 3  # how many
    # --- words ---------------------------------------------------------------
    word: typing.Optional[str] = None  # a word that takes
                                       # two lines to say


@dataclasses.dataclass(frozen=True)
class _Undocumented:
    size: int = 3  # how many
    word: str = "x"


@dataclasses.dataclass(frozen=True)
class _StrayComment:
    size: int = 3  # how many
    # a remark that belongs to no field
    word: str = "x"  # a word


def test_a_field_without_its_comment_or_a_comment_without_its_field_is_named():
    assert config_reference.field_comments(_Documented) == {"size": (None, "how many"),
                                                            "word": ("words", "a word that takes two lines to say")}
    with pytest.raises(ValueError, match=r"_Undocumented.word \(section.word\) has no comment"):
        config_reference.section_keys("section", _Undocumented)
    with pytest.raises(ValueError, match="_StrayComment: line .* is a comment of no field: '# a remark"):
        config_reference.field_comments(_StrayComment)


def _experiment(name, value):
    """A config that sets `name` (section.key) to `value`, with what that needs besides (a model, a data kind)."""
    section, key = name.split(".")
    values = {section: {key: value}}
    if section == "model":
        values["model"].setdefault("preset", "tiny")
    if section == "data":  # kind: text for the pipeline's keys
        kind = value if key == "kind" else "synthetic" if key == "task" else "text"
        values["data"].update(kind=kind, **{"text": TEXT_FILES, "tfds": {"tfds_name": "x/y"}}.get(kind, {}))
    return values


@pytest.mark.parametrize("name", sorted(config_reference.CHOICES))
def test_the_values_a_key_is_listed_to_accept_are_the_ones_the_config_accepts(name):
    for value in config_reference.CHOICES[name]:
        ExperimentConfig.from_dict(_experiment(name, value))
    with pytest.raises(ConfigError, match=name.split(".")[1]):
        ExperimentConfig.from_dict(_experiment(name, "no_such_value"))


def test_every_key_a_resolved_config_holds_is_in_the_reference_and_the_other_way_round():
    """`train --dry-run` prints every key of the kind of data it trains on; together the kinds print each key the
    reference lists (but `model.preset` and `model.from`, which they expand)."""
    resolved = set()
    for data in ({"kind": "synthetic"}, {"kind": "text", **TEXT_FILES}, {"kind": "tfds", "tfds_name": "x/y"}):
        sections = ExperimentConfig.from_dict({"model": {"preset": "tiny"}, "data": data}).resolved()
        resolved |= {f"{section}.{key}" for section, values in sections.items() for key in values}
    listed = {key.name for keys in config_reference.schema_keys().values() for key in keys}
    assert resolved == listed - {"model.preset", "model.from"}
