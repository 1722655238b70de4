"""Per-iteration cost of the non-finite guard and of the pre-emption check, in real mmengine runs.

``python tools/analysis/benchmark_hooks.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_hooks`.
"""
from benchmarks.benchmark_hooks import main

if __name__ == '__main__':
    main()
