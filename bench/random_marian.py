"""A random Marian checkpoint's folder for the import benches (`import_marian.py`, `import_sharded.py`): what
`save_pretrained` writes beside the weights, for a given shape.

SentencePiece models are learned here on Multi30k (English source, German target), their pieces gathered into one
`vocab.json` padded with filler pieces to the shape's vocabulary (`</s>` 0, `<unk>` 1, `<pad>` last), and the
tokenizer's files written with transformers' `MarianTokenizer`. The caller writes the weights (a PyTorch model's
`save_pretrained`, or random tensors in shards) from the `MarianConfig` returned.
"""

import gzip
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def lines(name, count):
    """The first `count` lines of Multi30k's file `name`."""
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(count)]


def marian_folder(folder, shape, sentences, pieces, activation):
    """Creates `folder` with the tokenizer's files of a Marian checkpoint of `shape` (layers, d_model, heads, d_ff,
    vocab), SentencePiece models of `pieces` pieces learned on `sentences` sentences a side; returns its
    `transformers.MarianConfig` (not yet saved)."""
    import sentencepiece
    import transformers

    folder.mkdir(parents=True)
    for side, name in (("source", "train.en.gz"), ("target", "train.de.gz")):
        with open(folder / f"{side}.spm", "wb") as handle:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines(name, sentences)), model_writer=handle, vocab_size=pieces,
                model_type="unigram", minloglevel=2, unk_id=0, eos_id=1, bos_id=-1, pad_id=-1)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for side in ("source", "target"):
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
        for index in range(processor.get_piece_size()):
            if not (processor.is_control(index) or processor.is_unknown(index)):
                vocabulary.setdefault(processor.id_to_piece(index), len(vocabulary))
    while len(vocabulary) < shape["vocab"] - 1:
        vocabulary[f"<filler_{len(vocabulary)}>"] = len(vocabulary)
    vocabulary["<pad>"] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
    pad = len(vocabulary) - 1
    transformers.MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                                 str(folder / "vocab.json")).save_pretrained(folder)
    return transformers.MarianConfig(
        vocab_size=len(vocabulary), decoder_vocab_size=len(vocabulary), d_model=shape["d_model"],
        encoder_layers=shape["layers"], decoder_layers=shape["layers"], encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"], encoder_ffn_dim=shape["d_ff"], decoder_ffn_dim=shape["d_ff"],
        activation_function=activation, max_position_embeddings=512, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, scale_embedding=True)
