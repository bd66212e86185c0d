"""The workdir: a training run's and an export's folders, their names and checks, checkpoints and loading.

`layout` names the files and checks them without TensorFlow or Keras; `rotation` deletes old checkpoints, never one
a reader holds; `checkpoints` writes, averages and loads the weights (`load_models`, the one loader). This file
imports neither Keras nor TensorFlow, so that `workdir.layout` stays light.
"""
