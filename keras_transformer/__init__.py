"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3.

The public API, nothing else. TensorFlow-specific parts (data pipeline,
distribution, export, command line) live in their own modules and are imported
from there.
"""

from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.layers import (DecoderLayer, EncoderLayer, MultiHeadAttention, MultiHeadSelfAttention,
                                      PositionalEncoding, PositionWiseFeedForward, SublayerConnection,
                                      TokenEmbedding, TransformerDecoder, TransformerEncoder,
                                      scaled_dot_product_attention, sinusoidal_position_encoding)
from keras_transformer.decoding import beam_search, greedy_decode, length_penalty, score
from keras_transformer.losses import LabelSmoothedCrossEntropy, RDropLoss
from keras_transformer.masking import PaddingMask, causal_mask, padding_mask
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.model import build_model, decode, encode
from keras_transformer.optimizers import make_optimizer
from keras_transformer.schedules import LinearCooldown, NoamSchedule

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "DecoderLayer", "EncoderLayer", "LabelSmoothedCrossEntropy", "LinearCooldown", "MaskedAccuracy",
    "MultiHeadAttention", "MultiHeadSelfAttention", "NoamSchedule", "PaddingMask", "PositionWiseFeedForward",
    "PositionalEncoding", "RDropLoss", "SublayerConnection", "TokenEmbedding", "TransformerConfig",
    "TransformerDecoder", "TransformerEncoder", "beam_search", "build_model", "causal_mask", "decode", "encode",
    "greedy_decode", "length_penalty", "make_optimizer", "padding_mask", "scaled_dot_product_attention", "score",
    "sinusoidal_position_encoding",
]
