#!/usr/bin/env python3
"""How much slower than a quiet machine this one runs now: the factor the tests' time bounds are scaled by.

A fixed CPU-bound loop (2,000,000 iterations) is timed three times, on the wall clock and in CPU time. Two things
make a machine slow for the tests, and the factor is their product:
  - a share of a core below one (other work on the cores): the wall time over the CPU time the loop took;
  - a core slower than a current server's: the CPU time over REF, the time such a core takes when quiet (0.10 to
    0.23 s measured on a 2-core Xeon VM with AVX-512, 2026-12-05, rounded up), where it is above.
The median of the three products, never below 1 and at most 8, rounded up to a tenth. A machine loaded twice
over gives about 2. Prints the factor, and with -v the measurements on stderr."""
import math
import statistics
import sys
import time

REF = 0.25  # seconds of CPU time of the loop on a quiet current server core (see above), rounded up


def one() -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    for i in range(2_000_000):
        x += i * i
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    runs = [one() for _ in range(3)]
    slow = statistics.median(w / max(c, 1e-6) * max(1.0, c / REF) for w, c in runs)
    factor = min(8.0, max(1.0, math.ceil(slow * 10) / 10))
    if "-v" in sys.argv[1:]:
        print(f"time_scale: wall {', '.join(f'{w:.3f}' for w, _ in runs)} s, cpu "
              f"{', '.join(f'{c:.3f}' for _, c in runs)} s (a quiet core: {REF} s of cpu): factor {factor}",
              file=sys.stderr)
    print(factor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
