"""`DecodingSection`, the experiment's `decoding:` section: the model's `DecodeOptions`, and how the evaluation
at the end of training decodes."""

import dataclasses
import typing

from keras_transformer.decoding.options import OLD_NAMES as OLD_DECODING_NAMES
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.errors import ConfigError
from keras_transformer.experiment.validation import is_integer, reject_unknown


@dataclasses.dataclass(frozen=True)
class DecodingSection:
    """How the run's model decodes: the `DecodeOptions` keys (`keras_transformer/decoding/options.py`), written
    into `workdir/model.yaml` so that evaluation, translation and export use them, and two settings of the
    evaluation at the end of training.

    The YAML section is flat: the `DecodeOptions` fields (old names accepted: `length_penalty` for `alpha`,
    `max_decode_extra` for `max_extra`) beside `batch_size` and `average_last`.

    Example:

    >>> section = DecodingSection.from_dict({"beam_size": 5, "length_penalty": 1.0, "batch_size": 32})
    >>> section.options.beam_size, section.options.alpha, section.batch_size
    (5, 1.0, 32)
    """

    options: DecodeOptions = DecodeOptions()  # the DecodeOptions keys, flat in the section
    batch_size: int = 64  # sentences decoded together when evaluating
    average_last: typing.Optional[int] = None  # test evaluation averages the last N checkpoints (paper: 5 / 20)

    def validate(self) -> None:
        """Raises `ConfigError` naming the first bad field (the options validate themselves)."""
        for name in ("batch_size", "average_last"):
            value = getattr(self, name)
            if value is None and name != "batch_size":
                continue
            if not is_integer(value) or value <= 0:
                raise ConfigError(f"decoding.{name} must be a positive integer, got {value!r}.")

    @classmethod
    def from_dict(cls, values: typing.Optional[dict[str, typing.Any]]) -> "DecodingSection":
        """The section from its flat YAML mapping; unknown keys are refused by name."""
        values = dict(values or {})
        reject_unknown(values, [f.name for f in dataclasses.fields(DecodeOptions)] + list(OLD_DECODING_NAMES)
                        + ["batch_size", "average_last"], "decoding.")
        own = {name: values.pop(name) for name in ("batch_size", "average_last") if name in values}
        section = cls(options=DecodeOptions.from_dict(values), **own)
        section.validate()
        return section

    def to_dict(self) -> dict[str, typing.Any]:
        """The flat YAML mapping: the options' fields, then `batch_size` and `average_last`."""
        return {**self.options.to_dict(), "batch_size": self.batch_size, "average_last": self.average_last}
