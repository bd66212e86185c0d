"""Warm-up requests: an export compiles its search at load, before its first client.

With `jit_compile` (exports' default), a serving process compiles one XLA program per padded chunk shape
the first time a request needs it: seconds each for the shipped model (docs/serving.md). Every SavedModel
export therefore carries `assets.extra/tf_serving_warmup_requests`, in TensorFlow Serving's format: a
TFRecord file of `tensorflow.serving.PredictionLog` records, each a `PredictRequest` naming a signature
and holding its inputs as `TensorProto`s. TensorFlow Serving replays the file when it loads the model;
in Python, `warm_up(directory)` loads an export and replays it the same way.

Which shapes a request can hit (`engines.tensorflow_chunks.search_in_length_order`): a request of N
sentences is sorted by length and cut into chunks of `chunk_size` (8); every chunk but the last (the
longest sentences) has exactly `chunk_size` rows, and the last has N mod `chunk_size` of them (or
`chunk_size`), padded up to a power of two. Any chunk, full or not, can hold sentences of any length, so
every pair of a row bucket (`bucket_sizes(chunk_size)`: 1, 2, 4, 8) and a source-width bucket
(`bucket_sizes(max_length, SMALLEST_WIDTH_BUCKET)`: 16, 32, 64, 128 for the shipped model) occurs:
16 programs for `serving_default` and 16 for `n_best`, whose search returns more hypotheses and is
another program. The `PARALLEL_CHUNKS` lanes that decode chunks side by side call one compiled function,
so a program compiled in one lane serves the other; `translate_ids` calls the search `serving_default`
compiles (both measured by counting the entries of a persistent XLA cache). So there is one request per
(signature, rows, width): `rows` copies of a sentence whose tokenized length (tokens and end-of-sentence)
falls in that width bucket. `translate_ids` and `score` (not compiled with XLA) get one small request
each, for their first-call graph set-up. `sample` and `translate_prefix` are left out: their programs
(another strategy; prefix widths) compile on their first requests. An export without XLA (`--no-xla`)
has no shapes to compile: one small request per signature.

The records are protocol buffers written here field by field (`_message`): TensorFlow Serving's Python
package (`tensorflow-serving-api`) pins TensorFlow and is needed only by the test that reads the file back
with it. The tensors are TensorFlow's own `TensorProto`s.
"""

import os
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any, TypeAlias

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from keras_transformer.engines.tensorflow_graph import SMALLEST_WIDTH_BUCKET, bucket_sizes
from keras_transformer.files import atomic_write
from keras_transformer.workdir.layout import EXTRA_DIR

# One request: `(signature_name, inputs)`, the inputs `{name: numpy array}` (strings as `bytes`).
Request: TypeAlias = tuple[str, dict[str, Any]]

WARMUP_FILE = "tf_serving_warmup_requests"  # in assets.extra/: the name TensorFlow Serving looks for

# The words the warm-up sentences are made of, cycled: long sentences come from repeating them.
_WORDS = "A man in a blue shirt rides a bike down the street while two dogs play in the snow".split()


def warmup_requests(translator: Any) -> list[Request]:
    """The requests that compile everything a `translator`'s export can be asked (see the module docstring).

    Args:
        translator: the `Translator` an export serves (`export.TranslatorModule.translator`: `chunk_size` set).

    Returns:
        A list of `(signature_name, inputs)`, `inputs` a dict of numpy arrays (strings as `bytes`).

    Example:

    >>> requests = warmup_requests(translator)  # doctest: +SKIP
    >>> requests[0][0], requests[0][1]["inputs"].shape  # doctest: +SKIP
    ('serving_default', (1,))
    """
    short = np.array([b"A man rides a bike."])
    fixed = [("translate_ids", {"source_ids": translator.encode_sources(short).numpy()}),
             ("score", {"sources": short, "targets": np.array([b"Ein Mann."])})]
    if not translator.jit_compile:
        return [("serving_default", {"inputs": short}), ("n_best", {"inputs": short})] + fixed
    sentences = sentences_per_width(translator)
    requests = [(signature, {"inputs": np.array([sentence] * rows, dtype=object)})
                for signature in ("serving_default", "n_best")
                for rows in bucket_sizes(translator.chunk_size)
                for sentence in sentences.values()]
    return requests + fixed


def sentences_per_width(translator: Any) -> dict[int, bytes]:
    """`{width: sentence}`: per source-width bucket, a sentence (UTF-8 `bytes`) whose encoded length lands in it.

    Raises:
        ValueError: the tokenizer splits words so finely that no sentence of repeated words lands in a bucket.
    """
    widths = bucket_sizes(translator.max_source_length, SMALLEST_WIDTH_BUCKET)
    candidates = [" ".join(_WORDS[i % len(_WORDS)] for i in range(n)).encode() + b"."
                  for n in range(1, translator.max_source_length + 1)]
    pad = translator.source_tokenizer.pad_id
    lengths = np.sum(translator.encode_sources(tf.constant(candidates)).numpy() != pad, axis=1)  # eos included
    chosen = {}
    for lower, width in zip([0] + widths[:-1], widths):
        fitting = [i for i, length in enumerate(lengths) if lower < length <= width]
        if not fitting:
            raise ValueError(f"warmup_requests: no sentence of repeated words encodes to {lower + 1}-{width} "
                             f"positions with this tokenizer (lengths {sorted(set(lengths.tolist()))}).")
        chosen[width] = candidates[max(fitting, key=lambda i: lengths[i])]
    return chosen


