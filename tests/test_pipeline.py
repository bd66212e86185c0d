"""The tf.data pipeline on Multi30k: layout, token budgets, counts, padding, distribution (issue 3, items 3-4)."""

import collections
import gzip
import json
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.batching import batch_plan
from keras_transformer.data.pipeline import (
    BatchStatistics,
    batch_statistics,
    make_dataset,
    make_dataset_from_texts,
    make_datasets,
    make_stream,
    stream_error,
)
from keras_transformer.data.stream import Corpus
from keras_transformer.experiment import DataConfig
from keras_transformer.trainer.distribute import input_shard

BUDGET = 2048
MAX_LENGTH = 40  # positions; 66 of the 29,000 Multi30k training pairs are longer (8k joint BPE)


def read_split(multi30k_dir, name):
    with gzip.open(multi30k_dir / name, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def normalized(text):
    return " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def train_batches(multi30k_dir, multi30k_tokenizer):
    """One epoch of the training split in 2,048-token batches, as numpy, and the reading summary."""
    dataset, summary = make_dataset(multi30k_dir / "train.en.gz", multi30k_dir / "train.de.gz", multi30k_tokenizer,
                                    multi30k_tokenizer, tokens_per_batch=BUDGET, max_length=MAX_LENGTH, seed=1)
    return list(dataset.as_numpy_iterator()), summary, dataset


@pytest.fixture(scope="module")
def train_lengths(multi30k_tokenizer, multi30k_train_pairs):
    """Token counts of every training pair (English, German), computed without the pipeline."""
    english, german, _ = multi30k_train_pairs
    return (multi30k_tokenizer.tokenize(english).row_lengths().numpy(),
            multi30k_tokenizer.tokenize(german).row_lengths().numpy())


def fixed_size_padding(source_lengths, target_lengths, batch_size=64):
    """Padding of the usual alternative, computed from lengths: shuffled batches of 64 padded to their longest."""
    source, target = source_lengths + 1, target_lengths + 1  # + eos, bos +
    order = np.random.default_rng(1).permutation(len(source))
    tokens = positions = 0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        tokens += source[batch].sum() + target[batch].sum()
        positions += len(batch) * (source[batch].max() + target[batch].max())
    return 1 - tokens / positions


def test_examples_are_laid_out_for_teacher_forcing(train_batches):
    batches, _, dataset = train_batches
    assert dataset.element_spec[0]["source"].shape.as_list() == [None, None]
    assert dataset.element_spec[0]["source"].dtype == tf.int32 and dataset.element_spec[1].dtype == tf.int32
    for inputs, labels in batches[:20]:
        source, target = inputs["source"], inputs["target"]
        assert target.shape == labels.shape
        source_lengths = (source != 0).sum(1)
        target_lengths = (target != 0).sum(1)
        rows = np.arange(len(source))
        assert np.all(source[rows, source_lengths - 1] == 3)  # source = tokens + eos, then pads
        assert np.all(target[:, 0] == 2)  # target = bos + tokens (decoder input, shifted right)
        assert np.all(labels[rows, target_lengths - 1] == 3)  # labels = tokens + eos
        assert np.all((labels != 0).sum(1) == target_lengths)
        for row in rows:  # labels are the decoder input shifted left by one
            n = target_lengths[row]
            np.testing.assert_array_equal(labels[row, : n - 1], target[row, 1:n])
            assert np.all(source[row, source_lengths[row]:] == 0) and np.all(target[row, n:] == 0)
        assert not np.any(source[:, :-1][source[:, :-1] == 3] != 3)  # eos only at the end of each row
        assert np.all(((source == 3).sum(1) == 1) & ((labels == 3).sum(1) == 1) & ((target == 2).sum(1) == 1))


def test_batches_hold_real_translation_pairs(multi30k_dir, multi30k_tokenizer):
    english, german = read_split(multi30k_dir, "val.en.gz"), read_split(multi30k_dir, "val.de.gz")
    pairs = {(normalized(e), normalized(g)) for e, g in zip(english, german)}
    dataset, summary = make_dataset(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer,
                                    multi30k_tokenizer, tokens_per_batch=BUDGET, max_length=None, training=False)
    seen = []
    for inputs, labels in dataset:
        sources = multi30k_tokenizer.detokenize(inputs["source"]).numpy()
        targets = multi30k_tokenizer.detokenize(labels).numpy()
        seen += [(s.decode(), t.decode()) for s, t in zip(sources, targets)]
    assert summary.kept == len(seen) == 1014
    assert set(seen) == pairs  # every pair once, source and target still aligned


def test_every_batch_is_within_its_token_budget(train_batches):
    batches, _, _ = train_batches
    source_positions = np.array([inputs["source"].size for inputs, _ in batches])
    target_positions = np.array([inputs["target"].size for inputs, _ in batches])
    assert source_positions.max() <= BUDGET and target_positions.max() <= BUDGET
    # "About N tokens": the batches use most of the budget.
    fill = np.maximum(source_positions, target_positions) / BUDGET
    assert np.median(fill) > 0.9, np.median(fill)
    sizes = [len(labels) for _, labels in batches]
    assert max(sizes) > 2 * min(s for s in sizes if s > 8)  # short sentences get bigger batches


def test_pairs_out_equal_pairs_in_minus_reported_filtered(train_batches, train_lengths):
    batches, summary, dataset = train_batches
    # An independent count of pairs over MAX_LENGTH positions (MAX_LENGTH - 1 tokens plus eos/bos).
    longest = np.maximum(*train_lengths)
    expected_too_long = int(np.sum(longest > MAX_LENGTH - 1))
    assert expected_too_long > 0 and summary.too_long == expected_too_long
    assert sum(len(labels) for _, labels in batches) == summary.lines - summary.dropped == summary.kept
    assert summary.kept == 29000 - expected_too_long
    assert summary.complete  # the counts of the whole pass, known once it has ended
    assert f"{expected_too_long} over max length {MAX_LENGTH}" in str(summary)


def test_padding_is_far_below_fixed_size_batches(train_batches, train_lengths):
    batches, _, _ = train_batches
    source_tokens = sum(int((inputs["source"] != 0).sum()) for inputs, _ in batches)
    positions = sum(inputs["source"].size + inputs["target"].size for inputs, _ in batches)
    target_tokens = sum(int((inputs["target"] != 0).sum()) for inputs, _ in batches)
    budget_padding = 1 - (source_tokens + target_tokens) / positions
    fixed = fixed_size_padding(*train_lengths)
    ratio = budget_padding / fixed
    print(f"\npadding: token budget {budget_padding:.1%}, fixed 64-sentence batches {fixed:.1%}, "
          f"ratio {ratio:.2f}")
    assert budget_padding < 0.1 and ratio < 0.3


def test_over_long_pairs_are_truncated_for_inference(multi30k_dir, multi30k_tokenizer):
    english = read_split(multi30k_dir, "val.en.gz")
    german = read_split(multi30k_dir, "val.de.gz")
    lengths = np.maximum(multi30k_tokenizer.tokenize(english).row_lengths().numpy(),
                         multi30k_tokenizer.tokenize(german).row_lengths().numpy())
    dataset, summary = make_dataset(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer,
                                    multi30k_tokenizer, tokens_per_batch=BUDGET, max_length=16, training=False)
    stats = batch_statistics(dataset)
    assert stats.sentences == 1014
    assert summary.truncated == int(np.sum(lengths > 15)) > 0
    assert summary.too_long == 0 and summary.kept == 1014
    for inputs, labels in dataset.as_numpy_iterator():
        assert inputs["source"].shape[1] <= 16 and labels.shape[1] <= 16
        assert np.all((labels == 3).sum(1) == 1)  # a truncated target still ends with eos


def test_training_order_is_shuffled_each_epoch_and_inference_order_is_fixed(multi30k_dir, multi30k_tokenizer):
    args = (multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer, multi30k_tokenizer)
    train, _ = make_dataset(*args, tokens_per_batch=BUDGET, seed=3)
    first = [labels[:, 0].tolist() for _, labels in train.as_numpy_iterator()]
    second = [labels[:, 0].tolist() for _, labels in train.as_numpy_iterator()]
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, []))
    valid, _ = make_dataset(*args, tokens_per_batch=BUDGET, training=False)
    once = [labels.tolist() for _, labels in valid.as_numpy_iterator()]
    assert once == [labels.tolist() for _, labels in valid.as_numpy_iterator()]


