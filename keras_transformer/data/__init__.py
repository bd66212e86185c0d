"""Data: synthetic tasks, parallel-corpus reading, tokenizers and the tf.data pipeline."""
