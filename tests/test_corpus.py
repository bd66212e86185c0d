"""Reading parallel corpora: alignment, empty pairs, UTF-8 errors, length limits (issue 3, item 1)."""

import gzip

import pytest
import tensorflow as tf

from keras_transformer.data.corpus import CorpusError, CorpusSummary, limit_length, read_lines, read_parallel_corpus


@pytest.fixture(scope="module")
def val_pairs(multi30k_dir):
    """The 1,014 validation pairs, read with Python's own gzip/UTF-8 (an independent reading)."""
    with gzip.open(multi30k_dir / "val.en.gz", "rt", encoding="utf-8") as handle:
        english = handle.read().split("\n")[:-1]
    with gzip.open(multi30k_dir / "val.de.gz", "rt", encoding="utf-8") as handle:
        german = handle.read().split("\n")[:-1]
    return english, german


def write_lines(path, lines, encoding="utf-8"):
    path.write_bytes(b"".join(line.encode(encoding) + b"\n" for line in lines))
    return path


def test_reads_multi30k_gzip_aligned(multi30k_dir, multi30k_train_pairs, val_pairs):
    english, german, summary = multi30k_train_pairs
    assert (summary.lines, summary.kept, summary.empty, summary.replaced) == (29000, 29000, 0, 0)
    assert english[0] == "Two young, White males are outside near many bushes."
    assert german[0].startswith("Zwei junge weiße Männer")
    sources, targets, _ = read_parallel_corpus(multi30k_dir / "val.en.gz", multi30k_dir / "val.de.gz")
    assert (sources, targets) == val_pairs


def test_plain_and_gzip_files_read_the_same(tmp_path, multi30k_dir, val_pairs):
    english, german = val_pairs
    plain_en = write_lines(tmp_path / "val.en", english)
    # A gzip file without the .gz suffix is still recognised (from its magic bytes).
    gz_de = tmp_path / "val_de_compressed"
    gz_de.write_bytes(gzip.compress("".join(line + "\n" for line in german).encode("utf-8")))
    sources, targets, summary = read_parallel_corpus(plain_en, gz_de)
    assert (sources, targets) == (english, german)
    assert summary.lines == 1014


def test_misaligned_files_name_both_files_and_counts(tmp_path, val_pairs):
    english, german = val_pairs
    source = write_lines(tmp_path / "a.en", english[:10])
    target = write_lines(tmp_path / "a.de", german[:9])
    with pytest.raises(CorpusError) as error:
        read_parallel_corpus(source, target)
    message = str(error.value)
    assert str(source) in message and str(target) in message
    assert "10 lines" in message and "has 9" in message


def test_empty_and_whitespace_pairs_are_dropped_and_counted(tmp_path, val_pairs):
    english, german = list(val_pairs[0][:20]), list(val_pairs[1][:20])
    english[3] = ""
    german[7] = "   \t "
    english[11] = german[11] = " "
    german[19] = "\u3000"  # an ideographic space is whitespace too
    source, target = write_lines(tmp_path / "a.en", english), write_lines(tmp_path / "a.de", german)
    sources, targets, summary = read_parallel_corpus(source, target)
    dropped = {3, 7, 11, 19}
    assert sources == [s for i, s in enumerate(english) if i not in dropped]
    assert targets == [t for i, t in enumerate(german) if i not in dropped]
    assert (summary.lines, summary.empty, summary.kept) == (20, 4, 16)
    assert "4 empty" in str(summary)


def test_invalid_utf8_strict_names_file_and_line(tmp_path, val_pairs):
    english = val_pairs[0][:10]
    data = [line.encode("utf-8") for line in english]
    data[6] = data[6][:5] + b"\xff\xfe" + data[6][5:]  # line 7
    path = tmp_path / "bad.en"
    path.write_bytes(b"\n".join(data) + b"\n")
    with pytest.raises(CorpusError, match=rf"{path}:7: invalid UTF-8 \(byte 5"):
        read_lines(path)
    target = write_lines(tmp_path / "ok.de", val_pairs[1][:10])
    with pytest.raises(CorpusError, match="errors='replace'"):
        read_parallel_corpus(path, target)


def test_invalid_utf8_replace_mode_replaces_and_counts(tmp_path, val_pairs):
    english, german = val_pairs[0][:10], val_pairs[1][:10]
    data = [line.encode("utf-8") for line in english]
    data[6] = data[6] + b"\xc3"  # a truncated two-byte sequence
    source = tmp_path / "bad.en"
    source.write_bytes(b"\n".join(data) + b"\n")
    target = write_lines(tmp_path / "ok.de", german)
    sources, targets, summary = read_parallel_corpus(source, target, errors="replace")
    assert sources[6] == english[6] + "\ufffd"
    assert sources[:6] == english[:6] and sources[7:] == english[7:] and targets == german
    assert summary.replaced == 1 and summary.kept == 10
    with pytest.raises(ValueError, match="errors must be one of"):
        read_lines(source, errors="ignore")


def test_only_newline_ends_a_line(tmp_path):
    # U+2028, U+0085, \x0b and \x0c are line breaks for str.splitlines but not in a corpus: splitting on
    # them would shift every later line against the other language.
    english = ["first\u2028still first", "second\x85", "third\x0bthird\x0c", "fourth"]
    german = ["erste", "zweite", "dritte", "vierte"]
    source = tmp_path / "a.en"
    source.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(english).encode("utf-8") + b"\r\n")  # BOM and CRLF
    target = write_lines(tmp_path / "a.de", german)
    sources, targets, summary = read_parallel_corpus(source, target)
    assert sources == english and targets == german and summary.lines == 4


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.en"):
        read_parallel_corpus(tmp_path / "nope.en", tmp_path / "nope.de")


def test_limit_length_filter_for_training():
    source = tf.ragged.constant([[5] * 3, [5] * 8, [5] * 2, [5] * 4], dtype=tf.int32)
    target = tf.ragged.constant([[6] * 4, [6] * 2, [6] * 9, [6] * 3], dtype=tf.int32)
    # max_length 5 positions -> at most 4 tokens per side (the pipeline adds eos / bos).
    kept_source, kept_target, summary = limit_length(source, target, 5, "filter",
                                                     CorpusSummary("s", "t", lines=4))
    assert kept_source.to_list() == [[5] * 3, [5] * 4]
    assert kept_target.to_list() == [[6] * 4, [6] * 3]
    assert (summary.too_long, summary.kept, summary.truncated, summary.max_length) == (2, 2, 0, 5)
    assert "2 over max length 5" in str(summary)


def test_limit_length_truncate_for_inference():
    source = tf.ragged.constant([[1, 2, 3, 4, 5, 6], [7]], dtype=tf.int32)
    target = tf.ragged.constant([[8], [9, 10, 11, 12, 13]], dtype=tf.int32)
    cut_source, cut_target, summary = limit_length(source, target, 4, "truncate")
    assert cut_source.to_list() == [[1, 2, 3], [7]]
    assert cut_target.to_list() == [[8], [9, 10, 11]]
    assert (summary.truncated, summary.too_long, summary.kept) == (2, 0, 2)
    with pytest.raises(ValueError, match="mode must be one of"):
        limit_length(source, target, 4, "drop")
