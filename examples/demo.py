"""`make demo`: the package's main job on shipped defaults, in about a minute on 2 CPU cores.

1. If an exported translator is shipped in saved_models/multi30k_en_de, translate a few English
   sentences with it (beam search inside the SavedModel).
2. Train the tiny preset on a synthetic task (reverse a sequence of tokens) with plain `model.fit`
   and the paper's loss, schedule and optimizer, then decode held-out sequences greedily and with
   beam search.
"""

import os
import pathlib
import sys
import time

from keras_transformer.cli import import_tensorflow_quietly  # noqa: E402

if os.environ.get("KERAS_TRANSFORMER_TF_LOGS", "0") in ("", "0"):
    import_tensorflow_quietly()  # as the keras-transformer command does: no C++ log lines unless asked

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.data.synthetic import make_arrays, synthetic_pairs  # noqa: E402
from keras_transformer.decoding import beam_search, greedy_decode  # noqa: E402
from keras_transformer.experiment import TrainingSection  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "saved_models" / "multi30k_en_de"
SENTENCES = ["A man rides a bike.", "Two dogs are playing in the snow.",
             "A woman in a red dress is singing on a stage."]


def translate_with_shipped_model():
    if not (SHIPPED / "saved_model.pb").exists():
        print(f"(no exported model in {SHIPPED.relative_to(ROOT)} yet; skipping the translation part)\n")
        return
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    print(f"== Translating with the shipped model {SHIPPED.relative_to(ROOT)}")
    start = time.time()
    translator = tf.saved_model.load(str(SHIPPED))
    outputs = translator.signatures["serving_default"](tf.constant(SENTENCES))
    for source, target in zip(SENTENCES, outputs["translation"].numpy()):
        print(f"  EN: {source}\n  DE: {target.decode('utf-8')}")
    print(f"  ({time.time() - start:.1f} s including loading)\n")


def train_tiny_model(task="reverse", epochs=10):
    print(f"== Training the tiny preset on the synthetic '{task}' task")
    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.preset("tiny", vocab_size=16)
    training = TrainingSection(warmup_steps=200, learning_rate_scale=2.0)
    inputs, labels = make_arrays(*synthetic_pairs(task, 6000, vocab_size=16, max_length=8, seed=1))
    model = kt.build_model(config)
    model.compile(optimizer=kt.make_optimizer(config, training),
                  loss=kt.LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=config.pad_id),
                  metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    start = time.time()
    model.fit(inputs, labels, batch_size=64, epochs=epochs, verbose=2)
    print(f"  trained {model.count_params():,} parameters in {time.time() - start:.0f} s\n")
    return config, model


def decode_examples(config, model, task="reverse"):
    sources, targets = synthetic_pairs(task, 200, vocab_size=16, max_length=8, seed=7)
    inputs, _ = make_arrays(sources, targets)
    greedy, _ = greedy_decode(model, inputs["source"], max_extra=2)
    beam, _ = beam_search(model, inputs["source"], beam_size=4, alpha=0.6, max_extra=2)

    def strip(row):
        row = [int(t) for t in row]
        return row[: row.index(config.eos_id)] if config.eos_id in row else row

    greedy = [strip(row) for row in keras.ops.convert_to_numpy(greedy)]
    beam = [strip(row) for row in keras.ops.convert_to_numpy(np.asarray(beam)).reshape(len(sources), -1)]
    print("== Decoding held-out sequences")
    for source, output in list(zip(sources, greedy))[:4]:
        print(f"  source {source}\n  greedy {output}")
    exact_greedy = np.mean([g == t for g, t in zip(greedy, targets)])
    exact_beam = np.mean([b == t for b, t in zip(beam, targets)])
    print(f"  exact-match on 200 held-out sequences: greedy {exact_greedy:.1%}, beam 4 {exact_beam:.1%}")
    return exact_greedy


def main():
    translate_with_shipped_model()
    config, model = train_tiny_model()
    exact = decode_examples(config, model)
    return 0 if exact > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
