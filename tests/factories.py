"""Builders of the small things many tests need: one place instead of one copy per test file.

Reach for these (and the session fixtures in `conftest.py`) before writing a new builder:

- `TINY_EXPERIMENT`, `SMALL_MODEL` and `SMALL_RUN`: the tiny copy-task recipe and `--set` overrides that make a
  `train` call take about 3 s (one layer each side, examples of one length, 64 of them, one epoch, no TensorBoard).
- `tiny_config(**overrides)`: a `TransformerConfig` of the tiny preset with one layer each side.
- `seeded_weights(model, seed)`: weights of peaked, reproducible noise instead of training.
- `make_workdir(root, config, ...)`: a workdir as `train` leaves it (model.yaml, epoch checkpoints, data/vocab),
  without training.
- `backup_weights(workdir, ema_decay, ...)`: the raw weights in a workdir's latest backup and their moving averages.
- `sigterm_at_update(entry, argv, update, folder)`: a training process sent SIGTERM at a known update.
- `sampling_uniform(seed, key, sample, step)`: numpy's copy of the draws `decoding.sample` makes, for checking
  them on every backend.
- `ExportLockHolder(out)`: another process holding an export folder's writer lock, for `with`.
- `ServeProcess.start(arguments, log)`: a real `keras-transformer serve` process, ready, driven over HTTP.
- `word_vocabulary(directory, 32)`: a SentencePiece word vocabulary whose ids are those of conftest's copy task, so
  that `trained_copy_model` translates real strings ("w5 w6 w7"); `random_sentences(count, seed)`: inputs for it;
  `copy_accuracy(outputs, sentences)`: its word accuracy.
- `DOCUMENT`, `DOCUMENT_SENTENCES` and `document_layout(translations)`: a plain-text document of two paragraphs and
  an indented list, its five sentences, and the document those sentences' translations make in its layout.
- `check_terms(translator, ...)`: constraints, a glossary and a banned word on an engine's text output (imported
  Marian and NLLB models).
- `import_references(root, shapes, build, model_class)`: published-family reference checkpoints built by a test
  module's `build(folder, **shape)`, each imported, with transformers' model and tokenizer loaded from it;
  `load_imported(workdir)`: the imported model, config and tokenizers; `lines_of(name, count)`: the first
  lines of a Multi30k file; `until_eos(tokens, config)`: a search's row cut after its end token;
  `end_some_translations(model, sources, generate)`: a random BART-like reference made to end some translations.
"""

import gzip
import pathlib
import re

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
TINY_EXPERIMENT = REPO / "configs" / "tiny_copy.yaml"

# The model and examples of a cheap `train` call on TINY_EXPERIMENT. One layer per side halves the time Keras
# spends tracing the training step (about 2.3 s a trace with two layers); copy examples of one length give every
# batch one shape, so the step is traced once instead of twice (Keras traces again, with a relaxed shape, when
# the second batch is longer). The loop's behaviour depends on neither.
SMALL_MODEL = ["model.num_layers=1", "data.min_length=8", "data.max_length=8"]
# SMALL_MODEL on two batches, one epoch, quietly: a `train` call of about 3 s.
SMALL_RUN = SMALL_MODEL + ["data.train_examples=64", "data.val_examples=32", "data.batch_size=32",
                           "training.epochs=1", "training.verbose=0", "training.tensorboard=false"]


# Two paragraphs (two sentences, then one) and a two-item indented list; one sentence is German, so that even a
# model trained on one language gives sentences of different translations.
DOCUMENT_SENTENCES = ["A man rides a bike.", "Two dogs play in the snow near a house.", "A girl.",
                      "Zwei Männer sitzen auf einer Bank!", "A woman sings on a stage."]


def document_layout(t):
    """`DOCUMENT`'s layout with its five sentences replaced by `t`'s (`document_layout(DOCUMENT_SENTENCES)` is
    `DOCUMENT`)."""
    return f"{t[0]} {t[1]}\n\n{t[2]}\n\n  - {t[3]}\n  - {t[4]}\n"


DOCUMENT = document_layout(DOCUMENT_SENTENCES)


def tiny_config(**overrides):
    """The tiny preset with one encoder and one decoder layer (and `overrides`)."""
    from keras_transformer.config import TransformerConfig

    return TransformerConfig.preset("tiny", **{"num_layers": 1, **overrides})


