"""BLEU helpers on Multi30k, checkpoint averaging, and the BLEU callback."""

import csv
import math

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import evaluation
from keras_transformer.trainer.tensorflow_callbacks import BleuCallback
from keras_transformer.workdir.checkpoints import average_checkpoints, latest_checkpoints, load_weights

# --------------------------------------------------------------------- BLEU


def test_references_against_themselves_score_100(multi30k_dir):
    references = evaluation.read_lines(multi30k_dir / "val.de.gz")
    assert len(references) == 1014
    assert evaluation.bleu(references, references).score == pytest.approx(100.0)
    assert evaluation.bleu(references, references, lowercase=True).score == pytest.approx(100.0)
    scores = evaluation.evaluate_translations(references, references)
    assert scores == pytest.approx({"bleu": 100.0, "bleu_lowercase": 100.0, "chrf": 100.0, "length_ratio": 1.0})


def test_read_lines_splits_files_as_the_corpus_reader_does(tmp_path):
    """Hypotheses and references are lines as training data are: a lone \\r, \\x0b or U+2028 inside a line does
    not split it (text-mode files would, shifting every later line); gzip is known by content, not name."""
    import gzip

    from keras_transformer.data import corpus
    lines = ["one\rstill one", "two\x0bstill two\u2028", "", "three"]
    data = b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\n"
    (tmp_path / "plain.txt").write_bytes(data)
    (tmp_path / "packed.txt").write_bytes(gzip.compress(data))  # gzip without a .gz name
    for name in ("plain.txt", "packed.txt"):
        assert evaluation.read_lines(tmp_path / name) == lines == corpus.read_lines(tmp_path / name)[0]
    (tmp_path / "bad.txt").write_bytes(b"fine\nalso fine\nbad \xff here\n")
    with pytest.raises(ValueError, match=r"bad\.txt:3: invalid UTF-8 \(byte 4 of the line: b'\\xff'\)"):
        evaluation.read_lines(tmp_path / "bad.txt")


def test_length_ratio_counts_sacrebleu_tokens():
    """The ratio behind BLEU's brevity penalty: hypothesis tokens over reference tokens (13a tokenization)."""
    scores = evaluation.evaluate_translations(["Ein Hund läuft.", "Zwei Katzen"],
                                              ["Ein Hund läuft schnell.", "Zwei Katzen schlafen ."])
    assert scores["length_ratio"] == pytest.approx(6 / 9)  # "läuft." is two tokens; 4 + 2 against 5 + 4


def test_multi30k_protocol_reproduces_the_tokenized_references(multi30k_dir, caplog):
    """Lowercase + Moses normalize + Moses tokenize (escaped) turns the raw references into *.lc.norm.tok.*."""
    raw = evaluation.read_lines(multi30k_dir / "val.en.gz")
    tokenized = evaluation.read_lines(multi30k_dir / "val.lc.norm.tok.en.gz")
    assert evaluation.moses_preprocess(raw, "en") == tokenized
    with caplog.at_level("WARNING"):
        assert evaluation.multi30k_bleu(raw, tokenized, "en").score == pytest.approx(100.0)
    # The protocol tokenizes on purpose: no "forgot to detokenize" warning for its 1,014 lines ending in " .".
    assert sum(line.endswith(" .") for line in tokenized) > 100 and "detokenize" not in caplog.text
    with caplog.at_level("WARNING"):  # where the text should be detokenized, sacreBLEU's warning stays
        evaluation.bleu(tokenized, tokenized)
    assert "detokenize" in caplog.text
    assert evaluation.multi30k_bleu(tokenized, tokenized, "en").score < 100.0  # input must be detokenized text

    raw_de = evaluation.read_lines(multi30k_dir / "val.de.gz")
    tokenized_de = evaluation.read_lines(multi30k_dir / "val.lc.norm.tok.de.gz")
    scores = evaluation.evaluate_translations(raw_de, raw_de, lang="de", tokenized_references=tokenized_de)
    assert scores["bleu_multi30k"] > 99.9  # one of 1,014 lines differs in quote placement


