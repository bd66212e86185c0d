"""Where an XLA-compiled beam search spends its time, by kind of XLA operation (issue #65: the search's own overhead).

The shipped EN-DE model (or `--model`, any export or workdir `load_translator` reads) searches test2016's first
`--sentences` sentences (each size a batch of its own: beam 4, alpha 0.6, the early exit, as the SavedModel's
search). After two warm-up calls, `--calls` searches run under TensorFlow's profiler; the XLA CPU runtime records
one event per executed operation (a "thunk": a matrix product, a fusion of elementwise operations, a gather, a
copy...). Events are summed by kind (the operation's name without its number) and divided by `--calls`: the table
gives milliseconds per search and the share of all the operations' time. Matrix products by the weights are the
`MatMul` kinds; `dot` is attention's products over the cache and the source; `gather_*` and `*select*` fusions
the beams' cache reorder; `copy` the buffers XLA copies back into the loop's state.

    python bench/search_profile.py                       # 1, 8 and 64 sentences
    python bench/search_profile.py --sentences 64 --calls 5 --top 12
"""

import argparse
import collections
import gzip
import os
import pathlib
import re
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def thunk_times(trace_folder):
    """`{kind: total ms}` of the XLA runtime's operation events in the profiler's trace under `trace_folder`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    kinds = collections.Counter()
    for path in pathlib.Path(trace_folder).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            names = {key: value.name for key, value in plane.event_metadata.items()}
            for line in plane.lines:
                if "Eigen" not in line.name:  # the intra-op pool's threads run the compiled program's operations
                    continue
                for event in line.events:
                    name = names.get(event.metadata_id, "?")
                    if name.startswith(("ThunkExecutor", "while", "SlinkyThreadPool")):
                        continue  # containers of the operations below, not operations
                    kinds[re.sub(r"[._]?\d+$", "", name)] += event.duration_ps / 1e9
    return kinds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "saved_models" / "multi30k_en_de"))
    parser.add_argument("--sentences", default="1,8,64", help="batch sizes, comma-separated")
    parser.add_argument("--calls", type=int, default=3, help="profiled searches per batch size")
    parser.add_argument("--top", type=int, default=10, help="kinds listed per batch size")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from keras_transformer import decoding, load_translator

    with gzip.open(MULTI30K / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as handle:
        lines = [line.strip() for line in handle]
    translator = load_translator(args.model, beam_size=4, alpha=0.6)
    model = translator.model

    @tf.function(jit_compile=True, autograph=False)
    def search(source):
        return decoding.beam_search(model, source, beam_size=4, alpha=0.6, max_extra=50, early_exit=True,
                                    first_cache_stage=decoding.search.FIRST_CACHE_STAGE, return_steps=True)

    print(f"CPU: {_cpu_name()}; load average {os.getloadavg()[0]:.2f}")
    for size in (int(value) for value in args.sentences.split(",")):
        source = translator.encode_sources(tf.constant(lines[:size]))
        steps = int(search(source)[2])
        search(source)
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            tf.profiler.experimental.start(folder)
            for _ in range(args.calls):
                tf.nest.map_structure(lambda tensor: tensor.numpy(), search(source))
            tf.profiler.experimental.stop()
            wall = (time.perf_counter() - start) / args.calls
            kinds = thunk_times(folder)
        total = sum(kinds.values())
        print(f"\n{size} sentence(s), {steps} steps: {1000 * wall:.1f} ms per search under the profiler, "
              f"its operations {total / args.calls:.1f} ms (summed over threads)\n")
        print("| operation kind | ms per search | share |")
        print("| --- | ---: | ---: |")
        for kind, ms in kinds.most_common(args.top):
            print(f"| {kind} | {ms / args.calls:.1f} | {100 * ms / total:.1f}% |")
        rest = total - sum(ms for _, ms in kinds.most_common(args.top))
        others = max(len(kinds) - args.top, 0)
        print(f"| the other {others} kinds | {rest / args.calls:.1f} | {100 * rest / total:.1f}% |")


def _cpu_name():
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