def seeded_weights(model, seed):
    """Replaces every weight of `model` by normal noise drawn from `seed`, and returns the model.

    Weights of scale 1 give peaked distributions, not the near-uniform ones of a fresh model: no near-ties
    between hypotheses for float rounding to break differently in two graphs, and no training step to trace.
    """
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def backup_weights(workdir, ema_decay, gradient_accumulation_steps=None):
    """`(raw weights, their moving averages)` as numpy arrays, from `workdir/backup/latest.weights.h5` of a run
    with `training.ema_decay` (and `training.gradient_accumulation_steps`, whose accumulators the optimizer state
    holds too)."""
    import keras

    from keras_transformer.config import TransformerConfig
    from keras_transformer.experiment import TrainingSection
    from keras_transformer.model import build_model
    from keras_transformer.runtime.keras_internals import moving_average_pairs
    from keras_transformer.trainer.backup import load_backup_weights
    from keras_transformer.trainer.optimizers import make_optimizer

    config = TransformerConfig.from_yaml(pathlib.Path(workdir) / "model.yaml")
    model = build_model(config)
    settings = TrainingSection(ema_decay=ema_decay, gradient_accumulation_steps=gradient_accumulation_steps or 1)
    model.compile(optimizer=make_optimizer(config, settings))
    model.optimizer.build(model.trainable_variables)
    load_backup_weights(model, pathlib.Path(workdir) / "backup" / "latest.weights.h5")
    return ([keras.ops.convert_to_numpy(v) for v in model.trainable_variables],
            [keras.ops.convert_to_numpy(average) for _, average in moving_average_pairs(model.optimizer)])


def make_workdir(root, config, *, models=None, epochs=(1,), tokenizers=None, vocab_files=None, seed=None):
    """Writes a training workdir as `train` leaves it, without training, and returns its models.

    Args:
        root: the workdir to create (its parents are created too).
        config: the `TransformerConfig` written as `model.yaml`.
        models: the models whose weights become the checkpoints, one per epoch; by default a freshly built
            model per epoch (each with its own initial weights).
        epochs: the epoch numbers of the checkpoints `checkpoints/ckpt-NNNN.weights.h5`.
        tokenizers: `(source, target)` tokenizers saved into `data/vocab` as `train` saves them.
        vocab_files: `{relative path: bytes}` written under `data/vocab` instead (files that only need to exist).
        seed: if given, each model's weights are replaced by normal noise drawn from `seed + index`, so two
            checkpoints differ by more than their initialisation.

    Returns:
        The list of models saved, one per epoch.
    """
    from keras_transformer.model import build_model
    from keras_transformer.workdir import checkpoints as workdir

    root = pathlib.Path(root)
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    config.save_yaml(root / "model.yaml")
    models = list(models) if models is not None else [build_model(config) for _ in epochs]
    if len(models) != len(epochs):
        raise ValueError(f"{len(models)} models for {len(epochs)} epochs")
    for index, (model, epoch) in enumerate(zip(models, epochs)):
        if seed is not None:
            seeded_weights(model, seed + index)
        workdir.save_weights(model, root / "checkpoints" / f"ckpt-{epoch:04d}.weights.h5")
    if tokenizers is not None:
        from keras_transformer.data.tokenizers import save_tokenizers

        save_tokenizers(root / "data" / "vocab", *tokenizers)
    for name, content in (vocab_files or {}).items():
        path = root / "data" / "vocab" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return models


def word_vocabulary(directory, size):
    """A SentencePiece word model whose piece i is "▁w{i}" (i >= 4), saved as `save_tokenizers` saves one.

    With size 32 its ids are those of conftest's copy task and word tokenizer, so
    the copy model translates real strings through SentencePiece.
    """
    import io

    import sentencepiece

    from keras_transformer.data.tokenizers import SubwordTokenizer

    sentences = [f"w{i}" for i in range(4, size) for _ in range(3 * (size - i))]  # frequency falls with i
    writer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=writer, vocab_size=size, model_type="word",
        pad_id=0, unk_id=1, bos_id=2, eos_id=3, normalization_rule_name="identity", minloglevel=2)
    tokenizer = SubwordTokenizer(writer.getvalue(), model_type="unigram")
    tokenizer.save(directory)
    return tokenizer


def random_sentences(count, seed, vocab_size=32, max_length=10):
    """`count` sentences of 1 to `max_length` words "w4".."w{vocab_size - 1}", drawn from `seed`."""
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(4, vocab_size, size=rng.integers(1, max_length + 1)))
            for _ in range(count)]


