"""How memory and start-up scale with the corpus: the stock EN-DE recipe on Multi30k repeated to a given size.

    .venv/bin/python bench/large_corpus.py --sizes 0.5M,4.5M [--folder /big/disk/corpora] [--vocab-size 32000]

For each size, the Multi30k training pairs (`../shared/data/multi30k/train.{en,de}.gz`) are repeated, in
order, to that many pairs and written as `train.en.gz` / `train.de.gz` under `--folder` (default: a temporary
folder, removed at the end; a given folder keeps them and a later run reuses them). Then the real command

    keras-transformer train --config configs/multi30k_en_de.yaml --workdir <fresh> \
        --set data.train_source=<corpus>/train.en.gz --set data.train_target=<corpus>/train.de.gz \
        --set data.vocab_size=32000 --set training.checkpoint_every_steps=5 ...

runs in a subprocess of its own, from the corpus folder, with the recipe's relative file paths made absolute and
`--tree` (default: this checkout) first on `PYTHONPATH`, so `--tree ../other-checkout` measures another version
of the package (the path of the package imported is printed). The run learns its shared vocabulary from the
corpus, as a user's first run does. Its fifth update is seen when `checkpoints/step-00000005.weights.h5`
appears (`training.checkpoint_every_steps=5`: written right after that update), and the run is then stopped.
While it runs, the resident memory of its whole process tree is summed from `/proc` every 0.2 s; the peak is
the larger of that and the largest single process's `ru_maxrss`. Linux only.

Columns: pairs; peak RSS (GB); seconds from start to the vocabulary stored (the "Vocabulary of ... stored" log
line, `-` when the run did not print it); seconds from start to the fifth update. The output of each run is kept
in `<folder>/<size>/train.log` when `--folder` is given.

With `--packed`, the packed path instead: `keras-transformer pack` with the same overrides (peak RSS and seconds
to its end), then `keras-transformer train-packed WORKDIR --epochs 1` (peak RSS and seconds to its fifth
update, seen the same way); logs in `pack.log` and `arrays.log`.
"""

import argparse
import gzip
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
RECIPE = REPO / "configs" / "multi30k_en_de.yaml"
UPDATES = 5


def parse_size(text):
    """'4.5M' -> 4500000, '500k' -> 500000, '29000' -> 29000."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 500k, 4.5M, 29000)")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    return int(round(float(match.group(1)) * scale))


def label(pairs):
    """4500000 -> '4.5M'."""
    if pairs >= 1_000_000:
        return f"{pairs / 1_000_000:g}M"
    return f"{pairs / 1_000:g}k" if pairs >= 1_000 else str(pairs)


def build_corpus(folder, pairs):
    """Writes `folder/train.en.gz` and `folder/train.de.gz`: Multi30k's training pairs repeated to `pairs`.

    A folder that already holds a corpus of that size (its `pairs.txt`) is reused."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "pairs.txt"
    if marker.is_file() and marker.read_text().strip() == str(pairs):
        return
    for language in ("en", "de"):
        with gzip.open(MULTI30K / f"train.{language}.gz", "rb") as handle:
            lines = handle.read().splitlines(keepends=True)
        block = b"".join(lines)
        whole, rest = divmod(pairs, len(lines))
        temporary = folder / f".train.{language}.gz.tmp"
        with gzip.open(temporary, "wb", compresslevel=1) as out:
            for _ in range(whole):
                out.write(block)
            out.write(b"".join(lines[:rest]))
        os.replace(temporary, folder / f"train.{language}.gz")
    marker.write_text(f"{pairs}\n")


def tree_rss(root):
    """Resident bytes of `root` and all its descendants, from /proc."""
    children, rss = {}, {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid, parent = int(entry), int(fields[1])
        children.setdefault(parent, []).append(pid)
        rss[pid] = int(fields[21]) * page
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def absolute_paths():
    """`--set` overrides that make the recipe's relative data paths absolute (relative to this checkout)."""
    import yaml

    data = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))["data"]
    return [f"data.{key}={json.dumps(str((REPO / value).resolve()))}" for key, value in data.items()
            if isinstance(value, str) and value.startswith("..")]


def environment(tree):
    """The environment of the subprocesses: `tree` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach the pipe as they are written: their times are the events'
    return env


def settings(corpus, vocab_size, extra):
    """The `--set` overrides of a run on `corpus`."""
    return [*absolute_paths(), f"data.train_source={corpus / 'train.en.gz'}",
            f"data.train_target={corpus / 'train.de.gz'}", f"data.vocab_size={vocab_size}",
            f"training.checkpoint_every_steps={UPDATES}", "training.epochs=1", "training.verbose=2", *extra]


def measure(command, cwd, env, target, timeout, log_path):
    """Runs `command` until the file `target` appears (then stops it), or to its end when `target` is None.

    Returns `(peak_bytes, vocabulary_seconds, seconds)`: the peak RSS of its process tree, when it logged its
    vocabulary stored (None if it did not), and when `target` appeared (or the command ended)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, env=env)
    seen = {}

    def read_output():
        with open(log_path, "wb") as log:
            for line in process.stdout:
                log.write(line)
                if b"Vocabulary of" in line and b"stored in" in line and "vocabulary" not in seen:
                    seen["vocabulary"] = time.perf_counter() - start

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    peak, done = 0, None
    try:
        while process.poll() is None:
            peak = max(peak, tree_rss(process.pid))
            if target is not None and target.exists():
                done = time.perf_counter() - start
                break
            if time.perf_counter() - start > timeout:
                break
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        reader.join(timeout=10)
    if target is None and process.returncode == 0:
        done = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after > before:  # this command's largest process (the maximum over every child waited for so far)
        peak = max(peak, after * 1024)
    if done is None:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        what = f"reach update {UPDATES}" if target is not None else "finish"
        raise SystemExit(f"{' '.join(command[:4])} did not {what} (exit {process.returncode}, "
                         f"{time.perf_counter() - start:.0f} s); its output ends:\n" + "\n".join(tail))
    return peak, seen.get("vocabulary"), done


