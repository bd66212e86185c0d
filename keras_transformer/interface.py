"""`TranslatorInterface`: what every engine's translator offers, whatever decodes underneath.

Three engines implement it:

| engine | class | needs |
| --- | --- | --- |
| TensorFlow (tensorflow-text tokenizers, XLA search, the SavedModel's graph) | `translation.Translator` | TensorFlow |
| CTranslate2 (its C++ search over a converted model) | `ctranslate2_translator.CTranslate2Translator` | ctranslate2, sentencepiece |
| packed arrays (Keras on any backend: JAX on a GPU machine) | `arrays.PackedTranslator` | Keras, sentencepiece |

`inference.load_translator` returns the TensorFlow or the CTranslate2 one for any
model folder; `arrays.PackedTranslator.from_folder` the packed one. Code written
against this interface (evaluation, plotting, back-translation scripts) runs on
each. Every method takes and returns Python values: `str` (or UTF-8 `bytes`) in,
`str` and `float` out, one result per input, in input order.

This module imports only the standard library.
"""

import abc


class TranslatorInterface(abc.ABC):
    """Translate, n-best, score and (where the engine has them) attention maps, from Python strings.

    Attributes:
        options: the `keras_transformer.decoding.DecodeOptions` the translator decodes with.
        engine: a short name for messages ("tensorflow", "ctranslate2", "packed").

    Example:

    >>> sorted(TranslatorInterface.__abstractmethods__)
    ['n_best_lines', 'score_lines', 'translate_lines']
    """

    engine = "translator"

    @abc.abstractmethod
    def translate_lines(self, lines, batch_size=64):
        """One translation per line (`str`), in order; a blank line translates to "".

        Raises:
            TypeError: `lines` is one `str` or `bytes` (give a list).
        """

    @abc.abstractmethod
    def n_best_lines(self, lines, batch_size=64):
        """Per line, `options.returned()` `(translation, score)` pairs, best first (sampling: that many draws).

        Scores are those `translate_lines` ranks by: log-probabilities, length-normalised with `options.alpha`
        for beam search. A blank line gives `("", 0.0)` pairs.
        """

    @abc.abstractmethod
    def score_lines(self, sources, targets, batch_size=64):
        """Forced decoding: per pair, log P(target | source) under the model, normalised as `n_best_lines` is.

        Raises:
            ValueError: `sources` and `targets` of different lengths (both counts named).
        """

    def with_options(self, options):
        """A translator of the same loaded model(s) that decodes with `options` (a `DecodeOptions`).

        The weights are shared, not loaded again: a server keeps one per set of options it is asked for.
        `self` when `options` are its own.

        Raises:
            NotImplementedError: the engine decodes only with the options it was built with (named).
            ConfigError: options the engine cannot decode with (named).
        """
        raise NotImplementedError(f"The {self.engine} engine decodes with the options it was built with; "
                                  "build another translator for other options.")

    def attention(self, sentence, translation=None):
        """The `attention_maps.AttentionMaps` of `sentence` and its translation (or the given `translation`).

        Raises:
            NotImplementedError: the engine exposes no attention weights (named).
        """
        raise NotImplementedError(f"The {self.engine} engine gives no attention maps; load the model with the "
                                  "TensorFlow engine (a training workdir or a SavedModel export) to draw them.")

    def __call__(self, sentences):
        """A `str` or a list of `str` in, the same out (`bytes` are taken as UTF-8)."""
        single = isinstance(sentences, (str, bytes))
        texts = self.translate_lines([sentences] if single else list(sentences))
        return texts[0] if single else texts


def check_pairs(caller, sources, targets):
    """`sources, targets` as lists, or a `ValueError` naming both counts (and a `TypeError` for one string).

    Example:

    >>> check_pairs("score_lines", ["a", "b"], ["x"])
    Traceback (most recent call last):
    ...
    ValueError: score_lines: 2 source(s) but 1 target(s); give one target per source.
    """
    for name, value in (("sources", sources), ("targets", targets)):
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{caller}: {name} must be a list of sentences, got one {type(value).__name__}.")
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(f"{caller}: {len(sources)} source(s) but {len(targets)} target(s); give one target per "
                         "source.")
    return sources, targets