# ------------------------------------------------------------- the protocol buffer wire format
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2): a string, bytes or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _message(*fields: bytes) -> bytes:
    return b"".join(fields)


def prediction_log(signature_name: str, inputs: dict[str, Any]) -> bytes:
    """The bytes of a `tensorflow.serving.PredictionLog` holding one `PredictLog` of a `PredictRequest`.

    Field numbers (tensorflow_serving/apis/prediction_log.proto, predict.proto, model.proto):
    `PredictionLog.predict_log` 6; `PredictLog.request` 1; `PredictRequest.model_spec` 1 and `inputs` 2 (a map:
    entries of `key` 1, `value` 2); `ModelSpec.signature_name` 3 (its `name` is left empty: the server warms
    the model it is loading, whatever its name).

    Args:
        signature_name: the signature to call.
        inputs: `{name: array}`, each written as `tf.make_tensor_proto(array)`.
    """
    model_spec = _message(_field(3, signature_name.encode()))
    entries = [_field(2, _message(_field(1, name.encode()),
                                  _field(2, tf.make_tensor_proto(value).SerializeToString())))
               for name, value in sorted(inputs.items())]
    request = _message(_field(1, model_spec), *entries)
    return _message(_field(6, _message(_field(1, request))))


def _fields(buffer: bytes) -> Iterator[tuple[int, Any]]:
    """`(number, value)` of a message's fields: bytes for length-delimited ones, ints for the others."""
    position = 0

    def varint() -> int:
        nonlocal position
        value, shift = 0, 0
        while True:
            byte = buffer[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while position < len(buffer):
        key = varint()
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            yield number, varint()
        elif wire_type == 2:
            size = varint()
            yield number, buffer[position:position + size]
            position += size
        elif wire_type in (1, 5):  # fixed 64 or 32 bits
            size = 8 if wire_type == 1 else 4
            yield number, int.from_bytes(buffer[position:position + size], "little")
            position += size
        else:
            raise ValueError(f"warm-up record: unsupported wire type {wire_type} (field {number}).")


def parse_prediction_log(record: bytes) -> Request:
    """`(signature_name, inputs)` of a `PredictionLog`'s `PredictRequest` (`prediction_log`'s inverse).

    Example:

    >>> name, inputs = parse_prediction_log(prediction_log("n_best", {"inputs": np.array([b"A dog."])}))
    >>> name, inputs["inputs"].tolist()
    ('n_best', [b'A dog.'])
    """
    log = dict(_fields(record))
    if 6 not in log:
        raise ValueError("warm-up record: not a PredictLog (only predict requests are written or replayed).")
    request = dict(_fields(log[6])).get(1, b"")
    signature_name, inputs = "serving_default", {}
    for number, value in _fields(request):
        if number == 1:  # model_spec
            signature_name = dict(_fields(value)).get(3, b"").decode() or signature_name
        elif number == 2:  # one entry of the inputs map
            entry = dict(_fields(value))
            tensor = tensor_pb2.TensorProto()
            tensor.ParseFromString(entry.get(2, b""))
            inputs[entry.get(1, b"").decode()] = tf.make_ndarray(tensor)
    return signature_name, inputs


# ------------------------------------------------------------------------------------- the file
def write_warmup_file(directory: str | os.PathLike[str], requests: Iterable[Request]) -> pathlib.Path:
    """Writes `requests` (`warmup_requests`) as `directory/assets.extra/tf_serving_warmup_requests`.

    Returns:
        The file's path.
    """
    path = pathlib.Path(directory) / EXTRA_DIR / WARMUP_FILE

    def write(temporary: str | os.PathLike[str]) -> None:
        with tf.io.TFRecordWriter(temporary) as writer:
            for signature_name, inputs in requests:
                writer.write(prediction_log(signature_name, inputs))

    return atomic_write(path, write)


def read_warmup_file(directory: str | os.PathLike[str]) -> list[Request]:
    """`(signature_name, inputs)` of each record of an export's warm-up file, in file order.

    Raises:
        FileNotFoundError: the export has none (written before exports carried one: export it again).
    """
    path = pathlib.Path(directory) / EXTRA_DIR / WARMUP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this export was written before exports carried warm-up "
                                "requests; export it again (keras-transformer export --overwrite ...).")
    return [parse_prediction_log(record.numpy()) for record in tf.data.TFRecordDataset(os.fspath(path))]


def warm_up(directory: str | os.PathLike[str], loaded: Any = None) -> Any:
    """Loads an export (unless `loaded` is given) and replays its warm-up requests through its signatures.

    What TensorFlow Serving does at load, for a Python server: afterwards a request of any size meets
    compiled programs only (see the module docstring). For the shipped EN-DE model this takes minutes on a
    2-core CPU (32 XLA programs); do it before taking traffic.

    Args:
        directory: the export folder.
        loaded: the export already loaded by `tf.saved_model.load(directory)` (default: loaded here).

    Returns:
        The loaded SavedModel, warmed.

    Example:

    >>> translator = warm_up("saved_models/multi30k_en_de")  # doctest: +SKIP
    >>> translator.signatures["serving_default"](tf.constant(["A man rides a bike."]))  # doctest: +SKIP
    """
    requests = read_warmup_file(directory)
    loaded = tf.saved_model.load(os.fspath(directory)) if loaded is None else loaded
    for signature_name, inputs in requests:
        loaded.signatures[signature_name](**{name: tf.constant(value) for name, value in inputs.items()})
    return loaded
