"""Training: the callbacks, the resumable backup, precision, and the one training loop, backend-neutral; and
training's TensorFlow helpers, apart: `distribute` (tf.distribute) and `tensorflow_callbacks`. `footprint`
checks a run's memory before it starts.

`trainer.loop.fit_experiment` is the loop every data source shares; the
user-facing `keras_transformer.training.train` (tf.data) and
`keras_transformer.packed.training.train_arrays` (packed arrays, any backend) hand it
their batches.
"""