def run_train(corpus, workdir, vocab_size, extra, timeout, env):
    """`train` to its fifth update: `(peak_bytes, vocabulary_seconds, update_seconds)`."""
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--config", str(RECIPE),
               "--workdir", str(workdir)]
    for setting in settings(corpus, vocab_size, extra):
        command += ["--set", setting]
    target = workdir / "checkpoints" / f"step-{UPDATES:08d}.weights.h5"
    return measure(command, corpus, env, target, timeout, corpus / "train.log")


def run_packed(corpus, workdir, vocab_size, extra, timeout, env):
    """`pack`, then `keras-transformer train-packed` to its fifth update:
    `(pack_peak, pack_seconds, train_peak, update_seconds)`."""
    command = [sys.executable, "-m", "keras_transformer.cli", "pack", "--config", str(RECIPE),
               "--workdir", str(workdir)]
    for setting in settings(corpus, vocab_size, extra):
        command += ["--set", setting]
    pack_peak, _, pack_seconds = measure(command, corpus, env, None, timeout, corpus / "pack.log")
    command = [sys.executable, "-m", "keras_transformer.cli", "train-packed", str(workdir), "--epochs", "1"]
    target = workdir / "checkpoints" / f"step-{UPDATES:08d}.weights.h5"
    train_peak, _, updated = measure(command, corpus, env, target, timeout, corpus / "arrays.log")
    return pack_peak, pack_seconds, train_peak, updated


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.5M,4.5M",
                        help="comma-separated corpus sizes in pairs (500k, 4.5M, 13.5M, ...)")
    parser.add_argument("--folder", type=pathlib.Path, default=None,
                        help="where the corpora are written and kept (default: a temporary folder, removed after)")
    parser.add_argument("--vocab-size", type=int, default=32000, help="the shared vocabulary the run learns")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a further override for train (repeatable)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    parser.add_argument("--packed", action="store_true",
                        help="measure the packed path instead: `pack` (peak RSS, seconds), then "
                             "`keras-transformer train-packed` to its fifth update (peak RSS, seconds)")
    parser.add_argument("--tree", type=pathlib.Path, default=REPO,
                        help="the checkout whose keras_transformer is measured (default: this one)")
    args = parser.parse_args()
    env = environment(args.tree.resolve())
    package = subprocess.run([sys.executable, "-c", "import keras_transformer; print(keras_transformer.__file__)"],
                             env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    print(f"keras_transformer: {package.stdout.strip()}", flush=True)
    sizes = [parse_size(size) for size in args.sizes.split(",") if size.strip()]
    if args.folder is not None and args.folder.resolve().is_relative_to(REPO):
        parser.error(f"--folder {args.folder} is inside the repository; corpora never go there")
    folder = args.folder or pathlib.Path(tempfile.mkdtemp(prefix="large_corpus_"))
    rows = []
    try:
        for pairs in sizes:
            corpus = folder / label(pairs)
            start = time.perf_counter()
            build_corpus(corpus, pairs)
            print(f"{label(pairs)} pairs: corpus ready in {time.perf_counter() - start:.0f} s ({corpus})",
                  flush=True)
            workdir = pathlib.Path(tempfile.mkdtemp(prefix="run_", dir=folder))
            try:
                run = run_packed if args.packed else run_train
                rows.append((pairs, *run(corpus, workdir, args.vocab_size, args.set, args.timeout, env)))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            print(f"{label(pairs)} pairs: {rows[-1][1:]}", flush=True)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    if args.packed:
        print(f"\n| pairs | pack: peak RSS (GB) | pack (s) | arrays: peak RSS (GB) | arrays: update {UPDATES} (s) |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for pairs, pack_peak, pack_seconds, train_peak, updated in rows:
            print(f"| {label(pairs)} | {pack_peak / 1e9:.2f} | {pack_seconds:.0f} | {train_peak / 1e9:.2f} | "
                  f"{updated:.0f} |")
        return
    print(f"\n| pairs | peak RSS (GB) | vocabulary stored (s) | update {UPDATES} (s) |")
    print("| ---: | ---: | ---: | ---: |")
    for pairs, peak, vocabulary, updated in rows:
        stored = "-" if vocabulary is None else f"{vocabulary:.0f}"
        print(f"| {label(pairs)} | {peak / 1e9:.2f} | {stored} | {updated:.0f} |")


if __name__ == "__main__":
    main()
