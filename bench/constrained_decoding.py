"""Lexical constraints on the shipped EN-DE model: constraints met, BLEU, and what they cost in time.

    python bench/constrained_decoding.py [--model saved_models/multi30k_en_de] [--seed 0] [--sentences 1000] \
        [--timing-sentences 300] [--single 40] [--rounds 3] [--before REV | --no-before]

The protocol of Post & Vilar (2018) and Hu et al. (2019): Multi30k test2016 (the first `--sentences` captions) is
translated without constraints (beam 4, batch 32); then, per sentence, 1 to 3 constraints (the count drawn
uniformly with `random.Random(seed)`) are drawn from its reference among the phrases of 1 to 3 words (the length
drawn uniformly) that the unconstrained output lacks (as whole words, case as written), none overlapping another,
none spanning punctuation, none over the engine's limit of 8 target tokens; a sentence whose reference offers none
gets none. The same sentences are translated again with their constraints (`translate_terms`). Reported: the share
of constraints met, by the engine's own `unmet` (token ids) and by a text check (the phrase as whole words in the
output), and BLEU of both outputs, cased sacreBLEU and by the published protocol (lowercased, Moses-tokenized
output against `*.lc.norm.tok.de`, `evaluation.multi30k_bleu`).

Speed, beam 4, after an untimed pass that traces every batch shape: seconds per sentence over the first
`--timing-sentences` sentences at batch 32, and the median time of one sentence alone (p50 over the first
`--single` sentences), constrained against unconstrained, the two alternating within each of `--rounds` rounds;
the figure is the median of the rounds' ratios. "No constraints" compares the unconstrained path of this checkout
against the same path at `--before` (default: the parent of the commit that added
`keras_transformer/decoding/constraints.py`), checked out with `git worktree` in a temporary folder: each runs in
a subprocess of its own, loaded and warmed once, and the two are timed in alternation on the same sentences (the
same model folder); `--before HEAD` times this checkout against itself, the harness's own bias (an A/A run). The
highest 1-minute load average seen is printed: on a loaded machine quote the ratios.
"""

import argparse
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from keras_transformer import evaluation  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "multi30k"
BEAM, BATCH = 4, 32
_EDGES = re.compile(r"^(\W*)(.*?)(\W*)$")  # a word's leading punctuation, its core, its trailing punctuation

# The timed side of "no constraints": run with `python -c` in a checkout (the working directory), it loads the
# translator with only what both checkouts have, translates every timed line once (tracing), then answers each
# "batch" or "single" line on stdin with the seconds of one pass.
WORKER = """
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.getcwd())
from keras_transformer import load_translator
model, count, single = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [line.rstrip("\\n") for line in sys.stdin.readline().split("\\t")][:count]
translator = load_translator(model, beam_size=%d)
translator.translate_lines(lines, batch_size=%d)
for line in lines[:single]:
    translator.translate_lines([line])
print("ready", flush=True)
for command in sys.stdin:
    start = time.perf_counter()
    if command.strip() == "batch":
        translator.translate_lines(lines, batch_size=%d)
        print(time.perf_counter() - start, flush=True)
    else:
        times = []
        for line in lines[:single]:
            start = time.perf_counter()
            translator.translate_lines([line])
            times.append(time.perf_counter() - start)
        print(sorted(times)[len(times) // 2], flush=True)
""" % (BEAM, BATCH, BATCH)


def phrases(reference):
    """The phrases of 1-3 words of `reference`, as `(first word, last word + 1, text)`: words split at spaces,
    the punctuation at the phrase's two edges left out, none with punctuation inside (across a comma)."""
    tokens = reference.split()
    cores = [_EDGES.match(token).groups() for token in tokens]
    out = []
    for start in range(len(tokens)):
        for length in (1, 2, 3):
            end = start + length
            if end > len(tokens):
                break
            inner = cores[start:end]
            if not all(core for _, core, _ in inner) or any(trail for _, _, trail in inner[:-1]) or \
                    any(lead for lead, _, _ in inner[1:]):
                continue
            out.append((start, end, " ".join(core for _, core, _ in inner)))
    return out