TERM_LINES = ["A man.", "Dogs play in the snow.", "A girl.", "A man sees a man."]


def occurrences(text, term):
    """How often `term` starts a word of `text` (a constraint's tokens open a word; the model may glue more
    pieces to its end: docs/decoding.md's subword caveat)."""
    return len(re.findall(r"(?<!\w)" + re.escape(term), text))


def runs(text):
    """The runs of letters of `text`, its `<...>` tokens left out: its words, garbage or not."""
    return re.findall(r"[^\W\d_]+", re.sub(r"<[^>]*>", " ", text))


def check_terms(translator, never, glossary, **forced):
    """Checks terms on `translator` over `TERM_LINES` on its text output (random weights give garbage, yet every
    term must hold): a one-word constraint; a two-word and a non-ASCII one in one sentence; `never`, a term no
    plain output holds; the glossary's "man" twice in one source, so its term twice in the output; a word of the
    plain outputs, banned, in none; each line's output the same in another batch and alone. `forced`:
    `target_lang`. Returns the constrained outputs."""
    plain = translator.translate_lines(TERM_LINES, **forced)
    assert not any(occurrences(text, never) for text in plain), plain
    letters = [runs(text) for text in plain]
    banned = max({word for words in letters for word in words if len(translator.term_tokens(word)) <= 8},
                 key=lambda word: (sum(words.count(word) for words in letters), word))
    constraints = [["Mann"], ["im Schnee", "Häuser"], [never], []]
    terms = dict(glossary=glossary, banned=[banned], **forced)
    found = translator.translate_terms(TERM_LINES, constraints=constraints, **terms)
    outputs = [hypotheses[0]["translation"] for hypotheses in found]
    wanted = [{"Mann": 2}, {"im Schnee": 1, "Häuser": 1}, {never: 1}, {"Mann": 2}]  # "man" in line 1 too
    for output, hypotheses, counts in zip(outputs, found, wanted):
        assert hypotheses[0]["unmet"] == [] and all(occurrences(output, term) >= count
                                                    for term, count in counts.items()), (output, counts)
    assert not any(banned in runs(text) for text in outputs), (banned, outputs)
    other = translator.translate_lines([TERM_LINES[3], TERM_LINES[1]], constraints=[[], constraints[1]], **terms)
    alone = translator.translate_lines(TERM_LINES[2:3], constraints=constraints[2:3], **terms)
    assert other + alone == [outputs[3], outputs[1], outputs[2]]
    return outputs


def copy_accuracy(outputs, sentences):
    """The copy task's word accuracy in percent: words output at their source word's place, over the longer of the
    two (a missing or extra word counts as wrong)."""
    scores = []
    for output, source in zip(outputs, sentences):
        out, src = output.split(), source.split()
        scores.append(sum(a == b for a, b in zip(out, src)) / max(len(out), len(src), 1))
    return 100 * float(np.mean(scores))


def sampling_uniform(seed, key, sample, step):
    """numpy's copy of `decoding.sampling.uniform` (broadcasting its four integer arguments): the lowbias32 hash
    mixed over seed + the golden ratio, then key, sample and step, its top 24 bits as a float64 in [0, 1)."""
    def mix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))

    with np.errstate(over="ignore"):
        state = mix(np.uint32(seed) + np.uint32(0x9E3779B9))
        for word in (key, sample, step):
            state = mix(state ^ np.asarray(word).astype(np.uint32))
    return (state >> np.uint32(8)).astype("float64") / 2**24


