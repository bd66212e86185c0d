"""The training process's malloc arenas (`trainer.malloc`): threads share one arena once the limit is set."""

import subprocess
import sys
import textwrap

import pytest

# Four threads, all alive at once, each allocating with the C library's malloc; then glibc's own report of its
# arenas (`malloc_info`, one <heap> element per arena). Without the limit each new thread gets an arena of its own.
_ARENAS = textwrap.dedent("""
    import ctypes, re, sys, tempfile, threading
    from keras_transformer.trainer.malloc import limit_malloc_arenas
    if sys.argv[1] == "limit":
        assert limit_malloc_arenas(1, environ={})
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
    barrier = threading.Barrier(4)

    def allocate():
        barrier.wait()
        blocks = [libc.malloc(1000) for _ in range(100)]
        barrier.wait()  # every thread holds its blocks (and its arena) until all have allocated
        for block in blocks:
            libc.free(block)

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    path = tempfile.mktemp()
    handle = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, handle)
    libc.fclose(handle)
    print(len(re.findall("<heap nr=", open(path).read())))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_with_the_limit_all_threads_allocate_from_one_arena():
    def arenas(mode):
        run = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, timeout=60,
                             env={"PYTHONPATH": ":".join(sys.path)})
        assert run.returncode == 0, run.stderr[-2000:]
        return int(run.stdout.split()[-1])

    assert arenas("limit") == 1
    assert arenas("default") >= 4  # the main thread's, and one for each thread (up to 8 per core)
