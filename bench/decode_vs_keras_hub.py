"""Cached beam search: ours against keras-hub's BeamSampler driving its TransformerDecoder with a cache.

Both sides: the training bench's model size (3+3 layers, d_model 256, 4 heads, d_ff 1024, 8,000-id
vocabulary, randomly initialised, float32), beam 4, the same source batches (lengths of the first
`--sentences` Multi30k validation sentences, sorted and cut into batches of `--batch-size`, random ids,
as bench/decode_throughput.py does), each sentence decoded up to its source length (`--max-extra 0`):
a random model never emits eos, so every hypothesis runs to that limit.

* ours: `keras_transformer.decoding.beam_search(model, source, beam_size=4, alpha=0.6)`: the encoder
  once, the cross-attention keys/values once, one decoder step per token with the self-attention
  cache, GNMT length penalty, finished hypotheses kept apart, a per-sentence length limit, and the
  loop stops when every sentence is done.
* keras_hub: the keras-hub seq2seq recipe (what `BartSeq2SeqLM.generate` does) written for the
  training bench's keras-hub model (`TokenAndPositionEmbedding`, `TransformerEncoder`,
  `TransformerDecoder`, Dense head): encode once, project each decoder layer's cross-attention
  keys/values once (with the layer's own projections, what its `cross_attention_cache_update_index=0`
  call computes), then `keras_hub.samplers.BeamSampler(num_beams=4)` calls a `next()` that
  runs one token through the decoders with `self_attention_cache` / `cross_attention_cache`. The
  sampler has no length penalty and one length limit per batch (the prompt width = the longest
  sentence's limit), so it does at most as much search bookkeeping as ours.

Each search runs inside `tf.function` (graph) and `tf.function(jit_compile=True)` (XLA), warmed up
on every batch shape first; then ours and keras-hub alternate batch by batch, `--repeats` passes.
Figures: sentences/s and output tokens/s (best hypothesis, eos included, bos excluded), and the
median of the per-batch paired time ratios (the figure to quote on a shared machine).

Usage:

    python bench/decode_vs_keras_hub.py                         # 64 sentences, 2 passes
    python bench/decode_vs_keras_hub.py --sentences 128 --repeats 3 --modes graph,xla
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_throughput  # noqa: E402  (Multi30k lengths and batches, shared with the decoding bench)
import train_throughput  # noqa: E402  (the model sizes and the keras-hub model, shared with the training bench)

from keras_transformer import decoding  # noqa: E402

PAD, BOS, EOS = 0, 2, 3


def build_models():
    """Our model and the training bench's keras-hub model, dropout off (decoding is inference)."""
    import keras_transformer as kt
    config = train_throughput.CONFIG
    ours = kt.build_model(kt.TransformerConfig(vocab_size=config["vocab_size"], num_layers=config["num_layers"],
                                               d_model=config["d_model"], num_heads=config["num_heads"],
                                               d_ff=config["d_ff"], dropout=0.0))
    original = dict(config)
    config.update(dropout=0.0, attention_dropout=0.0)
    try:
        hub = train_throughput.build_keras_hub(jit_compile=False)
    finally:
        config.clear()
        config.update(original)
    return ours, hub


def ours_search(model, beam_size, max_extra):
    def run(source):
        tokens, _ = decoding.beam_search(model, source, beam_size=beam_size, alpha=0.6, max_extra=max_extra)
        return tokens[:, 0]  # (B, T) best hypothesis, eos then pads
    return run


