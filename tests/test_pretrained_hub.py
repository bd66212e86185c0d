"""Sharded and PyTorch-only checkpoints, and `hf://` model names read offline from a Hugging Face cache folder.

One small random MarianMTModel (tests/test_pretrained.py's `build_reference`), saved whole, sharded by
save_pretrained (a small max_shard_size), and as PyTorch files (whole and sharded): each reads to the same tensors,
and the sharded one imports to the same weights bit for bit. The `hf://` tests lay its files out as huggingface_hub
lays out its cache (models--owner--name/snapshots/<commit>/, refs/main) with HF_HUB_OFFLINE=1: nothing is
downloaded.
"""

import json
import shutil

import h5py
import numpy as np
import pytest
from test_pretrained import SHAPES, build_reference

import keras_transformer as kt
from keras_transformer.errors import CheckpointNotFoundError, ConfigError, CorruptFileError
from keras_transformer.imports import cache as hf_cache
from keras_transformer.imports.checkpoint import read_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained")

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "config.json")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPOSITORY = "test-org/opus-mt-tiny"


def _without_weights(source, destination):
    destination.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, destination / name)
    return destination


def _torch_files(state, folder, shards):
    """`state` saved as PyTorch files: pytorch_model.bin (shards=1), or `shards` files and their index."""
    names = sorted(state)
    if shards == 1:
        torch.save(state, folder / "pytorch_model.bin")
        return
    weight_map = {}
    for index, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        shard = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        torch.save({names[i]: state[names[i]] for i in part}, folder / shard)
        weight_map.update({names[i]: shard for i in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> checkpoint folder: "whole" (model.safetensors), "sharded" (save_pretrained's shards and index),
    "torch" (pytorch_model.bin), "torch_sharded" (three .bin shards and their index); "workdir": the whole one
    imported."""
    from safetensors.torch import load_file
    root = tmp_path_factory.mktemp("sharded")
    whole = build_reference(root / "whole", **SHAPES["shared_swish"])
    folders = {"whole": whole}
    model = transformers.MarianMTModel.from_pretrained(whole).eval()
    folders["sharded"] = _without_weights(whole, root / "sharded")
    model.save_pretrained(folders["sharded"], max_shard_size="20KB")
    state = load_file(whole / "model.safetensors")
    for kind, shards in (("torch", 1), ("torch_sharded", 3)):
        folders[kind] = _without_weights(whole, root / kind)
        _torch_files(state, folders[kind], shards)
    folders["workdir"] = kt.import_checkpoint(whole, root / "whole_workdir")
    return folders


def _h5_arrays(path):
    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset)
                          else None)
    return arrays


def test_a_sharded_save_pretrained_imports_to_the_same_weights_bit_for_bit(checkpoints, tmp_path):
    sharded = checkpoints["sharded"]
    shards = sorted(path.name for path in sharded.glob("model-*.safetensors"))
    assert len(shards) > 2 and (sharded / "model.safetensors.index.json").is_file()
    workdir = kt.import_checkpoint(sharded, tmp_path / "sharded_workdir")
    ours = _h5_arrays(workdir / "checkpoints" / "ckpt-0000.weights.h5")
    expected = _h5_arrays(checkpoints["workdir"] / "checkpoints" / "ckpt-0000.weights.h5")
    assert sorted(ours) == sorted(expected) and len(ours) > 20
    for name, value in expected.items():
        assert ours[name].dtype == value.dtype and np.array_equal(ours[name], value), name
    record = json.loads((workdir / "imported.json").read_text())
    assert set(shards) <= set(record["files"])  # each shard's hash recorded


@pytest.mark.parametrize("kind", ["sharded", "torch", "torch_sharded"])
def test_sharded_and_pytorch_checkpoints_read_to_the_tensors_of_the_whole_one(checkpoints, kind):
    expected = read_checkpoint(checkpoints["whole"]).tensors()
    tensors = read_checkpoint(checkpoints[kind]).tensors()
    assert sorted(tensors) == sorted(expected)
    for name in expected:
        assert tensors.shape(name) == expected.shape(name)
        assert np.array_equal(tensors[name], expected[name]), name


def test_a_pytorch_only_sharded_checkpoint_imports(checkpoints, tmp_path):
    workdir = kt.import_checkpoint(checkpoints["torch_sharded"], tmp_path / "torch_workdir")
    ours = _h5_arrays(workdir / "checkpoints" / "ckpt-0000.weights.h5")
    expected = _h5_arrays(checkpoints["workdir"] / "checkpoints" / "ckpt-0000.weights.h5")
    assert all(np.array_equal(ours[name], value) for name, value in expected.items())


def _bfloat16_bits(values):
    """float32 values rounded to nearest (ties to even) bfloat16, as the upper 16 bits of each float32."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_a_bfloat16_import_keeps_rounded_weights_on_disk_and_loads_in_bfloat16(checkpoints, tmp_path, monkeypatch):
    """Each weight is the float32 import's rounded to nearest (even), bit for bit, though read and rounded a few
    rows at a time (blocks of 256 bytes here)."""
    from keras_transformer.imports import family
    from keras_transformer.workdir.checkpoints import load_models
    monkeypatch.setattr(family, "BLOCK_BYTES", 256)
    workdir = kt.import_checkpoint(checkpoints["sharded"], tmp_path / "half", dtype="bfloat16")
    path = workdir / "checkpoints" / "ckpt-0000.weights.h5"
    ours = _h5_arrays(path)
    expected = _h5_arrays(checkpoints["workdir"] / "checkpoints" / "ckpt-0000.weights.h5")
    assert sorted(ours) == sorted(expected)
    for name, value in expected.items():
        assert ours[name].dtype.itemsize == 2 and np.array_equal(ours[name].view(np.uint16), _bfloat16_bits(value))
    model = load_models(workdir).models[0]
    assert {weight.dtype for weight in model.weights} == {"bfloat16"}
    first = next(weight for weight in model.weights if len(weight.shape) == 2)
    assert np.array_equal(np.asarray(first.numpy()).view(np.uint16), ours[next(
        name for name, value in ours.items() if value.shape == tuple(first.shape))].view(np.uint16))


@pytest.mark.parametrize("kind", ["whole", "sharded", "torch_sharded"])
def test_a_bfloat16_weight_source_rounds_each_tensor_a_block_of_rows_at_a_time_as_a_whole_read_would(
        checkpoints, kind, monkeypatch):
    """`WeightSource(..., "bfloat16").take` reads rows a block at a time (safetensors, shards, PyTorch shards) into
    one aligned bfloat16 array: the bits of the whole float32 tensor rounded; `exact` hands out float32."""
    from keras_transformer.imports import family
    from keras_transformer.imports.checkpoint import ALIGNMENT
    monkeypatch.setattr(family, "BLOCK_BYTES", 100)  # fewer bytes than a row: one row a block
    checkpoint = read_checkpoint(checkpoints[kind])
    whole, source = checkpoint.tensors(), family.WeightSource(checkpoint.tensors(), checkpoint.weights_file, "bfloat16")
    for name in whole:
        value = source.take(name, whole[name].shape)
        assert value.dtype.itemsize == 2 and value.ctypes.data % ALIGNMENT == 0 and value.flags.c_contiguous
        assert np.array_equal(value.view(np.uint16), _bfloat16_bits(whole[name])), name
    assert source.unused() == []
    assert source.take(name, whole[name].shape, exact=True).dtype == np.float32


def test_a_large_bfloat16_matrix_becomes_the_variable_s_memory_bit_for_bit():
    """The no-copy path of `assign_array` (DLPack has no bfloat16: its bits go as uint16) keeps every bit, and the
    variable takes over the array's memory."""
    import keras
    import ml_dtypes

    from keras_transformer.imports.checkpoint import aligned_empty
    from keras_transformer.imports.tensorflow_weights import LARGE_BYTES, assign_array
    rows, columns = 1024, 1536
    assert rows * columns * 2 > LARGE_BYTES
    bits = np.random.default_rng(0).integers(0, 0x7F7F, (rows, columns), dtype=np.uint16)  # finite values
    value = aligned_empty((rows, columns), ml_dtypes.bfloat16)
    value.view(np.uint16)[...] = bits
    variable = keras.Variable(np.zeros((rows, columns), np.float32), dtype="bfloat16")
    assign_array(variable, value)
    assert np.array_equal(np.asarray(variable.numpy()).view(np.uint16), bits)
    value.view(np.uint16)[0, 0] = 0x3F80  # 1.0: the variable's memory is the array's
    assert float(variable.numpy()[0, 0]) == 1.0


def test_a_large_float32_matrix_is_rounded_to_a_bfloat16_variable_as_astype_rounds():
    """`assign_array` rounds a float32 array for a bfloat16 variable straight into the memory the variable takes
    (one copy): to nearest, ties to even, as computed on the bits here."""
    import keras

    from keras_transformer.imports.tensorflow_weights import LARGE_BYTES, assign_array
    value = np.random.default_rng(1).standard_normal((1024, 1536)).astype(np.float32)
    assert value.size * 2 > LARGE_BYTES
    variable = keras.Variable(np.zeros(value.shape, np.float32), dtype="bfloat16")
    assign_array(variable, value.T.T[:, ::-1])  # not contiguous: a copy, rounded on the way
    assert np.array_equal(np.asarray(variable.numpy()).view(np.uint16), _bfloat16_bits(value[:, ::-1]))


@pytest.mark.parametrize("kind", ["whole", "sharded"])
def test_opening_a_checkpoint_and_asking_for_names_reads_no_tensor(checkpoints, kind, monkeypatch):
    """The names and shapes come from the headers and the index: no tensor is read until it is asked for (a
    `Mapping`'s own `in` reads the value, which made an import read every tensor twice and the largest once more
    on opening)."""
    from keras_transformer.imports import checkpoint as checkpoint_module

    def refuse(self, name):
        raise AssertionError(f"{name} was read")

    monkeypatch.setattr(checkpoint_module.SafetensorsFile, "__getitem__", refuse)
    tensors = read_checkpoint(checkpoints[kind]).tensors()
    assert "model.shared.weight" in tensors and "no.such.weight" not in tensors
    assert len(tensors.shape("model.shared.weight")) == 2


@pytest.mark.parametrize("fault", ["missing_shard", "tensor_in_no_shard", "shard_outside"])
def test_a_faulty_index_ends_in_one_line_naming_it_and_writes_nothing(checkpoints, tmp_path, capsys, fault):
    folder = tmp_path / "faulty"
    shutil.copytree(checkpoints["sharded"], folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name, shard = next(iter(index["weight_map"].items()))
    if fault == "missing_shard":
        (folder / shard).unlink()
        error, words = CheckpointNotFoundError, f"{folder / shard} is missing: a shard"
    elif fault == "tensor_in_no_shard":
        other = next(other for other in index["weight_map"].values() if other != shard)
        index["weight_map"][name] = other
        error, words = CorruptFileError, f"{name} is in no shard"
    else:
        index["weight_map"][name] = "../" + shard
        error, words = CorruptFileError, "a file beside it is expected"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(error, match="^[^\n]+$") as raised:
        kt.import_checkpoint(folder, tmp_path / "workdir")
    assert words in str(raised.value)
    assert not (tmp_path / "workdir").exists() and sorted(path.name for path in tmp_path.iterdir()) == ["faulty"]
    from keras_transformer.cli import main
    assert main(["import", str(folder), "--workdir", str(tmp_path / "workdir")]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("keras-transformer import: error:")
    assert not (tmp_path / "workdir").exists()


# ------------------------------------------------------------------ hf:// names, offline
@pytest.fixture
def hub(checkpoints, tmp_path, monkeypatch):
    """A Hugging Face cache holding REPOSITORY (the sharded checkpoint) as huggingface_hub lays it out, offline;
    KERAS_TRANSFORMER_HOME in tmp_path. Returns the package's cache folder."""
    repository = tmp_path / "hf" / "hub" / f"models--{REPOSITORY.replace('/', '--')}"
    shutil.copytree(checkpoints["sharded"], repository / "snapshots" / COMMIT)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KERAS_TRANSFORMER_HOME", str(tmp_path / "kt"))
    return tmp_path / "kt"


def test_an_hf_name_imports_once_into_the_cache_and_is_reused_offline(checkpoints, hub, monkeypatch):
    from keras_transformer.engines.loader import hf_models
    cached = hub / "hf" / REPOSITORY
    assert hf_models([f"hf://{REPOSITORY}"]) == [cached]
    ours = _h5_arrays(cached / "checkpoints" / "ckpt-0000.weights.h5")
    expected = _h5_arrays(checkpoints["workdir"] / "checkpoints" / "ckpt-0000.weights.h5")
    assert all(np.array_equal(ours[name], value) for name, value in expected.items())
    record = json.loads((cached / "imported.json").read_text())
    assert record["source"] == f"hf://{REPOSITORY}" and record["folder"].endswith(COMMIT)
    assert sorted(path.name for path in cached.parent.iterdir()) == [cached.name]  # no staging folder left

    def no_second_import(*args, **kwargs):
        raise AssertionError("imported again")

    monkeypatch.setattr(hf_cache, "import_checkpoint", no_second_import)
    shutil.rmtree(hub.parent / "hf")  # the Hugging Face cache gone: the cached workdir alone serves
    assert hf_models(f"hf://{REPOSITORY}") == cached


def test_two_imports_at_once_leave_the_first_rename_s_copy(hub, monkeypatch):
    real = hf_cache.import_checkpoint
    cached = hub / "hf" / REPOSITORY

    def import_while_another_process_finishes_first(source, workdir):
        real(source, workdir)
        shutil.copytree(workdir, cached)  # the other process's import, renamed into place first
        (cached / "winner").write_text("")
        return workdir

    monkeypatch.setattr(hf_cache, "import_checkpoint", import_while_another_process_finishes_first)
    assert hf_cache.hf_model(f"hf://{REPOSITORY}") == cached
    assert (cached / "winner").is_file() and (cached / "model.yaml").is_file()
    assert sorted(path.name for path in cached.parent.iterdir()) == [cached.name]  # ours dropped


def test_hf_name_faults_end_in_one_line(hub, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="^hf://opus-mt is not a Hugging Face model name: [^\n]+$"):
        kt.load_translator("hf://opus-mt")
    from keras_transformer.cli import main
    assert main(["translate", "--model", "hf://test-org/absent", "A dog."]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-transformer translate: error: test-org/absent is not in "
                                                   "the Hugging Face cache"), lines
    with pytest.raises(CheckpointNotFoundError, match="^test-org/absent is not in the Hugging Face cache .* "
                                                      "HF_HUB_OFFLINE forbids downloading it[^\n]+$"):
        kt.load_translator("hf://test-org/absent")
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", unreachable)
    with pytest.raises(CheckpointNotFoundError, match="^test-org/absent: the Hugging Face Hub cannot be reached, "
                                                      "and the model is not in its cache [^\n]+$"):
        kt.load_translator("hf://test-org/absent")
    assert not (hub / "hf" / "test-org" / "absent").exists()


@pytest.mark.slow
def test_load_translator_translate_and_serve_take_an_hf_name(checkpoints, hub, capsys):
    """load_translator, translate and serve take `hf://...` (serve's NAME=hf://... too) and translate as the
    imported workdir: three translators loaded (graph tracing), more than a fast test may cost."""
    from keras_transformer.cli import main
    from keras_transformer.cli.arguments import build_parser
    from keras_transformer.cli.commands import _hf_model
    sentences = ["A man rides a bike.", "A girl."]
    expected = kt.load_translator(checkpoints["workdir"])(sentences)
    assert kt.load_translator(f"hf://{REPOSITORY}")(sentences) == expected
    assert main(["translate", "--model", f"hf://{REPOSITORY}", *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    cached = str(hub / "hf" / REPOSITORY)
    args = build_parser().parse_args(["serve", "--model", f"en_de=hf://{REPOSITORY}", "--model", "x=runs/a"])
    assert [_hf_model(args, value) for value in args.model] == [f"en_de={cached}", "x=runs/a"]