class ExportLockHolder:
    """A separate process holding the writer lock of the export folder `out` (`exports.folder.export_lock`) until
    the `with` block ends: what a second export to `out` meets while a first one runs. `pid` is its process id."""

    SCRIPT = ("import sys, time\nfrom keras_transformer.exports.folder import export_lock\n"
              "with export_lock(sys.argv[1], 'export'):\n    print('held', flush=True)\n    time.sleep(120)\n")

    def __init__(self, out):
        self.out = out

    def __enter__(self):
        import subprocess
        import sys

        self.process = subprocess.Popen([sys.executable, "-c", self.SCRIPT, str(self.out)], cwd=REPO,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "held"
        self.pid = self.process.pid
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()
        self.process.stdout.close()


# A training process that pauses at the end of update UPDATE (in its first callback's batch end) until the test
# has sent it SIGTERM, so that the signal arrives at a known batch, while that batch's callbacks run.
_PAUSE_AT_UPDATE = """
import importlib, pathlib, sys, time
from keras_transformer.trainer import loop

entry, update, paused = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])

class Pause(loop.LearningRateLogger):
    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if int(self.model.optimizer.iterations) == update:
            paused.touch()
            deadline = time.time() + 120
            while not pathlib.Path(f"{paused}.sent").exists() and time.time() < deadline:
                time.sleep(0.02)

loop.LearningRateLogger = Pause  # the first callback the loop makes
sys.exit(importlib.import_module(entry).main(sys.argv[4:]))
"""


def sigterm_at_update(entry, argv, update, folder, timeout=180):
    """Runs `entry.main(argv)` (`keras_transformer.cli`) in a new process, sends it
    SIGTERM during the batch end of its `update`-th update, and returns `(exit status, stderr)` when it ends."""
    import os
    import signal
    import subprocess
    import sys
    import time

    paused = pathlib.Path(folder) / "paused"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TF_CONFIG", None)
    child = subprocess.Popen([sys.executable, "-c", _PAUSE_AT_UPDATE, entry, str(update), str(paused), *argv],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + timeout
        while not paused.exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if not paused.exists():
            child.kill()
            raise AssertionError(f"the process never reached update {update}: {child.communicate()[1][-3000:]}")
        child.send_signal(signal.SIGTERM)
        pathlib.Path(f"{paused}.sent").touch()
        _, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
    return child.returncode, err


def noam_learning_rates(config, training, steps):
    """The Noam schedule's learning rate at each of `steps` (1-based updates) for a model config and its training
    settings (`TrainingSection`: warmup_steps, learning_rate_scale), computed by hand."""
    return [training.learning_rate_scale * config.d_model ** -0.5
            * min(step ** -0.5, step * training.warmup_steps ** -1.5) for step in steps]


class ServeProcess:
    """A `keras-transformer serve` process on a free loopback port, and its HTTP client.

    `ServeProcess.start(arguments, log)` starts it (`arguments` after `serve`, without `--port`), waits until
    `/readyz` answers 200 and records what `/healthz`, `/readyz` and the first model's status said while the
    model loaded (`while_loading`); `stop()` kills what is still running.
    """

    def __init__(self, process, port, log, name):
        self.process, self.port, self.log, self.name = process, port, log, name
        self.url = f"http://127.0.0.1:{port}"
        self.while_loading = None  # (/healthz, /readyz, model status) seen while the model loaded

    @classmethod
    def start(cls, arguments, log, name, timeout=300):
        import os
        import socket
        import subprocess
        import sys
        import time
        import urllib.error

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = os.path.join(os.path.dirname(sys.executable), "keras-transformer")
        command = [command] if os.path.exists(command) else [sys.executable, "-m", "keras_transformer.cli"]
        with open(log, "wb") as handle:
            process = subprocess.Popen(command + ["serve", *arguments, "--port", str(port)], stdout=handle,
                                       stderr=subprocess.STDOUT, cwd=REPO)
        served = cls(process, port, log, name)
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert process.poll() is None, served.output()[-3000:]
                assert time.monotonic() < deadline, f"not ready in {timeout} s\n" + served.output()[-3000:]
                try:
                    ready = served.request("/readyz")
                    if ready[0] == 200:
                        return served
                    if served.while_loading is None:
                        served.while_loading = (served.request("/healthz"), ready,
                                                served.request(f"/v1/models/{name}")[1]["model_version_status"][0])
                except (urllib.error.URLError, ConnectionError):
                    pass  # not listening yet
                time.sleep(0.5)
        except BaseException:
            served.stop()
            raise

    def request(self, path, body=None, raw=None, method=None, headers=None):
        """`(status, parsed JSON answer)`; `raw` bytes are sent as they are."""
        import json
        import urllib.error
        import urllib.request

        data = raw if raw is not None else (json.dumps(body).encode("utf-8") if body is not None else None)
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def predict(self, body):
        return self.request(f"/v1/models/{self.name}:predict", body)

    def output(self):
        return pathlib.Path(self.log).read_text(encoding="utf-8", errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def lines_of(name, count):
    """The first `count` lines of the Multi30k file `name` (``val.en.gz``), stripped."""
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(count)]


def until_eos(tokens, config):
    """A row of a search's token ids up to and with its end token; without padding where it has none."""
    tokens = [int(token) for token in tokens]
    return tokens[:tokens.index(config.eos_id) + 1] if config.eos_id in tokens else \
        [token for token in tokens if token != config.pad_id]


def import_references(root, shapes, build, model_class, tokenizer_class=None):
    """name -> (checkpoint folder, imported workdir, the transformers model, its tokenizer) for each of `shapes`:
    `build(root / name, **shape)` writes the checkpoint, `kt.import_checkpoint` imports it, transformers loads the
    reference model (`model_class`, in eval mode) and tokenizer (`tokenizer_class`, AutoTokenizer by default)."""
    import transformers

    import keras_transformer as kt
    built = {}
    for name, shape in shapes.items():
        folder = build(root / name, **shape)
        workdir = kt.import_checkpoint(folder, root / f"{name}_workdir")
        model = model_class.from_pretrained(folder).eval()
        tokenizer = (tokenizer_class or transformers.AutoTokenizer).from_pretrained(folder)
        built[name] = (folder, workdir, model, tokenizer)
    return built


def load_imported(workdir):
    """`(model, config, source tokenizer, target tokenizer)` of an imported workdir."""
    from keras_transformer.data.tokenizers import load_tokenizers
    from keras_transformer.workdir.checkpoints import load_models
    loaded = load_models(workdir)
    source, target = load_tokenizers(workdir / "data" / "vocab")
    return loaded.models[0], loaded.configs[0], source, target


def end_some_translations(model, sources, generate, eos_id=2):
    """Moves a random BART-like reference's last decoder layer norm's bias towards the end token's embedding, half
    a step at a time, until some greedy translation of `sources` (`generate(model, ids)`) ends before its limit: a
    random model's translations otherwise all run to it, and the tests compare finished hypotheses too."""
    import torch
    eos = model.model.shared.weight[eos_id].detach().clone()
    bias = model.model.decoder.layer_norm.bias.detach().clone()
    for step in np.arange(0.0, 8.0, 0.5):
        with torch.no_grad():
            model.model.decoder.layer_norm.bias.copy_(bias + float(step) * eos / eos.norm() ** 2)
        if any(eos_id in generate(model, ids) for ids in sources):
            break


def check_training_batch(reference, tokenizer, model, config, source, target, sources, targets):
    """The data pipeline's batch of `sources` / `targets` for an imported model (ours: `model`, `config`, `source`
    and `target` tokenizers) holds the reference tokenizer's ids, each side padded with the model's pad id: sources
    as `tokenizer(sources)`, labels as `tokenizer(text_target=targets)`, decoder inputs the labels shifted right
    behind the decoder's start id; and the training loss without label smoothing on it is transformers'
    cross-entropy of `reference` given those labels (which it shifts itself)."""
    import torch

    from keras_transformer.data.pipeline import make_dataset_from_texts
    from keras_transformer.trainer.losses import LabelSmoothedCrossEntropy
    dataset, tally = make_dataset_from_texts(sources, targets, source, target, tokens_per_batch=4096,
                                             max_length=64, num_replicas=1, seed=0)
    (inputs, labels), = list(dataset)  # one batch, its rows shuffled
    inputs, labels = {k: v.numpy() for k, v in inputs.items()}, labels.numpy()
    pad = config.pad_id
    # the pairs over 64 positions left out (a small vocabulary cuts words into many pieces)
    assert inputs["source"].shape[0] == tally.kept >= len(sources) // 2 and (labels == pad).any()
    row_of = {tuple(ids): row for row, ids in enumerate(tokenizer(sources)["input_ids"])}
    order = [row_of[tuple(int(i) for i in ids if i != pad)] for ids in inputs["source"]]
    expected = [tokenizer(text_target=targets[row])["input_ids"] for row in order]
    assert [[int(i) for i in ids if i != pad] for ids in labels] == expected
    width = labels.shape[1]
    assert inputs["target"].tolist() == [([config.bos_id] + ids[:-1] + [pad] * width)[:width] for ids in expected]
    ours = LabelSmoothedCrossEntropy(0.0, pad_id=pad)(labels, model(inputs))
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(inputs["source"].astype("int64")),
                           attention_mask=torch.tensor(inputs["source"] != pad).long(),
                           labels=torch.tensor(np.where(labels == pad, -100, labels).astype("int64"))).loss
    np.testing.assert_allclose(float(ours), float(theirs), atol=1e-4, rtol=0)
