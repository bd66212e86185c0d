"""The experiment config: the YAML schema of a run, loadable without TensorFlow.

An experiment config has four sections, each a frozen dataclass of its own module:

```yaml
model:      # the architecture: TransformerConfig fields, or `preset: tiny|small|base|big` plus overrides
  preset: tiny
data:       # where sentence pairs come from (DataSection): synthetic, text files or TFDS,
  kind: synthetic  # plus the data pipeline's DataConfig fields (vocab_size, tokens_per_batch, ...)
training:   # the optimizer, schedule and loss; epochs, strategy, precision, checkpoints (TrainingSection)
  epochs: 8
decoding:   # how the model decodes (DecodeOptions), written into workdir/model.yaml (DecodingSection)
  beam_size: 4
```

`load_experiment(paths, overrides)` reads one or more YAML files (later files
override earlier ones key by key) and then `--set section.key=value` overrides
(later values win). Unknown keys are rejected with the key named, and the model
section is built into a `TransformerConfig` right away, so that bad sizes fail
before any data work; `train` (and `--dry-run`) also check that the data files
exist.

The modules, one concern each: `validation` (the accepted values, unknown keys refused), `data_config` (the
pipeline's `DataConfig`), `data_section`, `training_section` and `decoding_section`, `experiment_config` (the
whole `ExperimentConfig`), `data_files` (the data files checked and their lines counted), `loading` (YAML files
merged, `--set` overrides) and `resume` (whether a workdir's run can go on with a config). Import the names from
this package.

This package imports the standard library, YAML and the model config only: a machine without TensorFlow (the
packed-array trainer on a GPU machine with JAX) reads a workdir's `experiment.yaml` with the same defaults as
`train`.

Example:

>>> load_experiment("configs/tiny_copy.yaml", ["training.epochs=2"]).training.epochs
2
"""

import typing
import warnings

from keras_transformer.experiment.data_config import CORPUS_KEYS, DataConfig
from keras_transformer.experiment.data_files import check_data_files, count_split_lines
from keras_transformer.experiment.data_section import DataSection
from keras_transformer.experiment.decoding_section import DecodingSection
from keras_transformer.experiment.experiment_config import ExperimentConfig
from keras_transformer.experiment.loading import as_experiment, load_experiment, parse_override
from keras_transformer.experiment.resume import changed_experiment, check_same_experiment, write_yaml
from keras_transformer.experiment.training_section import TrainingSection
from keras_transformer.experiment.validation import (
    BATCH_SCALINGS,
    COMMUNICATIONS,
    DATA_KINDS,
    DISTRIBUTION_STRATEGIES,
    JIT_COMPILE,
    MODEL_TYPES,
    NONFINITE,
    PRECISIONS,
    SECTIONS,
    SUBWORD_DROPOUT_SIDES,
    VERBOSITIES,
    is_integer,
    reject_unknown,
)

__all__ = ["BATCH_SCALINGS", "COMMUNICATIONS", "CORPUS_KEYS", "DATA_KINDS", "DISTRIBUTION_STRATEGIES", "JIT_COMPILE",
           "MODEL_TYPES", "NONFINITE", "PRECISIONS", "SECTIONS", "SUBWORD_DROPOUT_SIDES", "VERBOSITIES", "DataConfig",
           "DataSection", "DecodingSection", "ExperimentConfig", "TrainingSection", "as_experiment",
           "changed_experiment", "check_data_files", "check_same_experiment", "count_split_lines", "is_integer",
           "load_experiment", "parse_override", "reject_unknown", "write_yaml"]


def __getattr__(name: str) -> typing.Any:
    if name == "STRATEGIES":  # the old name of DISTRIBUTION_STRATEGIES (it read like the decoding strategies)
        warnings.warn("keras_transformer.experiment.STRATEGIES is now DISTRIBUTION_STRATEGIES.", DeprecationWarning,
                      stacklevel=2)
        return DISTRIBUTION_STRATEGIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
