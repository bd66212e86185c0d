"""Training, backend-neutral: the callbacks, the resumable backup, precision, and the one training loop.

`trainer.loop.fit_experiment` is the loop every data source shares; the
user-facing `keras_transformer.training.train` (tf.data) and
`keras_transformer.packed.training.train_arrays` (packed arrays, any backend) hand it
their batches.
"""
