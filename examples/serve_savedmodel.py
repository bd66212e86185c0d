"""Translate stdin line by line with an exported model, importing only TensorFlow and tensorflow-text.

    python examples/serve_savedmodel.py saved_models/multi30k_en_de < sentences.en > sentences.de

This is the serving path: no keras_transformer import, no Keras model code. The SavedModel holds the
tokenizer, the beam search and the detokenizer; tensorflow_text registers the SentencePiece ops it uses.
Lines are translated in batches (`--batch-size`); empty lines give empty translations.
"""

import argparse
import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="export directory (holds saved_model.pb)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per call (default 32)")
    parser.add_argument("--scores", action="store_true", help="print 'score<TAB>translation'")
    args = parser.parse_args(argv)

    serve = tf.saved_model.load(args.model).signatures["serving_default"]
    batch = []

    def flush():
        if not batch:
            return
        outputs = serve(tf.constant(batch))
        for text, score in zip(outputs["translation"].numpy(), outputs["score"].numpy()):
            line = text.decode("utf-8")
            print(f"{score:.4f}\t{line}" if args.scores else line, flush=True)
        batch.clear()

    for raw in sys.stdin.buffer:  # bytes: invalid UTF-8 reaches the model, which replaces it
        batch.append(raw.rstrip(b"\r\n"))
        if len(batch) >= args.batch_size:
            flush()
    flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