def test_the_stream_runs_without_tf_data_autotuning(train_batches, multi30k_dir, multi30k_tokenizer):
    """Training and inference streams run without tf.data's model-based autotuning: its tuning thread sleeps up to
    a minute between rounds, and deleting the iterator waits for it. Keras leaves `fit`'s iterators to the garbage
    collector, so on a busy machine a collection long after a text run stalled for tens of seconds."""
    valid, _ = make_dataset(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer,
                            multi30k_tokenizer, tokens_per_batch=BUDGET, training=False)
    for dataset in (train_batches[2], valid):
        assert dataset.options().autotune.enabled is False


def test_every_batch_but_one_is_full_and_the_epoch_is_not_sorted(train_batches):
    """A length's last pairs share a batch with the next length's first ones, so no length ends the epoch with a
    small batch (each would be a full optimizer step on a few pairs); the batches come in shuffled order."""
    batches, _, _ = train_batches
    widths = np.array([max(inputs["source"].shape[1], inputs["target"].shape[1]) for inputs, _ in batches])
    sizes = np.array([labels.shape[0] for _, labels in batches])
    fill = sizes * widths / BUDGET
    assert fill.max() <= 1 and np.count_nonzero(fill < 0.5) <= 1  # at most the epoch's very last batch
    assert np.count_nonzero(fill < 0.9) <= len(batches) // 20, np.sort(fill)[:10]
    # Shuffled, the batches' order is unrelated to their width (sorted, the rank correlation would be 1).
    ranks = np.argsort(np.argsort(widths, kind="stable"))
    assert abs(np.corrcoef(ranks, np.arange(len(ranks)))[0, 1]) < 0.3
    assert not np.all(np.diff(widths[-20:]) >= 0)


