"""The packed path: a workdir of packed token ids that trains and is scored on any Keras backend, no TensorFlow.

`data` writes and reads the packed ids (`keras-transformer pack`) and batches them; `training` trains from them
(`keras-transformer train-packed`); `scoring` translates and scores such a workdir. Its engine is
`keras_transformer.engines.packed`, beside the other engines.
"""
