"""Samples per second per core of training input read from tar shards (local, over HTTP, through the
webdataset library) against the folder layout; the shard index's build time and memory.

``python tools/analysis/benchmark_shards.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_shards`.
"""
from benchmarks.benchmark_shards import main

if __name__ == '__main__':
    main()
