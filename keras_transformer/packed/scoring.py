"""Translating and scoring a packed workdir without TensorFlow: Keras on any backend and SentencePiece.

`keras-transformer pack` writes a workdir that trains on any Keras backend (`keras-transformer train-packed`,
`packed.training.train_arrays`). On that machine there may be no TensorFlow: `engines.packed.PackedTranslator`
decodes its model with the package's own searches (`keras_transformer.decoding`) and the SentencePiece vocabulary, and
`evaluate_arrays` scores it (`keras-transformer train-packed W --evaluate SOURCE REFERENCE`). The workdir also
serves every TensorFlow-side command unchanged: `keras-transformer evaluate --model W --average N ...`,
`export --workdir W`.

This module needs only keras, numpy, sentencepiece and the package itself: no TensorFlow.
"""

import os
import typing
from collections.abc import Iterable
from typing import Any

from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.packed import PackedTranslator
from keras_transformer.inference import evaluate


# ------------------------------------------------------------------ scoring without TensorFlow
def translate_lines(model: Any, lines: Iterable[str], source_processor: Any, target_processor: Any, *,
                    options: DecodeOptions | None = None, batch_size: int = 128, eos_id: int = 3, pad_id: int = 0,
                    bos_id: int = 2, **settings: Any) -> list[str]:
    """Decodes raw sentences with SentencePiece processors, on any Keras backend (no TensorFlow).

    Does what `Translator.translate_lines` does: sentences are tokenized (at most
    `max_length - 1` tokens, then eos), decoded longest first in batches whose
    width is rounded up to a multiple of 8 (few shapes), and detokenized;
    blank lines translate to "".

    Args:
        model: a `build_model` model.
        lines: source sentences (str).
        source_processor, target_processor: `sentencepiece.SentencePieceProcessor`s.
        options: a `keras_transformer.decoding.DecodeOptions` (default: the paper's beam search);
            `settings` (`beam_size=5`, ...) replace its fields. With sampling, a sentence's draws
            depend on the seed and the sentence, as in `Translator`.
        batch_size: sentences per batch.
        eos_id, pad_id, bos_id: special ids.

    Returns:
        The translations, in the order of `lines`.
    """
    return PackedTranslator(model, (source_processor, target_processor), _SpecialIds(pad_id, bos_id, eos_id),
                            options, **settings).translate_lines(lines, batch_size=batch_size)


class _SpecialIds(typing.NamedTuple):
    """The special ids `PackedTranslator` reads from a config."""

    pad_id: int
    bos_id: int
    eos_id: int


def evaluate_arrays(workdir: str | os.PathLike[str], checkpoint: str | os.PathLike[str] | None,
                    source: str | os.PathLike[str], reference: str | os.PathLike[str], *, average: int | None = None,
                    tokenized_reference: str | os.PathLike[str] | None = None, lang: str | None = None,
                    options: DecodeOptions | None = None, batch_size: int = 128,
                    output: str | os.PathLike[str] | None = None, **settings: Any) -> dict[str, Any]:
    """Translates `source` with a packed workdir's weights and scores it, without TensorFlow.

    `keras-transformer evaluate` for a machine that trains with `train_arrays`
    (a GPU machine with JAX): it reads the workdir as every loader does
    (`PackedTranslator.from_folder`) and gives that translator to
    `inference.evaluate`, which checks the files (line counts, the output's
    folder) before decoding and scores with sacreBLEU.
    Needs the `sentencepiece` package (and `sacremoses` for the Multi30k protocol).

    Args:
        workdir: a packed workdir (`keras-transformer pack`).
        checkpoint: a `.weights.h5` file (e.g. `averaged.weights.h5`); None: the last epoch checkpoint,
            or the mean of the last `average` ones.
        source, reference: text files, one sentence per line (plain or .gz).
        tokenized_reference, lang: optional `*.lc.norm.tok.*` references and
            the target language, for the published Multi30k protocol.
        options, **settings: the decoding (default: the workdir's model.yaml's options; `settings`
            replace fields, None values change nothing).
        batch_size: sentences decoded together.
        output: optional path to write the translations to.

    Returns:
        `inference.evaluate`'s scores (cased and lowercased sacreBLEU, the length ratio, and `bleu_multi30k`
        with `tokenized_reference`), rounded as it rounds them.
    """

    translator = PackedTranslator.from_folder(workdir, checkpoint, average, options, **settings)
    return evaluate(translator, source, reference, tokenized_reference=tokenized_reference, lang=lang,
                    batch_size=batch_size, output=output)

if __name__ == "__main__":  # the module's command line before there was one command
    raise SystemExit("python -m keras_transformer.arrays is now `keras-transformer train-packed` (the same arguments).")
