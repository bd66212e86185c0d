"""bench/backend_throughput.py: the figures it prints are consistent with each other and with the model it builds."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_backend_throughput_prints_consistent_figures():
    env = dict(os.environ, PYTHONPATH=str(REPO), KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "backend_throughput.py", "--preset", "tiny", "--vocab-size", "500",
                           "--batch-size", "8", "--length", "16", "--precision", "float32", "--steps", "3",
                           "--warmup", "1", "--no-jit", "--peak-tflops", "1", "--probe-sizes", "256"],
                          cwd=REPO / "bench", env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    probe, row = rows
    assert probe["probe"] == "matmul float32" and probe["tflops"] > 0
    sys.path.insert(0, str(REPO / "bench"))
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
