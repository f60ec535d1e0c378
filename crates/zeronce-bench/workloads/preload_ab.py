#!/usr/bin/env python3
"""Rotated A/B rounds of one command under several preloaded allocators (BENCHMARKS.md).

    preload_ab.py ROUNDS CONTENDERS [--key KEY] -- COMMAND...

CONTENDERS is a comma-separated list of libraries to put in LD_PRELOAD (`none`: the
program's own allocator), each optionally followed by `|VAR=VALUE` settings. Every round
runs each contender once, the order rotated by one each round, so no contender is always
first after an idle pause. The figure of a run is the number KEY of the JSON object on the
command's last line of output (e.g. `wall_ms` of `malloc_work`), or without --key the
run's wall time in ms. Printed per contender: median, quartiles, and the median of the
round-by-round ratios to the last contender ("paired").
"""
import json
import os
import statistics
import subprocess
import sys
import time


def main(argv):
    if "--" not in argv or len(argv) < 4:
        sys.exit(__doc__)
    cut = argv.index("--")
    opts, command = argv[1:cut], argv[cut + 1 :]
    rounds, contenders = int(opts[0]), opts[1].split(",")
    key = opts[opts.index("--key") + 1] if "--key" in opts else None
    figures = {c: [] for c in contenders}
    for r in range(rounds):
        for k in range(len(contenders)):
            contender = contenders[(r + k) % len(contenders)]
            lib, *settings = contender.split("|")
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            if lib != "none":
                env["LD_PRELOAD"] = lib
            for s in settings:
                name, value = s.split("=", 1)
                env[name] = value
            start = time.perf_counter()
            run = subprocess.run(command, env=env, capture_output=True, text=True)
            wall = (time.perf_counter() - start) * 1e3
            if run.returncode != 0:
                sys.exit(f"{contender}: exit {run.returncode}: {run.stderr.strip()}")
            if key is None:
                figures[contender].append(wall)
            else:
                figures[contender].append(json.loads(run.stdout.strip().splitlines()[-1])[key])
    base = figures[contenders[-1]]
    for c in contenders:
        v = sorted(figures[c])
        paired = statistics.median(x / y for x, y in zip(figures[c], base))
        print(
            f"{c:<50} median {statistics.median(v):9.2f}  q1 {v[len(v) // 4]:9.2f}  "
            f"q3 {v[3 * len(v) // 4]:9.2f}  paired/last {paired:.3f}"
        )


if __name__ == "__main__":
    main(sys.argv)