def keras_hub_search(model, beam_size, max_extra):
    """keras-hub's BeamSampler over the keras-hub layers with their key/value caches."""
    import keras_hub
    config = train_throughput.CONFIG
    layers = config["num_layers"]
    heads, head_dim = config["num_heads"], config["d_model"] // config["num_heads"]
    embedding, head = model.get_layer("embedding"), model.get_layer("head")
    encoders = [model.get_layer(f"encoder_{i}") for i in range(layers)]
    decoders = [model.get_layer(f"decoder_{i}") for i in range(layers)]
    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size)

    def decoder_step(token, position, self_cache, memory, padding, cross_cache):
        """One token `(B, 1)` through the decoders; caches `(B, N, 2, T or S, H, d)`."""
        x = embedding(token, start_index=position)
        self_caches = []
        for i, decoder in enumerate(decoders):
            x, layer_self, _ = decoder(
                decoder_sequence=x, encoder_sequence=memory, encoder_padding_mask=padding,
                self_attention_cache=self_cache[:, i], self_attention_cache_update_index=position,
                cross_attention_cache=cross_cache[:, i], cross_attention_cache_update_index=None)
            self_caches.append(layer_self)
        return head(x)[:, 0], ops.stack(self_caches, axis=1)  # (B, V), (B, N, 2, T, H, d)

    def cross_attention_cache(memory):
        """What each layer's cross-attention computes for `cross_attention_cache_update_index=0`, once."""
        caches = []
        for decoder in decoders:
            attention = decoder._cross_attention_layer
            caches.append(ops.stack([attention._key_dense(memory), attention._value_dense(memory)], axis=1))
        return ops.stack(caches, axis=1)  # (B, N, 2, S, H, d)

    def run(source):
        batch, source_length = ops.shape(source)[0], ops.shape(source)[1]
        padding = ops.not_equal(source, PAD)
        memory = embedding(source)
        for encoder in encoders:
            memory = encoder(memory, padding_mask=padding)  # (B, S, D)
        # The beams of a sentence share its encoder output: repeat it once (the sampler's own row order)
        # rather than pass it through the sampler's cache, which would gather it at every step.
        cross_cache = ops.repeat(cross_attention_cache(memory), beam_size, axis=0)  # (B*K, N, 2, S, H, d)
        memory, padding = ops.repeat(memory, beam_size, axis=0), ops.repeat(padding, beam_size, axis=0)

        def next_fn(prompt, self_cache, index):
            token = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])  # the newest token
            logits, self_cache = decoder_step(token, index - 1, self_cache, memory, padding, cross_cache)
            return logits, None, self_cache

        # One length limit per batch, the longest sentence's: the prompt is bos + that many outputs.
        width = source_length + max_extra + 1
        prompt = ops.where(ops.arange(width)[None, :] == 0, BOS, PAD) * ops.ones((batch, 1), "int32")
        given = ops.arange(width)[None, :] < ops.ones((batch, 1), "int32")  # only bos is given
        self_cache = ops.zeros((batch, layers, 2, width, heads, head_dim))
        tokens = sampler(next=next_fn, prompt=prompt, cache=self_cache, index=1, mask=given,
                         stop_token_ids=[EOS], model=model)[:, 1:]  # (B, T) without bos
        # Count only what ours may produce: each sentence's own limit (its length + max_extra).
        limits = ops.sum(ops.cast(ops.not_equal(source, PAD), "int32"), axis=1, keepdims=True) + max_extra
        return ops.where(ops.arange(width - 1)[None, :] < limits, tokens, PAD)

    return run


def compiled(fn, mode):
    return tf.function(fn, jit_compile=(mode == "xla"), reduce_retracing=False)


def count_tokens(tokens):
    tokens = np.asarray(tokens)
    # up to and including the first eos, else every non-pad position
    total = 0
    for row in tokens:
        eos = np.flatnonzero(row == EOS)
        total += int(eos[0]) + 1 if eos.size else int(np.count_nonzero(row != PAD))
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-extra", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="graph,xla")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    ours_model, hub_model = build_models()
    batches = decode_throughput.make_batches(decode_throughput.multi30k_lengths(args.sentences), args.batch_size,
                                             train_throughput.CONFIG["vocab_size"])
    sentences = sum(len(batch) for batch in batches)
    print(json.dumps({"sentences": sentences, "batches": len(batches), "beam_size": args.beam_size,
                      "max_extra": args.max_extra, "mean_source_length": round(float(np.mean(
                          [np.count_nonzero(row) for batch in batches for row in batch])), 1)}), flush=True)
    for mode in args.modes.split(","):
        searches = {"ours": compiled(ours_search(ours_model, args.beam_size, args.max_extra), mode),
                    "keras_hub": compiled(keras_hub_search(hub_model, args.beam_size, args.max_extra), mode)}
        tokens = {}
        for name, fn in searches.items():  # warm-up: trace / compile every batch shape
            tokens[name] = sum(count_tokens(fn(tf.constant(batch))) for batch in batches)
        times = {name: [] for name in searches}
        for repeat in range(args.repeats):
            for i, batch in enumerate(batches):
                order = list(searches) if (repeat + i) % 2 == 0 else list(searches)[::-1]
                for name in order:
                    start = time.perf_counter()
                    np.asarray(searches[name](tf.constant(batch)))
                    times[name].append(time.perf_counter() - start)
        for name in searches:
            total = sum(times[name])
            print(json.dumps({"impl": name, "mode": mode, "sentences_per_s": round(sentences * args.repeats / total, 2),
                              "tokens_per_s": round(tokens[name] * args.repeats / total, 1),
                              "output_tokens_per_pass": tokens[name],
                              "median_batch_s": round(statistics.median(times[name]), 4)}), flush=True)
        ratio = statistics.median([h / o for o, h in zip(times["ours"], times["keras_hub"])])
        print(json.dumps({"mode": mode, "paired_median_speedup": {"ours/keras_hub": round(ratio, 3)},
                          "meaning": "median over batches of time(keras_hub) / time(ours)"}), flush=True)


if __name__ == "__main__":
    main()