def contains(text, phrase):
    """Whether `phrase` occurs in `text` as whole words (case as written)."""
    return re.search(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", text) is not None


def draw_constraints(references, outputs, seed, fits):
    """Per sentence, 1-3 phrases of its reference that its unconstrained output lacks (the protocol above), each
    one that `fits` (at most `engines.terms.MAX_TERM_TOKENS` target tokens)."""
    rng = random.Random(seed)
    drawn = []
    for reference, output in zip(references, outputs):
        count = rng.randint(1, 3)
        candidates = [p for p in phrases(reference) if not contains(output, p[2]) and fits(p[2])]
        chosen = []
        while len(chosen) < count and candidates:
            length = rng.randint(1, 3)
            pool = [p for p in candidates if p[1] - p[0] == length] or candidates
            start, end, text = rng.choice(pool)
            chosen.append(text)
            candidates = [p for p in candidates if p[1] <= start or p[0] >= end]
        drawn.append(chosen)
    return drawn


def timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def paired(translator, lines, constraints, rounds, single):
    """`{"batch": (unconstrained s/sentence, constrained s/sentence, ratios), "single": (p50, p50, ratios)}`,
    medians over `rounds` rounds, the two searches alternating (which goes first alternates too)."""
    runs = {"batch": {"plain": [], "terms": []}, "single": {"plain": [], "terms": []}}
    for index in range(rounds):
        order = ("plain", "terms") if index % 2 == 0 else ("terms", "plain")
        for name in order:
            given = {} if name == "plain" else {"constraints": constraints}
            seconds = timed(lambda: translator.translate_lines(lines, batch_size=BATCH, **given))
            runs["batch"][name].append(seconds / len(lines))
        times = {"plain": [], "terms": []}
        for i in range(single):  # one sentence at a time, the two searches in turn
            for name in order:
                given = {} if name == "plain" else {"constraints": [constraints[i]]}
                times[name].append(timed(lambda: translator.translate_lines([lines[i]], **given)))
        for name in order:
            runs["single"][name].append(statistics.median(times[name]))
    return {kind: (statistics.median(r["plain"]), statistics.median(r["terms"]),
                   [t / p for p, t in zip(r["plain"], r["terms"])]) for kind, r in runs.items()}


def before_commit():
    """The parent of the commit that added `keras_transformer/decoding/constraints.py`."""
    added = subprocess.run(["git", "-C", str(REPO), "log", "--diff-filter=A", "--format=%H", "--",
                            "keras_transformer/decoding/constraints.py"], capture_output=True, text=True, check=True)
    commits = added.stdout.split()
    if not commits:
        raise SystemExit("git log finds no commit that added keras_transformer/decoding/constraints.py; give --before")
    short = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", commits[-1] + "^"], capture_output=True,
                           text=True, check=True)
    return short.stdout.strip()


def worker(checkout, model, lines, single):
    process = subprocess.Popen([sys.executable, "-c", WORKER, model, str(len(lines)), str(single)], cwd=checkout,
                               env={**os.environ, "PYTHONPATH": str(checkout)}, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    process.stdin.write("\t".join(lines) + "\n")
    process.stdin.flush()
    return process


def ask(process, command):
    process.stdin.write(command + "\n")
    process.stdin.flush()
    answer = process.stdout.readline()
    if not answer:
        raise SystemExit(f"a timing subprocess ended (exit status {process.wait()})")
    return float(answer)


def today_vs_before(revision, model, lines, rounds, single):
    """`{"batch": (before s/sentence, today s/sentence, ratios), "single": (...)}`: the unconstrained path of this
    checkout and of `revision`, each in its own subprocess, alternating, paired ratios today / before."""
    with tempfile.TemporaryDirectory() as folder:
        old = pathlib.Path(folder) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), revision], check=True,
                       capture_output=True)
        try:
            processes = {"before": worker(old, model, lines, single), "today": worker(REPO, model, lines, single)}
            for name, process in processes.items():
                if process.stdout.readline().strip() != "ready":
                    raise SystemExit(f"the {name} subprocess did not start (exit status {process.wait()})")
            runs = {"batch": {"before": [], "today": []}, "single": {"before": [], "today": []}}
            for index in range(rounds):
                order = ("before", "today") if index % 2 == 0 else ("today", "before")
                for kind in ("batch", "single"):
                    for name in order:
                        seconds = ask(processes[name], kind)
                        runs[kind][name].append(seconds / len(lines) if kind == "batch" else seconds)
            for process in processes.values():
                process.stdin.close()
                process.wait()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
    return {kind: (statistics.median(r["before"]), statistics.median(r["today"]),
                   [t / b for b, t in zip(r["before"], r["today"])]) for kind, r in runs.items()}


