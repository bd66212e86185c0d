"""The signatures `keras-transformer serve` answers for, as TensorFlow Serving describes them: the SavedModel
export's, served by every engine."""

from typing import Any

VERSION = "1"  # the one version a TensorFlow Serving client sees: a model folder holds one model


def _tensor(dtype: str, *dims: int) -> dict[str, Any]:
    return {"dtype": dtype, "tensor_shape": {"dim": [{"size": str(size), "name": ""} for size in dims],
                                             "unknown_rank": False}}


# The SavedModel export's signatures (keras_transformer/export.py), served by every engine: inputs (batched ones
# first: `[-1]`; scalars `[]`) and outputs. `translate_ids` (token ids in) is the export's only one left out.
SIGNATURES = {
    "serving_default": {"inputs": {"inputs": _tensor("DT_STRING", -1)},
                        "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1)}},
    "n_best": {"inputs": {"inputs": _tensor("DT_STRING", -1)},
               "outputs": {"translations": _tensor("DT_STRING", -1, -1), "scores": _tensor("DT_FLOAT", -1, -1)}},
    "sample": {"inputs": {"inputs": _tensor("DT_STRING", -1), "seed": _tensor("DT_INT32"),
                          "temperature": _tensor("DT_FLOAT"), "top_k": _tensor("DT_INT32"),
                          "top_p": _tensor("DT_FLOAT")},
               "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1)}},
    "score": {"inputs": {"sources": _tensor("DT_STRING", -1), "targets": _tensor("DT_STRING", -1)},
              "outputs": {"score": _tensor("DT_FLOAT", -1)}},
    "translate_prefix": {"inputs": {"inputs": _tensor("DT_STRING", -1), "target_prefix": _tensor("DT_STRING", -1)},
                         "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1)}},
    "translate_constrained": {"inputs": {"inputs": _tensor("DT_STRING", -1),
                                         "constraints": _tensor("DT_STRING", -1, -1),
                                         "banned": _tensor("DT_STRING", -1, -1)},
                              "outputs": {"translation": _tensor("DT_STRING", -1), "score": _tensor("DT_FLOAT", -1),
                                          "met": _tensor("DT_BOOL", -1, -1)}},
}


def batched_inputs(signature: str) -> list[str]:
    """The inputs of `signature` that hold one value per row (shape `[-1]`), in order.

    Example:

    >>> batched_inputs("sample"), batched_inputs("score")
    (['inputs'], ['sources', 'targets'])
    """
    return [name for name, spec in SIGNATURES[signature]["inputs"].items() if spec["tensor_shape"]["dim"]]


def row_inputs(signature: str) -> list[str]:
    """The inputs of `signature` that hold a list of strings per row (shape `[-1, -1]`).

    Example:

    >>> row_inputs("translate_constrained"), row_inputs("serving_default")
    (['constraints', 'banned'], [])
    """
    return [name for name, spec in SIGNATURES[signature]["inputs"].items() if len(spec["tensor_shape"]["dim"]) == 2]


def signature_metadata(name: str) -> dict[str, Any]:
    """What TensorFlow Serving's `GET /v1/models/NAME/metadata` answers for the served signatures.

    Example:

    >>> signature_metadata("en_de")["metadata"]["signature_def"]["signature_def"]["score"]["outputs"]["score"]["dtype"]
    'DT_FLOAT'
    """
    defs = {}
    for signature, spec in SIGNATURES.items():
        def info(kind: str) -> dict[str, Any]:
            return {key: {**tensor, "name": f"{signature}_{key}:0"} for key, tensor in spec[kind].items()}
        defs[signature] = {"inputs": info("inputs"), "outputs": info("outputs"),
                           "method_name": "tensorflow/serving/predict"}
    return {"model_spec": {"name": name, "signature_name": "", "version": VERSION},
            "metadata": {"signature_def": {"signature_def": defs}}}
