"""Subword tokenizers on Multi30k: learning, reversibility, files, graph/SavedModel use (issue 3, items 2 and 4)."""

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

from keras_transformer import TransformerConfig
from keras_transformer.data.tokenizers import (
    SubwordTokenizer,
    load_tokenizers,
    train_tokenizers,
    train_tokenizers_from_files,
)


def read_split(multi30k_dir, name):
    with gzip.open(multi30k_dir / name, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def normalized(text):
    """The documented normalization, computed independently: NFKC, whitespace runs collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def test_reserved_ids_match_the_model_config(multi30k_tokenizer):
    config = TransformerConfig()
    tokenizer = multi30k_tokenizer
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (
        config.pad_id, config.unk_id, config.bos_id, config.eos_id) == (0, 1, 2, 3)
    assert tokenizer.id_to_piece([0, 1, 2, 3]).numpy().tolist() == [b"<pad>", b"<unk>", b"<s>", b"</s>"]


def test_vocabulary_is_learned_from_the_training_split(multi30k_tokenizer, multi30k_train_pairs):
    english, german, _ = multi30k_train_pairs
    tokenizer = multi30k_tokenizer
    assert tokenizer.vocab_size == 8000 and tokenizer.model_type == "bpe"
    # The most frequent training words of both languages are single pieces of the joint vocabulary.
    counts = collections.Counter(word for line in english[:5000] + german[:5000] for word in line.split())
    frequent = [word for word, _ in counts.most_common(40)]
    ids = tokenizer.tokenize(frequent)
    assert all(length == 1 for length in ids.row_lengths().numpy()), frequent
    assert b"\xe2\x96\x81Mann" in tokenizer.id_to_piece(tf.range(tokenizer.vocab_size)).numpy().tolist()
    # The training text is covered: no unknown ids, and few pieces per word (subwords, not characters).
    sample = tokenizer.tokenize(english[:2000] + german[:2000])
    assert int(tf.reduce_sum(tf.cast(sample.flat_values == tokenizer.unk_id, tf.int32))) == 0
    words = sum(len(line.split()) for line in english[:2000] + german[:2000])
    assert int(sample.flat_values.shape[0]) / words < 1.4


@pytest.mark.parametrize("language", ["en", "de", "fr"])
def test_detokenize_tokenize_gives_back_the_validation_split(multi30k_dir, multi30k_tokenizer, language):
    # French was not in the training text: byte fallback still spells every unseen character exactly.
    sentences = read_split(multi30k_dir, f"val.{language}.gz")
    tokenizer = multi30k_tokenizer
    ids = tokenizer.tokenize(sentences)
    assert ids.dtype == tf.int32 and ids.shape.as_list() == [1014, None]
    assert int(tf.reduce_sum(tf.cast(ids.flat_values == tokenizer.unk_id, tf.int32))) == 0
    back = [text.decode("utf-8") for text in tokenizer.detokenize(ids).numpy()]
    assert back == [normalized(sentence) for sentence in sentences]
    identical = sum(b == s for b, s in zip(back, sentences))
    print(f"\nval.{language}: {identical}/1014 sentences identical byte for byte, the rest equal after NFKC/spaces")
    assert identical >= (1010 if language != "fr" else 990)


def test_normalization_is_documented_behaviour(multi30k_tokenizer):
    tokenizer = multi30k_tokenizer
    texts = ["  A  man\trides   a bike.  ", "ﬁve ½ Ｍänner", "Straße 120\u00a0cm 😀"]
    back = tokenizer.detokenize(tokenizer.tokenize(texts)).numpy().tolist()
    assert back == [normalized(t).encode("utf-8") for t in texts]
    assert back[0] == b"A man rides a bike." and back[1] == "five 1⁄2 Männer".encode("utf-8")


def test_detokenize_reads_model_output_up_to_the_first_eos(multi30k_tokenizer):
    tokenizer = multi30k_tokenizer
    texts = ["A dog runs on the beach.", "Zwei Männer spielen Fußball."]
    ids = tokenizer.tokenize(texts)
    rows = [[2] + row + [3] + [17, 250] + [0] * 4 for row in ids.to_list()]  # bos, tokens, eos, junk, pads
    width = max(map(len, rows))
    dense = tf.constant([row + [0] * (width - len(row)) for row in rows], tf.int32)
    assert tokenizer.detokenize(dense).numpy().tolist() == [t.encode() for t in texts]
    assert tokenizer.detokenize(tf.cast(dense, tf.int64)).numpy().tolist() == [t.encode() for t in texts]
    assert tokenizer.detokenize(ids).numpy().tolist() == [t.encode() for t in texts]  # ragged in
    assert tokenizer.detokenize(dense[0]).numpy() == texts[0].encode()  # a single sequence
    # Ids outside the vocabulary (a model with a padded output layer) read as unknown instead of failing.
    assert b"\xe2\x81\x87" in tokenizer.detokenize([[ids[0, 0].numpy(), tokenizer.vocab_size + 5]]).numpy()[0]


def test_id_to_piece_takes_what_tokenize_returns(multi30k_tokenizer):
    # The docs' `tok.id_to_piece(tok.tokenize([...]))`: ragged ids in, ragged pieces out, row by row.
    sentences = ["A man rides a bike.", "Two dogs."]
    ids = multi30k_tokenizer.tokenize(sentences)
    pieces = multi30k_tokenizer.id_to_piece(ids)
    assert isinstance(pieces, tf.RaggedTensor)
    assert pieces.to_list() == [multi30k_tokenizer.id_to_piece(row).numpy().tolist() for row in ids]
    assert ["".join(p.decode() for p in row).replace("▁", " ").strip() for row in pieces.to_list()] == sentences


def test_tokenizer_runs_in_tf_function_and_tf_data(multi30k_tokenizer):
    tokenizer = multi30k_tokenizer
    texts = ["A little girl climbing into a wooden playhouse.", "Ein kleines Mädchen."]
    eager = tokenizer.tokenize(texts).to_list()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(strings):
        ids = tokenizer.tokenize(strings)
        return ids.to_tensor(), tokenizer.detokenize(ids.to_tensor())

    dense, back = round_trip(tf.constant(texts))
    assert tf.RaggedTensor.from_tensor(dense, padding=0).to_list() == eager
    assert back.numpy().tolist() == [t.encode() for t in texts]
    dataset = tf.data.Dataset.from_tensor_slices(texts).map(tokenizer.tokenize)
    assert [row.tolist() for row in dataset.as_numpy_iterator()] == eager


@pytest.mark.slow  # a SavedModel written and loaded (6 CPU s)
def test_tokenizer_works_in_a_savedmodel_loaded_with_only_tensorflow_text(multi30k_tokenizer, tmp_path):
    """The tokenizer saved inside a SavedModel tokenizes and detokenizes as in Python once loaded back, with
    only tensorflow-text's ops registered."""
    tokenizer = multi30k_tokenizer

    class Wrapper(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = tokenizer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, strings):
            ids = self.tokenizer.tokenize(strings).to_tensor()
            return {"ids": ids, "text": self.tokenizer.detokenize(ids)}

    tf.saved_model.save(Wrapper(), str(tmp_path / "model"))
    text = "Zwei Männer stehen 120 cm über dem Boden."
    expected = tokenizer.tokenize([text]).to_list()[0]
    script = textwrap.dedent(f"""
        import json, sys
        import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the tokenizer ops)
        loaded = tf.saved_model.load({str(tmp_path / "model")!r})
        out = loaded(tf.constant([{text!r}]))
        assert "keras_transformer" not in sys.modules
        print(json.dumps({{"ids": out["ids"].numpy()[0].tolist(), "text": out["text"].numpy()[0].decode()}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    output = json.loads(result.stdout.strip().splitlines()[-1])
    assert output == {"ids": expected, "text": text}


def test_save_and_load_give_the_same_tokenizer(multi30k_tokenizer, multi30k_tokenizer_dir, multi30k_dir):
    sentences = read_split(multi30k_dir, "val.de.gz")[:200]
    config = json.loads((multi30k_tokenizer_dir / "tokenizer.json").read_text())
    assert config["vocab_size"] == 8000 and config["model_type"] == "bpe"
    assert (config["pad_id"], config["unk_id"], config["bos_id"], config["eos_id"]) == (0, 1, 2, 3)
    source, target = load_tokenizers(multi30k_tokenizer_dir)
    assert source is target
    assert source.tokenize(sentences).to_list() == multi30k_tokenizer.tokenize(sentences).to_list()
    assert SubwordTokenizer.load(multi30k_tokenizer_dir).vocab_size == 8000


def test_separate_vocabularies(multi30k_train_pairs, multi30k_dir, tmp_path):
    english, german, _ = multi30k_train_pairs
    source, target = train_tokenizers(english[:3000], german[:3000], vocab_size=(1000, 1200), shared=False,
                                      directory=tmp_path, model_type="unigram")
    assert (source.vocab_size, target.vocab_size) == (1000, 1200) and source.model_type == "unigram"
    assert (tmp_path / "source" / "tokenizer.json").is_file() and (tmp_path / "target" / "tokenizer.json").is_file()
    loaded_source, loaded_target = load_tokenizers(tmp_path)
    assert loaded_source is not loaded_target
    val_de = read_split(multi30k_dir, "val.de.gz")
    assert loaded_target.tokenize(val_de).to_list() == target.tokenize(val_de).to_list()
    back = [t.decode() for t in loaded_target.detokenize(loaded_target.tokenize(val_de)).numpy()]
    assert back == [normalized(s) for s in val_de]
    # A target vocabulary learned from German only splits German into fewer pieces than the English one.
    assert target.tokenize(val_de).flat_values.shape[0] < source.tokenize(val_de).flat_values.shape[0]


def test_missing_tokenizer_directory_fails_clearly(tmp_path, multi30k_tokenizer):
    with pytest.raises(FileNotFoundError, match=r"No tokenizer at .*nowhere: the folder does not exist"):
        SubwordTokenizer.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"No tokenizers at .*nowhere.*no such folder"):
        load_tokenizers(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"tokenizer.json is missing"):
        SubwordTokenizer.load(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"expected tokenizer.json .* or source/ and target/"):
        load_tokenizers(tmp_path / "empty")
    multi30k_tokenizer.save(tmp_path / "broken")
    (tmp_path / "broken" / "sentencepiece.model").unlink()
    with pytest.raises(FileNotFoundError, match=r"sentencepiece.model named in .*tokenizer.json is missing"):
        load_tokenizers(tmp_path / "broken")


def test_foreign_sentencepiece_model_with_other_reserved_ids_is_rejected(multi30k_dir):
    import io

    import sentencepiece

    writer = io.BytesIO()  # SentencePiece's own defaults: unk=0, bos=1, eos=2, no pad
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(read_split(multi30k_dir, "val.en.gz")),
                                             model_writer=writer, vocab_size=500, minloglevel=2)
    with pytest.raises(ValueError, match=r"reserved ids .*'pad': -1, 'unk': 0.*needs pad=0, unk=1, bos=2, eos=3"):
        SubwordTokenizer(writer.getvalue())


def test_vocabulary_too_large_for_the_text_says_what_fits(multi30k_dir):
    with pytest.raises(ValueError, match=r"Cannot learn 5000 bpe pieces from 50 sentences: .*at most vocab_size="):
        SubwordTokenizer.train(read_split(multi30k_dir, "val.en.gz")[:50], 5000)


def test_training_from_files_equals_training_from_sentences(multi30k_dir):
    # Files (gzip) and a list of sentences give the same model.
    from_files = SubwordTokenizer.train_from_files([multi30k_dir / "val.en.gz", str(multi30k_dir / "val.de.gz")], 1000)
    sentences = read_split(multi30k_dir, "val.en.gz") + read_split(multi30k_dir, "val.de.gz")
    from_text = SubwordTokenizer.train(sentences, 1000)
    assert from_files.tokenize(sentences).to_list() == from_text.tokenize(sentences).to_list()


def test_a_misspelled_path_is_refused_by_name_and_sentences_are_never_read_as_paths(multi30k_dir, tmp_path):
    """Issue #47, item 3: nothing guesses whether a string is a path or a sentence."""
    # A misspelled file is an error naming it, on either side, before anything is learned: it used to be taken for a
    # sentence when its partner existed, and the "English" vocabulary was learned from French alone.
    misspelled = tmp_path / "trian.en"
    with pytest.raises(FileNotFoundError, match="trian.en"):
        train_tokenizers_from_files([str(misspelled)], [str(multi30k_dir / "val.fr.gz")], vocab_size=4000)
    with pytest.raises(FileNotFoundError, match="trian.en"):
        train_tokenizers_from_files(multi30k_dir / "val.en.gz", misspelled, vocab_size=4000)
    with pytest.raises(FileNotFoundError, match="trian.en"):
        SubwordTokenizer.train_from_files([multi30k_dir / "val.en.gz", misspelled], 1000)
    # Sentences are text, even when one names an existing file: the vocabulary is learned from the string itself.
    path = str(multi30k_dir / "val.en.gz")
    tokenizer = SubwordTokenizer.train([path] * 20, vocab_size=300)
    assert tokenizer.detokenize(tokenizer.tokenize([path])).numpy().tolist() == [path.encode()]
    assert len(tokenizer.tokenize(["A man"])[0]) >= 4  # the file's words ("▁A", "▁man") were not learned
    # What would have been guessed is refused by type, with the function to use.
    with pytest.raises(TypeError, match="train_from_files"):
        SubwordTokenizer.train(path, 300)  # one str: a path or a sentence?
    with pytest.raises(TypeError, match="train_from_files"):
        SubwordTokenizer.train([multi30k_dir / "val.en.gz"], 300)
    with pytest.raises(TypeError, match="train_tokenizers_from_files"):
        train_tokenizers([multi30k_dir / "val.en.gz"], [multi30k_dir / "val.de.gz"], vocab_size=300)
    # Paths given as sentences (the docs' old snippet, without the files) now fail with the way out in the message.
    with pytest.raises(ValueError, match=r"from 2 sentences.*train_tokenizers_from_files"):
        train_tokenizers(["corpora/train.en.gz"], ["corpora/train.de.gz"], vocab_size=10000)


def test_keras_nlp_default_proto_loses_unseen_characters_ours_does_not(multi30k_train_pairs, multi30k_dir):
    """Why the trainer options: keras-nlp's compute_sentence_piece_proto has no byte fallback."""
    from keras_nlp.tokenizers import compute_sentence_piece_proto

    english, german, _ = multi30k_train_pairs
    texts = english[:3000] + german[:3000]
    val = read_split(multi30k_dir, "val.en.gz") + read_split(multi30k_dir, "val.de.gz")
    plain = SubwordTokenizer(compute_sentence_piece_proto(tf.data.Dataset.from_tensor_slices(texts), 2000,
                                                          model_type="bpe"))
    ours = SubwordTokenizer.train(texts, 2000)
    lost = np.sum([b != normalized(s).encode() for b, s in zip(plain.detokenize(plain.tokenize(val)).numpy(), val)])
    kept = np.sum([b == normalized(s).encode() for b, s in zip(ours.detokenize(ours.tokenize(val)).numpy(), val)])
    print(f"\nkeras-nlp default proto: {lost}/{len(val)} validation sentences come back with ⁇; ours: "
          f"{len(val) - kept}")
    assert lost > 0 and kept == len(val)


def test_tokenizer_survives_seeding_and_clear_session(multi30k_tokenizer):
    """tf.random.set_seed clears the eager kernel cache, which deletes plain tensorflow-text SentencePiece models."""
    import keras

    tokenizer = SubwordTokenizer(multi30k_tokenizer._model)
    texts = ["A man rides a bike.", "Ein Mann fährt Fahrrad."]
    expected = tokenizer.tokenize(texts).to_list()
    traced = tf.function(lambda strings: tokenizer.tokenize(strings).to_tensor())
    traced(tf.constant(texts))
    keras.utils.set_random_seed(0)
    tf.random.set_seed(1)
    keras.backend.clear_session()
    assert tokenizer.tokenize(texts).to_list() == expected
    assert tf.RaggedTensor.from_tensor(traced(tf.constant(texts)), padding=0).to_list() == expected
    assert tokenizer.detokenize(tokenizer.tokenize(texts)).numpy().tolist() == [t.encode() for t in texts]


def test_wordpiece_option_learns_with_keras_nlp_but_is_not_reversible(multi30k_dir, tmp_path):
    english = read_split(multi30k_dir, "val.en.gz")[:100]
    german = read_split(multi30k_dir, "val.de.gz")[:100]
    source, target = train_tokenizers(english, german, 400, model_type="wordpiece", lowercase=True,
                                      directory=tmp_path)
    assert source is target and source.model_type == "wordpiece"
    assert 0 < source.vocab_size <= 400  # keras-nlp's learner may stop below the requested size
    assert source.id_to_piece([0, 1, 2, 3]).numpy().tolist() == [b"[PAD]", b"[UNK]", b"[BOS]", b"[EOS]"]
    loaded, _ = load_tokenizers(tmp_path)
    ids = loaded.tokenize(english[:2])
    assert ids.to_list() == source.tokenize(english[:2]).to_list()
    dense = tf.concat([tf.fill([2, 1], 2), ids.to_tensor(), tf.constant([[3, 9], [3, 9]])], axis=1)
    # Lowercased, and punctuation split off: why SentencePiece is the default.
    assert loaded.detokenize(dense).numpy().tolist() == [b"a group of men are loading cotton onto a truck",
                                                         b"a man sleeping in a green room on a couch ."]
    with pytest.raises(ValueError, match="BPE-dropout needs a SentencePiece 'bpe' tokenizer, this one is 'wordpiece'"):
        loaded.sample(english[:2], 0.1)


def test_bpe_dropout_samples_spell_the_text_and_zero_is_the_plain_segmentation(multi30k_dir, multi30k_tokenizer):
    english = read_split(multi30k_dir, "val.en.gz")
    plain = multi30k_tokenizer.tokenize(english).to_list()
    assert multi30k_tokenizer.sample(english, 0) == plain
    first = multi30k_tokenizer.sample(english, 0.1, seed=5)
    assert multi30k_tokenizer.sample(english, 0.1, seed=5) == first  # a seed repeats the sample
    assert multi30k_tokenizer.sample(english, 0.1, seed=6) != first
    spelled = multi30k_tokenizer.detokenize(tf.ragged.constant(first)).numpy()
    assert [text.decode() for text in spelled] == [normalized(line) for line in english]
    # every piece is in the vocabulary, and the pieces are smaller than the plain segmentation's
    assert all(0 < i < multi30k_tokenizer.vocab_size for ids in first for i in ids)
    longer = np.array([len(a) / len(b) for a, b in zip(first, plain)])
    assert 1.2 < longer.mean() < 1.7 and np.mean(longer >= 1) > 0.95
    with pytest.raises(ValueError, match="BPE-dropout must be a probability in .0, 1., got 1"):
        multi30k_tokenizer.sample(english, 1)


def test_seeded_samples_drawn_at_the_same_time_repeat_the_ones_drawn_alone(multi30k_dir, multi30k_tokenizer):
    """The training pipeline samples the source and the target side at once, each with its own seed: each sample
    must still be the one its seed gives alone (SentencePiece's seed is process-wide)."""
    import threading

    english = read_split(multi30k_dir, "val.en.gz")
    alone = {seed: multi30k_tokenizer.sample(english, 0.1, seed=seed) for seed in (1, 2)}
    for _ in range(20):
        drawn = {}
        threads = [threading.Thread(target=lambda seed=seed: drawn.update(
            {seed: multi30k_tokenizer.sample(english, 0.1, seed=seed)})) for seed in alone]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert drawn == alone


# ---------------------------------------------------------------------- a vocabulary from a bounded sample
def chi_square(counts, expected):
    counts = np.asarray(counts, dtype=float)
    return float(((counts - expected) ** 2 / expected).sum())


def test_reservoir_sample_is_uniform_bounded_and_repeatable():
    from keras_transformer.data.tokenizers import reservoir_sample

    # One draw of 2,000 of 20,000 line indices: counts in 20 equal ranges of the corpus against 100 each.
    sample, count = reservoir_sample(iter(range(20_000)), 2_000, seed=3)
    assert count == 20_000 and len(sample) == len(set(sample)) == 2_000
    critical = 43.82  # chi-square, 19 degrees of freedom, p = 0.001 (scipy.stats.chi2.ppf(0.999, 19))
    assert chi_square(np.bincount(np.asarray(sample) // 1_000, minlength=20), 100) < critical
    first_lines = list(range(2_000))  # what a sampler biased to the start draws fails the same check
    assert chi_square(np.bincount(np.asarray(first_lines) // 1_000, minlength=20), 100) > critical
    # Each index's inclusion over 2,000 seeds (10 of 200 each): 100 expected for every index, first and last too.
    inclusions = np.zeros(200)
    for seed in range(2_000):
        inclusions[reservoir_sample(range(200), 10, seed=seed)[0]] += 1
    assert chi_square(inclusions, 100) < 266.39  # 199 degrees of freedom, p = 0.001
    # bounded, and a pure function of the seed
    assert reservoir_sample(range(20_000), 2_000, seed=3)[0] == sample
    assert reservoir_sample(range(20_000), 2_000, seed=4)[0] != sample
    assert reservoir_sample(range(7), 2_000) == (list(range(7)), 7)
    with pytest.raises(ValueError, match="positive integer"):
        reservoir_sample(range(7), 0)


def test_a_vocabulary_from_a_sample_of_a_repeated_corpus_is_the_corpus_own(multi30k_train_pairs, tmp_path, caplog):
    english, german, _ = multi30k_train_pairs
    english, german = english[:3000], german[:3000]
    for name, lines in (("train.en.gz", english), ("train.de.gz", german)):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines) * 10)
    direct = train_tokenizers(english, german, 2000)[0]
    with caplog.at_level("INFO", logger="keras_transformer"):
        sampled = train_tokenizers_from_files(tmp_path / "train.en.gz", tmp_path / "train.de.gz", 2000,
                                              sample_size=30_000, seed=5)[0]
    # fair to both sides, bounded: half the sample from each side's 30,000 lines, a count and a time logged
    assert "15000 of 30000 source and 15000 of 30000 target sentences, drawn in" in caplog.text
    assert "Vocabulary of 2000 learned from 30000 sentences in" in caplog.text
    # Nearly the same pieces (about 96%: a few of the rarest merges differ; a vocabulary learned from 3,000 other
    # pairs shares 82%), and the same segmentation length of held-out text (within 0.5%).
    held_out = multi30k_train_pairs[0][3000:4000] + multi30k_train_pairs[1][3000:4000]

    def compared(tokenizer):
        pieces = [set(t.id_to_piece(tf.range(2000)).numpy().tolist()) for t in (direct, tokenizer)]
        lengths = [int(t.tokenize(held_out).row_lengths().numpy().sum()) for t in (direct, tokenizer)]
        return len(pieces[0] & pieces[1]) / 2000, lengths[1] / lengths[0]

    shared, ratio = compared(sampled)
    assert shared > 0.95 and abs(ratio - 1) < 0.005
    other = train_tokenizers(multi30k_train_pairs[0][5000:8000], multi30k_train_pairs[1][5000:8000], 2000)[0]
    assert compared(other)[0] < 0.9  # the comparison tells vocabularies of different text apart


def test_a_sampled_line_with_invalid_utf8_is_named_by_file_and_line(tmp_path):
    from keras_transformer.data.corpus import CorpusError
    from keras_transformer.data.tokenizers import sample_files
    path = tmp_path / "train.de"
    path.write_bytes(b"\xef\xbb\xbfEin Hund.\r\n\n  \nZwei M\xe4nner.\n")
    with pytest.raises(CorpusError, match=rf"{path}:4: invalid UTF-8 \(byte 6"):
        sample_files(path, None)
    assert sample_files(path, None, errors="replace") == (["Ein Hund.", "Zwei M\ufffdnner."], 4)  # bom, blanks gone