def test_pairs_of_one_length_share_different_batches_each_epoch(multi30k_dir, multi30k_tokenizer):
    dataset, _ = make_dataset(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer,
                              multi30k_tokenizer, tokens_per_batch=BUDGET, max_length=MAX_LENGTH, seed=3)

    def batches_of_pairs():
        return {frozenset(map(bytes, np.asarray(inputs["source"]))) for inputs, _ in dataset.as_numpy_iterator()}

    first, second = batches_of_pairs(), batches_of_pairs()
    assert len(first) == len(second) > 5
    assert len(first & second) < len(first) // 2  # most batches hold a new set of pairs


def greedy_cut(lengths, budget, width, replicas):
    """The plan computed pair by pair: sort by bucket, then close a batch when the next pair would not fit."""
    lengths = np.sort(np.asarray(lengths))
    shortest = lengths[0]
    upper = [min(shortest + ((n - shortest) // width + 1) * width - 1, lengths[-1]) for n in lengths]
    sizes, batch = [], []
    for index, length in enumerate(lengths):
        if batch and len(batch) + 1 > budget // upper[index] // replicas * replicas:
            keep = len(batch) // replicas * replicas
            sizes.append(keep)
            batch = batch[keep:]
        batch.append(length)
    keep = len(batch) // replicas * replicas
    return sizes + ([keep] if keep else []), len(batch) - keep


@pytest.mark.parametrize("width, replicas", [(1, 1), (3, 1), (1, 4), (8, 2)])
def test_batch_plan_matches_a_pair_by_pair_greedy_cut(width, replicas):
    lengths = np.random.default_rng(width + replicas).integers(3, 60, size=2000)
    buckets, sizes, skipped = batch_plan(lengths, 1000, bucket_width=width, num_replicas=replicas)
    assert (sizes, skipped) == greedy_cut(lengths, 1000, width, replicas)
    assert all(size % replicas == 0 and size > 0 for size in sizes) and skipped < replicas
    assert sum(sizes) + skipped == len(lengths)
    np.testing.assert_array_equal(buckets, (lengths - lengths.min()) // width)
    with pytest.raises(ValueError, match="cannot hold 4 pair.*longest length 300.*at least 1200"):
        batch_plan([5, 300], tokens_per_batch=1000, num_replicas=4)


@pytest.mark.slow  # a MirroredStrategy over two logical CPUs (8 CPU s)
def test_every_replica_gets_data_under_a_mirrored_strategy(multi30k_dir, multi30k_tokenizer_dir):
    """Two logical CPU replicas: each gets >= 1 pair of every batch; the global budget holds."""
    script = textwrap.dedent(f"""
        import json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from keras_transformer.data.tokenizers import load_tokenizers
        from keras_transformer.data.pipeline import make_dataset
        source, target = load_tokenizers({str(multi30k_tokenizer_dir)!r})
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():  # num_replicas is read from the strategy
            dataset, summary = make_dataset({str(multi30k_dir / "val.en.gz")!r}, {str(multi30k_dir / "val.de.gz")!r},
                                            source, target, tokens_per_batch=600, max_length=64, seed=0)
        per_replica, global_positions = [], []
        for inputs, labels in strategy.experimental_distribute_dataset(dataset):
            parts = strategy.experimental_local_results(inputs["source"])
            per_replica.append([int(p.shape[0]) for p in parts])
            global_positions.append(sum(int(p.shape[0]) for p in parts) * max(int(p.shape[1]) for p in parts))
        print(json.dumps(dict(per_replica=per_replica, positions=global_positions, kept=summary.kept,
                              skipped=summary.replica_remainder, lines=summary.lines)))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert min(min(sizes) for sizes in report["per_replica"]) >= 1
    assert max(report["positions"]) <= 600
    assert sum(map(sum, report["per_replica"])) == report["kept"] == report["lines"] - report["skipped"]


def test_make_datasets_from_a_data_config(multi30k_dir, multi30k_tokenizer):
    config = DataConfig(train_source=str(multi30k_dir / "val.en.gz"), train_target=str(multi30k_dir / "val.de.gz"),
                        valid_source=str(multi30k_dir / "test_2016_flickr.en.gz"),
                        valid_target=str(multi30k_dir / "test_2016_flickr.de.gz"),
                        tokens_per_batch=1024, max_length=48, seed=0)
    train, train_summary, valid, valid_summary = make_datasets(config, multi30k_tokenizer, multi30k_tokenizer)
    assert batch_statistics(valid).sentences == 1000
    assert batch_statistics(train).max_source_positions <= 1024
    assert train_summary.lines == 1014 and valid_summary.lines == 1000  # counted as the pass went


def test_data_config_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"Unknown DataConfig fields \['batch_size'\]"):
        DataConfig.from_dict({"batch_size": 64})
    with pytest.raises(ValueError, match="tokens_per_batch=100 is smaller than max_length=128"):
        DataConfig(tokens_per_batch=100)
    with pytest.raises(ValueError, match="DataConfig.model_type must be one of"):
        DataConfig(model_type="chars")
    with pytest.raises(ValueError, match="train_source and train_target must be given together"):
        DataConfig(train_source="train.en")


def test_in_memory_pairs_and_nothing_left(multi30k_tokenizer):
    dataset, summary = make_dataset_from_texts(["A dog.", " ", "A cat."], ["Ein Hund.", "leer", "Eine Katze."],
                                               multi30k_tokenizer, multi30k_tokenizer, tokens_per_batch=64)
    assert batch_statistics(dataset).sentences == 2 and (summary.kept, summary.empty) == (2, 1)
    # Found when the pass ends, and named (the CLI shows `stream_error`'s message alone).
    with pytest.raises(tf.errors.InvalidArgumentError, match="No batch to make.*each of 2 replica"):
        list(make_dataset_from_texts(["A dog."], ["Ein Hund."], multi30k_tokenizer, multi30k_tokenizer,
                                     num_replicas=2)[0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="No batch to make.*1 over max length 3"):
        list(make_dataset_from_texts(["A very long sentence indeed."], ["Ein sehr langer Satz."], multi30k_tokenizer,
                                     multi30k_tokenizer, max_length=3)[0])


def test_batch_statistics_counts_padding():
    stats = BatchStatistics(batches=1, sentences=2, source_tokens=3, target_tokens=3, source_positions=4,
                            target_positions=4, max_source_positions=4, max_target_positions=4)
    assert stats.padding_fraction == pytest.approx(0.25)


# ---------------------------------------------------------------- BPE-dropout (DataConfig.subword_dropout)
def epoch_pairs(dataset, tokenizer):
    """One pass: each row's (source text, target text, source ids, target ids), read back from the batch layout."""
    rows = []
    for inputs, labels in dataset.as_numpy_iterator():
        assert inputs["source"].size <= BUDGET and inputs["target"].size <= BUDGET
        np.testing.assert_array_equal(inputs["target"][:, 1:], np.where(labels[:, :-1] == 3, 0, labels[:, :-1]))
        assert np.all(inputs["target"][:, 0] == 2)
        texts = zip(tokenizer.detokenize(inputs["source"]).numpy(), tokenizer.detokenize(labels).numpy())
        for source, target, (source_text, target_text) in zip(inputs["source"], labels, texts):
            source, target = source[source != 0], target[target != 0]
            assert source[-1] == 3 and target[-1] == 3  # eos closes both sides
            rows.append((source_text.decode(), target_text.decode(), tuple(source[:-1]), tuple(target[:-1])))
    return rows


@pytest.mark.slow  # three epochs of the validation split (8 CPU s)
def test_bpe_dropout_segments_every_pair_anew_each_epoch(multi30k_dir, multi30k_tokenizer):
    """With BPE-dropout every epoch segments the pairs anew (the epochs differ), yet each epoch holds every
    pair of the split once, its text unchanged when detokenized."""
    english, german = read_split(multi30k_dir, "val.en.gz"), read_split(multi30k_dir, "val.de.gz")
    args = (multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer, multi30k_tokenizer)
    train, summary = make_dataset(*args, tokens_per_batch=BUDGET, max_length=None, seed=3, subword_dropout=0.1)
    epochs = [epoch_pairs(train, multi30k_tokenizer) for _ in range(3)]
    first, second = epochs[0], epochs[1]
    pairs = sorted((normalized(e), normalized(g)) for e, g in zip(english, german))
    assert sorted((s, t) for s, t, _, _ in first) == pairs  # every pair once, its pieces still spelling its text
    # An epoch is one pass: every iteration of the dataset is the next pass, holding every pair once.
    fresh, _ = make_dataset(*args, tokens_per_batch=BUDGET, max_length=None, seed=4, subword_dropout=0.1)
    for _ in range(2):
        seen = collections.Counter()
        for inputs, labels in fresh:
            seen.update(zip([s.decode() for s in multi30k_tokenizer.detokenize(inputs["source"]).numpy()],
                            [t.decode() for t in multi30k_tokenizer.detokenize(labels).numpy()]))
        assert seen == collections.Counter(pairs)
    deterministic = {(s, t): (a, b) for s, t, a, b in epoch_pairs(make_dataset(
        *args, tokens_per_batch=BUDGET, max_length=None, seed=3)[0], multi30k_tokenizer)}
    exact = sum(len(a) + len(b) for a, b in deterministic.values())
    for epoch in (first, second):  # smaller pieces: more tokens than the deterministic segmentation
        sampled = sum(len(a) + len(b) for _, _, a, b in epoch)
        assert 1.2 * exact < sampled < 1.7 * exact, (sampled, exact)
        changed = sum((a, b) != deterministic[(s, t)] for s, t, a, b in epoch)
        assert changed > 0.6 * len(pairs)
    assert {(s, t): (a, b) for s, t, a, b in first} != {(s, t): (a, b) for s, t, a, b in second}
    # the same seed gives the same epochs
    again, _ = make_dataset(*args, tokens_per_batch=BUDGET, max_length=None, seed=3, subword_dropout=0.1)
    assert epoch_pairs(again, multi30k_tokenizer) == first
    assert summary.kept == 1014


def test_bpe_dropout_keeps_every_pair_the_length_filter_keeps(multi30k_dir, multi30k_tokenizer):
    english, german = read_split(multi30k_dir, "val.en.gz"), read_split(multi30k_dir, "val.de.gz")
    lengths = np.maximum(multi30k_tokenizer.tokenize(english).row_lengths().numpy(),
                         multi30k_tokenizer.tokenize(german).row_lengths().numpy())
    train, summary = make_dataset(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer,
                                  multi30k_tokenizer, tokens_per_batch=BUDGET, max_length=16, seed=1,
                                  subword_dropout=0.1)
    kept = sorted((normalized(e), normalized(g)) for e, g, n in zip(english, german, lengths) if n <= 15)
    rows = epoch_pairs(train, multi30k_tokenizer)
    assert summary.too_long == len(english) - len(kept) > 0
    assert sorted((s, t) for s, t, _, _ in rows) == kept  # none lost when a sample comes out too long
    assert max(max(len(a), len(b)) for _, _, a, b in rows) <= 15


@pytest.mark.parametrize("side", ["source", "target"])
def test_bpe_dropout_of_one_side_leaves_the_other_as_the_vocabulary_segments_it(multi30k_dir, multi30k_tokenizer,
                                                                                 side):
    args = (multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz", multi30k_tokenizer, multi30k_tokenizer)
    plain = {(s, t): (a, b) for s, t, a, b in epoch_pairs(make_dataset(
        *args, tokens_per_batch=BUDGET, max_length=None, seed=3)[0], multi30k_tokenizer)}
    train, _ = make_dataset(*args, tokens_per_batch=BUDGET, max_length=None, seed=3, subword_dropout=0.1,
                            subword_dropout_sides=side)
    sampled = {(s, t): (a, b) for s, t, a, b in epoch_pairs(train, multi30k_tokenizer)}
    assert set(sampled) == set(plain)
    kept, changed = (1, 0) if side == "source" else (0, 1)
    assert all(sampled[pair][kept] == plain[pair][kept] for pair in plain)
    assert sum(sampled[pair][changed] != plain[pair][changed] for pair in plain) > 0.5 * len(plain)


def test_bpe_dropout_settings_are_checked():
    for value in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="DataConfig.subword_dropout must be a probability in"):
            DataConfig(subword_dropout=value)
    with pytest.raises(ValueError, match="subword_dropout .BPE-dropout. needs model_type 'bpe', got 'unigram'"):
        DataConfig(model_type="unigram", subword_dropout=0.1)
    with pytest.raises(ValueError, match="DataConfig.subword_dropout_sides must be one of .'both', 'source', "
                                         "'target'., got 'decoder'"):
        DataConfig(subword_dropout=0.1, subword_dropout_sides="decoder")
    assert DataConfig.from_dict(DataConfig(subword_dropout=0.1).to_dict()).subword_dropout == 0.1


# ---------------------------------------------------------------- streaming: weighted corpora, shards, bad input
def source_rows(batches):
    """The source ids of every row of `batches` (pads and eos removed), as tuples."""
    return [tuple(row[row != 0][:-1].tolist()) for inputs, _ in batches for row in np.asarray(inputs["source"])]


def chi_square(counts, weights):
    """Pearson's statistic of observed `counts` against the shares of `weights`."""
    counts, shares = np.asarray(counts, float), np.asarray(weights, float) / np.sum(weights)
    expected = counts.sum() * shares
    return float(np.sum((counts - expected) ** 2 / expected))


CHI2_CRITICAL_1DF = 10.83  # P(chi-square with 1 degree of freedom > 10.83) = 0.001


def test_corpora_are_drawn_in_proportion_to_their_weights_each_repeating_on_its_own(multi30k_dir,
                                                                                     multi30k_tokenizer):
    english, german = read_split(multi30k_dir, "val.en.gz"), read_split(multi30k_dir, "val.de.gz")
    big = Corpus("big", english[:300], german[:300], weight=3)
    small = Corpus("small", english[300:400], german[300:400], weight=1)  # a third the size, drawn a third as often
    ids = {name: [tuple(row) for row in multi30k_tokenizer.tokenize(corpus.source).to_list()]
           for name, corpus in (("big", big), ("small", small))}
    origin = {row: name for name, rows in ids.items() for row in rows}
    ambiguous = set(ids["big"]) & set(ids["small"])
    dataset, _ = make_dataset(None, None, multi30k_tokenizer, multi30k_tokenizer, corpora=[big, small],
                              tokens_per_batch=BUDGET, max_length=None, window=64, seed=0, num_replicas=1)
    rows = source_rows(dataset.take(100))
    assert len(rows) > 2000
    drawn = collections.Counter(origin[row] for row in rows if row not in ambiguous)
    counts = [drawn["big"], drawn["small"]]
    assert chi_square(counts, [3, 1]) < CHI2_CRITICAL_1DF, counts  # the weights hold
    for wrong in ([1, 1], [2, 1], [4, 1]):  # and the same test rejects other weights
        assert chi_square(counts, wrong) > CHI2_CRITICAL_1DF, (counts, wrong)
    # The small corpus ran out about 5 times and started again, on its own: each of its pairs came 5 +- 1 times.
    seen = collections.Counter(row for row in rows if origin.get(row) == "small" and row not in ambiguous)
    repeats = np.array([seen[row] for row in set(ids["small"]) - ambiguous])
    assert repeats.min() >= repeats.max() - 1 >= 4, (repeats.min(), repeats.max())


@pytest.mark.parametrize("corpora, message", [
    ([{"name": "a", "source": "a.en", "target": "a.de", "weight": -1}], "weight must be a positive number"),
    ([{"name": "a", "source": "a.en", "target": "a.de"}, {"name": "a", "source": "b.en", "target": "b.de"}],
     "the name 'a' is taken"),
    ([{"name": "a", "source": "a.en", "target": "a.de", "share": 2}], r"unknown keys \['share'\]"),
    ([{"name": "a", "source": "a.en"}], r"corpora\[0\].target must be a non-empty string"),
    ([], "non-empty list"),
])
def test_a_bad_corpora_list_is_named(corpora, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(corpora=corpora)


def test_corpora_and_train_files_are_exclusive_and_one_pair_is_a_corpus_named_train():
    with pytest.raises(ValueError, match="corpora replaces train_source"):
        DataConfig(train_source="a.en", train_target="a.de", corpora=[{"name": "b", "source": "b.en",
                                                                         "target": "b.de"}])
    assert DataConfig(corpora=[{"name": "b", "source": "b.en", "target": "b.de"}]).training_corpora()[0]["weight"] == 1


def test_max_pairs_reads_only_the_first_pairs_of_a_corpus_also_when_resuming_and_for_the_vocabulary(tmp_path):
    """`data.max_train_pairs` (`Corpus.max_pairs`): the stream ends after the first N line pairs, read, skipped
    on resume or sampled for the vocabulary; the files' later lines, even misaligned ones, are never read."""
    from keras_transformer.data import stream, tokenizers

    source, target = tmp_path / "a.en.gz", tmp_path / "a.de.gz"
    with gzip.open(source, "wt", encoding="utf-8") as handle:
        handle.write("".join(f"s{i}\n" for i in range(20)))
    with gzip.open(target, "wt", encoding="utf-8") as handle:
        handle.write("".join(f"t{i}\n" for i in range(25)))  # misaligned after line 20: beyond the cap
    corpus = stream.Corpus("a", source, target, max_pairs=7)
    windows = list(stream.windows([corpus], 3))
    assert [w.sources for w in windows] == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6"]]
    assert windows[-1].last and sum(w.lines for w in windows) == 7
    resumed = list(stream.windows([corpus], 3, start=stream.Position(0, 2)))  # skips 6 lines at C speed
    assert [w.sources for w in resumed] == [["s6"]]
    assert list(stream.windows([stream.Corpus("a", source, target, max_pairs=6)], 3))[-1].sources == ["s3", "s4",
                                                                                                        "s5"]
    with pytest.raises(stream.CorpusError, match="Misaligned"):  # uncapped, the same files are refused
        list(stream.windows([stream.Corpus("a", source, target)], 3))
    sentences, count = tokenizers.sample_files([source, source], None, max_lines=[7, 2])
    assert count == 9 and sorted(sentences) == sorted([f"s{i}" for i in range(7)] + ["s0", "s1"])
    config = DataConfig(train_source=str(source), train_target=str(target), max_train_pairs=7)
    assert config.training_corpora()[0]["max_pairs"] == 7
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_train_pairs must be a positive integer"):
            DataConfig(train_source="a.en", train_target="a.de", max_train_pairs=bad)
    with pytest.raises(ValueError, match="give each corpus its own max_pairs"):
        DataConfig(corpora=[{"name": "b", "source": "b.en", "target": "b.de"}], max_train_pairs=5)
    with pytest.raises(ValueError, match=r"\(b\): max_pairs must be a positive integer"):
        DataConfig(corpora=[{"name": "b", "source": "b.en", "target": "b.de", "max_pairs": 0}])


def test_each_worker_reads_its_own_lines_and_together_they_read_the_corpus_once(multi30k_dir, multi30k_tokenizer):
    """Two workers, as `build_data` makes their streams under MultiWorkerMirroredStrategy (`input_shard` from the
    cluster's TF_CONFIG): over one pass the union of their pairs is the corpus, no pair twice."""
    cluster = tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2"]})

    class Strategy:  # what input_shard reads of a MultiWorkerMirroredStrategy: its cluster resolver
        def __init__(self, task_id):
            self.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                cluster, task_type="worker", task_id=task_id)

    config = DataConfig(train_source=str(multi30k_dir / "val.en.gz"), train_target=str(multi30k_dir / "val.de.gz"),
                        tokens_per_batch=BUDGET, max_length=128, window=300, seed=0)
    english = read_split(multi30k_dir, "val.en.gz")
    corpus_rows = collections.Counter(tuple(row) for row in multi30k_tokenizer.tokenize(english).to_list())
    shards = [input_shard(Strategy(index)) for index in (0, 1)]
    assert shards == [(2, 0), (2, 1)]
    seen = [collections.Counter(source_rows(make_stream(config, multi30k_tokenizer, multi30k_tokenizer,
                                                        num_replicas=1, shard=shard).dataset()))
            for shard in shards]
    assert sum(seen[0].values()) == 507 == sum(seen[1].values())  # every other line
    assert seen[0] + seen[1] == corpus_rows  # the corpus, each pair once (duplicates in it as often as there)


def test_bad_input_is_named_with_its_file_and_line_while_streaming(tmp_path, multi30k_tokenizer):
    (tmp_path / "a.en").write_bytes(b"A dog.\nA cat.\nA \xff bird.\n")
    (tmp_path / "a.de").write_bytes(b"Ein Hund.\nEine Katze.\nEin Vogel.\n")
    (tmp_path / "short.de").write_bytes(b"Ein Hund.\nEine Katze.\n")
    tokens = multi30k_tokenizer
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        list(make_dataset(tmp_path / "a.en", tmp_path / "a.de", tokens, tokens, num_replicas=1)[0])
    assert str(stream_error(error.value)).startswith(f"{tmp_path / 'a.en'}:3: invalid UTF-8")
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        list(make_dataset(tmp_path / "a.en", tmp_path / "short.de", tokens, tokens, num_replicas=1,
                          errors="replace")[0])
    assert str(stream_error(error.value)).startswith(
        f"Misaligned parallel corpus: {tmp_path / 'short.de'} ends after 2 lines but {tmp_path / 'a.en'} goes on")


def test_the_validation_pass_is_logged_as_validation_not_as_a_pass_over_the_training_data(caplog):
    from keras_transformer.data.pipeline.text_stream import CorpusTally

    with caplog.at_level("INFO", logger="keras_transformer.data.pipeline"):
        CorpusTally("val.en.gz", "val.de.gz", split="validation").add(0, last=True, lines=3)
        CorpusTally("train.en.gz", "train.de.gz").add(0, last=True, lines=5)
    assert caplog.messages[0].startswith("Read the validation data: ") and "val.en.gz" in caplog.messages[0]
    assert caplog.messages[1].startswith("Pass 1 over the training data done: ")
