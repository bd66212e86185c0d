"""bench/backend_throughput.py: the figures it prints are consistent with each other and with the model it builds."""

import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_backend_throughput_prints_consistent_figures(monkeypatch, capsys):
    # In this process (already on TensorFlow, as the script is told to run here): no second TensorFlow import.
    # The matmul probe measures for 0.2 s instead of 2 s per phase; its figure is only checked to be positive.
    """Slow: runs the bench script's real training steps and matmul probe; its figures only exist after running."""
    import functools

    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import backend_throughput
    import keras
    assert keras.config.backend() == "tensorflow"
    monkeypatch.setattr(backend_throughput, "matmul_probe",
                        functools.partial(backend_throughput.matmul_probe, seconds=0.2))
    policy = keras.config.dtype_policy()
    try:
        backend_throughput.main(["--preset", "tiny", "--vocab-size", "500", "--batch-size", "8", "--length", "16",
                                 "--precision", "float32", "--steps", "3", "--warmup", "1", "--no-jit",
                                 "--peak-tflops", "1", "--probe-sizes", "256"])
    finally:
        keras.config.set_dtype_policy(policy)  # the script sets the policy it measures
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    probe, row = rows
    assert probe["probe"] == "matmul float32" and probe["tflops"] > 0
    from train_throughput import model_gflop_per_step

    import keras_transformer as kt
    config = kt.TransformerConfig.preset("tiny", vocab_size=500)
    assert row["parameters"] == kt.build_model(config).count_params()
    shape = dict(vocab_size=500, num_layers=config.num_layers, d_model=config.d_model, num_heads=config.num_heads,
                 d_ff=config.d_ff, batch_size=8, source_length=16, target_length=16)
    step = row["median_step_ms"] / 1e3
    assert row["model_tflops"] == pytest.approx(model_gflop_per_step(shape) / step / 1e3, abs=0.006)
    assert row["mfu_of_nominal"] == pytest.approx(row["model_tflops"], abs=0.001)  # --peak-tflops 1
    # 8 pairs of 10-16 non-pad target tokens each (lengths 0.6 L .. L), timed per step
    assert 8 * 9 / step <= row["target_tokens_per_s"] <= 8 * 16 / step * 1.01
