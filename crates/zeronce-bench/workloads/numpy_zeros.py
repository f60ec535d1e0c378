"""NumPy arrays calloc'ed, only read and freed, in a loop: what `np.zeros(n).sum()` costs.

Run it with and without the library (Debian's /usr/bin/python3 has NumPy):

    /usr/bin/python3 numpy_zeros.py
    LD_PRELOAD=$PWD/target/release/libzeronce.so /usr/bin/python3 numpy_zeros.py

Prints one JSON line: the loop's wall time and the process's peak RSS. Each array is
128 MiB of float64 that no one writes: the kernel's zero page stands behind every page
read. An allocator that counts a freed buffer as written zeroes (and faults in) the next
one; one that unmaps it (glibc) faults the next one in through the zero page again.
"""
import json
import resource
import sys
import time

import numpy as np

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
t = time.perf_counter()
total = 0.0
for _ in range(ROUNDS):
    total += np.zeros(16 << 20).sum()
wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"workload": "numpy_zeros", "rounds": ROUNDS, "sum": total,
                  "wall_ms": round(wall * 1e3, 1), "peak_rss_mib": round(peak, 1)}))
