"""A child process's own peak RSS, for the memory benches, with a cap above which it is killed.

The child reports its peak as Linux's `VmHWM` at its end (it starts afresh at `exec`; `ru_maxrss` of
`RUSAGE_CHILDREN` does not: it is the largest of every child waited for, and a child started by `vfork`/`exec`
carries its parent's peak into its own). Meanwhile the parent reads the child's `VmRSS` every 50 ms and kills it
above `cap_mib`, for a machine whose memory others share.
"""

import subprocess
import sys
import threading
import time

REPORT = ("import atexit\n"
          "atexit.register(lambda: print('PEAK_KIB', next(line.split()[1] for line in open('/proc/self/status') "
          "if line.startswith('VmHWM')), flush=True))\n")


def resident_mib(pid):
    """The process's resident memory now (MiB), or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return 0.0


def run_child(code, arguments=(), cap_mib=None, env=None):
    """Runs `python -c CODE ARGUMENTS`; returns `(seconds, peak MiB, stdout)`, the peak None when the child was
    killed at `cap_mib` (its output then ends where it was killed). A child that fails otherwise raises."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", REPORT + code, *arguments], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    killed = threading.Event()

    def watch():
        while child.poll() is None:
            if cap_mib is not None and resident_mib(child.pid) > cap_mib:
                killed.set()
                child.kill()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout, stderr = child.communicate()
    watcher.join()
    seconds = time.perf_counter() - start
    if killed.is_set():
        return seconds, None, stdout
    if child.returncode != 0:
        raise RuntimeError(f"the child failed ({child.returncode}):\n{stderr[-3000:]}")
    peak = next(int(line.split()[1]) for line in stdout.splitlines() if line.startswith("PEAK_KIB"))
    return seconds, peak / 1024, stdout
