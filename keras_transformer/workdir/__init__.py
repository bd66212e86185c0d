"""The workdir: a training run's and an export's folders, their names and checks, checkpoints and loading.

`layout` names the files and checks them without TensorFlow or Keras; `checkpoints` writes, rotates, averages and
loads the weights (`load_models`, the one loader). This file imports neither, so that `workdir.layout` stays light.
"""