def speed_row(label, pair, goal):
    first, second, ratios = pair
    return (f"| {label} | {first * 1000:.1f} ms / {second * 1000:.1f} ms: "
            f"{statistics.median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)}) | {goal} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "saved_models" / "multi30k_en_de"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, default=1000, help="the first N test2016 sentences for quality")
    parser.add_argument("--timing-sentences", type=int, default=300, help="the first N of them timed at batch 32")
    parser.add_argument("--single", type=int, default=40, help="the first N of them timed one at a time")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, the two sides alternating")
    parser.add_argument("--before", help="the revision 'no constraints' compares against (default: the parent of "
                        "the commit that added decoding/constraints.py)")
    parser.add_argument("--no-before", action="store_true", help="skip the comparison with --before")
    parser.add_argument("--no-timing", action="store_true", help="quality only")
    args = parser.parse_args(argv)

    from keras_transformer import load_translator

    source = evaluation.read_lines(DATA / "test_2016_flickr.en.gz")[:args.sentences]
    references = evaluation.read_lines(DATA / "test_2016_flickr.de.gz")[:args.sentences]
    tokenized = evaluation.read_lines(DATA / "test_2016_flickr.lc.norm.tok.de.gz")[:args.sentences]
    load = os.getloadavg()[0]
    translator = load_translator(args.model, beam_size=BEAM)
    plain = translator.translate_lines(source, batch_size=BATCH)
    from keras_transformer.engines.terms import MAX_TERM_TOKENS
    constraints = draw_constraints(references, plain, args.seed,
                                   lambda phrase: len(translator.term_tokens(phrase)) <= MAX_TERM_TOKENS)
    found = translator.translate_terms(source, constraints=constraints, batch_size=BATCH)
    forced = [hypotheses[0]["translation"] for hypotheses in found]
    total = sum(len(c) for c in constraints)
    met_ids = total - sum(len(hypotheses[0]["unmet"]) for hypotheses in found)
    met_text = sum(contains(output, phrase) for output, terms in zip(forced, constraints) for phrase in terms)
    for number, (output, terms) in enumerate(zip(forced, constraints), 1):
        for phrase in terms:
            if not contains(output, phrase):
                print(f"sentence {number}: {phrase!r} not in {output!r}", file=sys.stderr)
    sizes = [len(c) for c in constraints]
    words = [len(phrase.split()) for c in constraints for phrase in c]
    untouched = sum(a == b for a, b, c in zip(plain, forced, constraints) if not c)
    quality = {name: (evaluation.multi30k_bleu(out, tokenized, "de").score, evaluation.bleu(out, references).score)
               for name, out in (("unconstrained", plain), ("constrained", forced))}
    load = max(load, os.getloadavg()[0])
    print("quality done", file=sys.stderr, flush=True)
    if not args.no_timing:
        lines, terms = source[:args.timing_sentences], constraints[:args.timing_sentences]
        translator.translate_lines(lines, batch_size=BATCH, constraints=terms)  # traces every shape
        for line, term in list(zip(lines, terms))[:args.single]:
            translator.translate_lines([line], constraints=[term])
        speed = paired(translator, lines, terms, args.rounds, min(args.single, len(lines)))
        load = max(load, os.getloadavg()[0])
        if not args.no_before:
            revision = args.before or before_commit()
            before = today_vs_before(revision, args.model, lines, args.rounds,
                                     min(args.single, len(lines)))
            load = max(load, os.getloadavg()[0])

    print(f"\n{len(source):,} sentences of Multi30k test2016, {os.path.basename(args.model)}, beam {BEAM}, batch "
          f"{BATCH}; {total:,} constraints (seed {args.seed}) on {sum(map(bool, sizes)):,} sentences: "
          f"{', '.join(f'{sizes.count(k)} with {k}' for k in (0, 1, 2, 3))}; phrases of 1/2/3 words: "
          f"{', '.join(str(words.count(k)) for k in (1, 2, 3))}; highest 1-minute load average seen: {load:.1f}\n")
    print("| measure | result | goal |")
    print("| --- | --- | --- |")
    print(f"| constraints met: by the engine (`unmet`); as whole words in the text | {met_ids / total:.1%} "
          f"({met_ids:,}/{total:,}); {met_text / total:.1%} | 100% |")
    print(f"| sentences without constraints: the same output as unconstrained | {untouched}/{sizes.count(0)} "
          "| all |")
    for name, (lc_tok, cased) in quality.items():
        print(f"| BLEU lc.tok / cased: {name} | {lc_tok:.2f} / {cased:.2f} | |")
    gain = [quality["constrained"][k] - quality["unconstrained"][k] for k in (0, 1)]
    print(f"| BLEU gain lc.tok / cased | {gain[0]:+.2f} / {gain[1]:+.2f} | several points (papers) |")
    if args.no_timing:
        return 0
    count = len(lines)
    print(speed_row(f"per sentence at batch {BATCH} ({count} sentences), unconstrained / constrained, median of "
                    f"{args.rounds} paired rounds", speed["batch"], "at most 1.5x"))
    print(speed_row(f"one sentence alone, p50 of {min(args.single, count)}, unconstrained / constrained",
                    speed["single"], "at most 1.5x"))
    if not args.no_before:
        print(speed_row(f"no constraints, per sentence at batch {BATCH}: before ({revision}) / today",
                        before["batch"], "at most 1.0x (within noise)"))
        print(speed_row("no constraints, one sentence alone, p50: before / today", before["single"],
                        "at most 1.0x (within noise)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
