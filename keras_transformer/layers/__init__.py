"""The Transformer's layers, one concern per module."""

from keras_transformer.layers.attention import MultiHeadAttention, MultiHeadSelfAttention, scaled_dot_product_attention
from keras_transformer.layers.decoder import DecoderLayer, TransformerDecoder
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.encoder import EncoderLayer, TransformerEncoder
from keras_transformer.layers.feed_forward import PositionWiseFeedForward
from keras_transformer.layers.normalization import LayerNormalization
from keras_transformer.layers.output_bias import OutputBias
from keras_transformer.layers.position import PositionalEncoding, sinusoidal_position_encoding
from keras_transformer.layers.sublayer import SublayerConnection

__all__ = [
    "DecoderLayer", "EncoderLayer", "LayerNormalization", "MultiHeadAttention", "MultiHeadSelfAttention", "OutputBias",
    "PositionWiseFeedForward", "PositionalEncoding", "SublayerConnection", "TokenEmbedding", "TransformerDecoder",
    "TransformerEncoder",
    "scaled_dot_product_attention", "sinusoidal_position_encoding",
]