def test_the_protocol_lowercases_before_tokenizing_as_the_references_were_made(multi30k_dir):
    """The `*.lc.norm.tok.*` references were made by lowercase.perl | normalize-punctuation.perl | tokenizer.perl
    (multi30k/dataset, scripts/task1-tokenize.sh), and the order matters: Moses' nonbreaking prefixes are
    case-sensitive ("Bart" is one in German: tokenized cased, "Bart." stays one token), and inside a lowercased
    line a period before a lowercase word stays attached. Hypotheses are processed in the references' order."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    raw = evaluation.read_lines(multi30k_dir / "test_2016_flickr.de.gz")
    tokenized = evaluation.read_lines(multi30k_dir / "test_2016_flickr.lc.norm.tok.de.gz")
    assert evaluation.moses_preprocess(raw, "de") == tokenized  # all 1,000 lines
    [line] = [i for i, text in enumerate(raw) if text.endswith("rasiert seinen Bart.")]
    cased_first = MosesTokenizer(lang="de").tokenize(MosesPunctNormalizer(lang="de").normalize(raw[line]),
                                                     escape=True, return_str=True).lower()
    assert tokenized[line].endswith(" bart .") and cased_first.endswith(" bart.")
    # two sentences in a line: the first one's period stays on its word, as the references' pipeline leaves it
    assert evaluation.moses_preprocess(["A dog runs. A cat sleeps."], "en") == ["a dog runs. a cat sleeps ."]
    assert evaluation.moses_preprocess(["Mr. Smith runs."], "en") == ["mr. smith runs ."]


def test_bleu_is_case_sensitive_only_when_asked():
    hypotheses = ["a man rides a red bike down the street ."]
    references = ["A man rides a red bike down the street ."]
    assert evaluation.bleu(hypotheses, references).score < 100.0
    assert evaluation.bleu(hypotheses, references, lowercase=True).score == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses and 1 references"):
        evaluation.bleu(hypotheses * 2, references)


# Two validation outputs that the two metrics rank in opposite orders: EXACT has whole words right and the rest
# garbage (BLEU 33.1, chrF 47.5); CLOSE has most words slightly wrong (BLEU 6.9, chrF 49.6).
REFERENCES = ["Two young men are playing football on the green grass .", "A woman is reading a book in the park ."]
EXACT = ["Two young men are playing qqq zz ww xx .", "A woman is reading vv uu yy tt ."]
CLOSE = ["Two youngs man is playin footbal on th greens grass .", "The woman was readin the boo in thi park ."]


def test_chrf_is_sacrebleu_s_chrf_with_its_signature_beside_bleu():
    import sacrebleu

    scores, signatures = evaluation.scored_translations(CLOSE, REFERENCES)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(CLOSE, [REFERENCES]).score)
    assert scores["chrf"] == pytest.approx(49.6, abs=0.05) and scores["bleu"] == pytest.approx(6.86, abs=0.01)
    assert signatures["chrf"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{sacrebleu.__version__}"
    # by hand: one sentence, one character: "ab" against "ab" and "ac" (1-grams a,b vs a,c: P = R = 1/2;
    # 2-grams ab vs ac: 0); averaged over the two orders P = R = 1/4, and F-beta (beta 2) of equal P and R is
    # that value: 25
    assert evaluation.chrf(["ab"], ["ac"]).score == pytest.approx(25.0)
    with pytest.raises(ValueError, match="2 hypotheses and 1 references"):
        evaluation.chrf(CLOSE, REFERENCES[:1])


@pytest.mark.parametrize("metric, kept, monitor", [("bleu", 0, "val_bleu"), ("chrf", 1, "val_chrf")])
def test_validation_keeps_the_checkpoint_its_metric_ranks_best(tmp_path, metric, kept, monitor):
    """Two epochs whose outputs BLEU and chrF rank in opposite orders: best.weights.h5 holds the weights of the
    epoch the chosen metric prefers, and the log names the metric."""
    outputs = iter([EXACT, CLOSE])
    translator = type("Fixed", (), {"translate_lines": lambda self, lines, batch_size: next(outputs)})()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    best = tmp_path / "best.weights.h5"
    callback = BleuCallback(["a", "b"], REFERENCES, translator=translator, best_path=best, metric=metric, verbose=0)
    callback.set_model(model)
    logs = []
    for epoch in range(2):
        model.set_weights([np.full((2, 1), float(epoch), "float32"), np.zeros(1, "float32")])
        logs.append({})
        callback.on_epoch_end(epoch, logs[-1])
    score = {"bleu": evaluation.bleu, "chrf": evaluation.chrf}[metric]
    assert [log[monitor] for log in logs] == pytest.approx([score(EXACT, REFERENCES).score,
                                                            score(CLOSE, REFERENCES).score])
    assert callback.best == max(log[monitor] for log in logs)
    model.load_weights(best)
    assert model.get_weights()[0][0, 0] == kept
    with pytest.raises(ValueError, match="metric must be one of bleu, chrf, got 'ter'"):
        BleuCallback(["a"], ["b"], translator=translator, metric="ter")


def test_the_training_section_takes_a_validation_metric():
    from keras_transformer.errors import ConfigError
    from keras_transformer.experiment import TrainingSection

    assert TrainingSection().validation_metric == "bleu"
    TrainingSection(validation_metric="chrf").validate()
    with pytest.raises(ConfigError, match="training.validation_metric must be 'bleu' or 'chrf', got 'ter'"):
        TrainingSection(validation_metric="ter").validate()


# -------------------------------------------------------------- checkpoints


def tiny_model(seed):
    keras.utils.set_random_seed(seed)
    return kt.build_model(kt.TransformerConfig.preset("tiny", vocab_size=30, num_layers=1))


def test_averaging_two_checkpoints_gives_the_elementwise_mean(tmp_path):
    first, second = tiny_model(1), tiny_model(2)
    paths = [tmp_path / "ckpt-0001.weights.h5", tmp_path / "ckpt-0002.weights.h5"]
    first.save_weights(paths[0])
    second.save_weights(paths[1])
    averaged = average_checkpoints(paths, tiny_model(3))
    for a, b, mean in zip(first.get_weights(), second.get_weights(), averaged.get_weights()):
        np.testing.assert_allclose(mean, (a.astype("float64") + b) / 2, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(first.get_weights(), second.get_weights()))


def test_latest_checkpoints_orders_by_number(tmp_path):
    for name in ("ckpt-0002.weights.h5", "ckpt-0010.weights.h5", "ckpt-0009.weights.h5", "step-00000500.weights.h5",
                 "best.weights.h5", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    names = [p.rsplit("/", 1)[-1] for p in latest_checkpoints(tmp_path, n=2)]
    assert names == ["ckpt-0009.weights.h5", "ckpt-0010.weights.h5"]
    assert len(latest_checkpoints(tmp_path, n=20)) == 3
    with pytest.raises(FileNotFoundError, match="missing"):
        latest_checkpoints(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No checkpoints"):
        latest_checkpoints(tmp_path / "empty")


def test_fewer_checkpoints_than_asked_are_used_with_a_warning(tmp_path, caplog):
    """`--average 10` on a run with 3 checkpoints averages those 3 (as `average` does) and says so."""
    for epoch in (1, 2, 3):
        (tmp_path / f"ckpt-{epoch:04d}.weights.h5").write_bytes(b"")
    with caplog.at_level("WARNING", logger="keras_transformer"):
        assert len(latest_checkpoints(tmp_path, 10)) == 3
    assert caplog.messages == [f"Asked for the last 10 checkpoints, but {tmp_path} has only 3: using those 3."]
    caplog.clear()
    assert len(latest_checkpoints(tmp_path, 3)) == 3 and not caplog.messages
    with caplog.at_level("WARNING", logger="keras_transformer"):  # a command looks twice: it says so once
        assert len(latest_checkpoints(tmp_path, 10)) == 3
    assert not caplog.messages
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "ckpt-0001.weights.h5").write_bytes(b"")
    with caplog.at_level("WARNING", logger="keras_transformer"):
        assert len(latest_checkpoints(tmp_path / "one", 5)) == 1
    assert caplog.messages == [f"Asked for the last 5 checkpoints, but {tmp_path / 'one'} has only one: using it."]


def test_read_lines_names_a_folder_given_for_a_file(tmp_path):
    with pytest.raises(IsADirectoryError, match=f"^{tmp_path} is a directory, not a file.$"):
        evaluation.read_lines(tmp_path)  # was "File not found"


def test_truncated_gzip_is_named(tmp_path):
    import gzip
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"one\ntwo\n" * 100)[:-12])
    with pytest.raises(ValueError, match="cut.gz: the gzip data ends before its end marker"):
        evaluation.read_lines(tmp_path / "cut.gz")  # was a bare EOFError


def test_missing_and_corrupt_checkpoints_name_the_file(tmp_path):
    model = tiny_model(1)
    with pytest.raises(FileNotFoundError, match="ckpt-0007.weights.h5"):
        load_weights(model, tmp_path / "ckpt-0007.weights.h5")
    corrupt = tmp_path / "ckpt-0008.weights.h5"
    corrupt.write_bytes(b"not an HDF5 file")
    with pytest.raises(ValueError, match="ckpt-0008.weights.h5"):
        average_checkpoints([corrupt], model)


# ------------------------------------------------------------------ callback


@pytest.mark.slow
def test_bleu_callback_logs_bleu_and_keeps_the_best(trained_copy_model, word_tokenizer, tmp_path):
    """BLEU reaches CSVLogger through `logs`; the best weights are saved."""
    from keras_transformer.data.synthetic import make_arrays, synthetic_pairs

    trained, config = trained_copy_model
    model = kt.build_model(config)
    model.set_weights(trained.get_weights())
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=kt.LabelSmoothedCrossEntropy(0.1))
    sources, _ = synthetic_pairs("copy", num_examples=8, vocab_size=32, min_length=3, max_length=6, seed=3)
    lines = [" ".join(f"w{i}" for i in s) for s in sources]
    inputs, labels = make_arrays(sources, sources)
    best = tmp_path / "best.weights.h5"
    callback = BleuCallback(lines, lines, tokenizers=(word_tokenizer, word_tokenizer), every_n_epochs=2,
                            best_path=best, translator_options={"beam_size": 1, "alpha": 0.0, "max_extra": 3},
                            verbose=0)
    history = model.fit(inputs, labels, epochs=2, verbose=0,
                        callbacks=[callback, keras.callbacks.CSVLogger(str(tmp_path / "history.csv"))])
    assert math.isnan(history.history["val_bleu"][0])
    assert 0.0 < history.history["val_bleu"][1] <= 100.0
    expected = evaluation.bleu(callback.translator.translate_lines(lines), lines).score
    assert history.history["val_bleu"][1] == pytest.approx(expected)
    with open(tmp_path / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[1]["val_bleu"]) == pytest.approx(expected)
    assert best.is_file() and callback.best == pytest.approx(expected)


def test_one_line_replaces_exactly_the_characters_splitlines_breaks_at():
    from keras_transformer.evaluation import one_line
    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    breaks = [c for c in characters if len(f"a{c}b".splitlines()) == 2]
    assert "\n" in breaks and "\x0b" in breaks and "\u2028" in breaks
    for c in breaks:
        assert one_line(f"a{c}b") == "a b" and one_line(f"a{c}{c}\r\nb").splitlines() == ["a b"]
    others = "".join(c for c in characters if c not in set(breaks))
    assert one_line(others) == others  # nothing else changes
