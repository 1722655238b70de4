"""XLA compile time of a ViT training step, blocks unrolled against blocks in one scanned loop.

``python tools/analysis/benchmark_xla_compile.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_xla_compile`.
"""
from benchmarks.benchmark_xla_compile import main

if __name__ == '__main__':
    main()
