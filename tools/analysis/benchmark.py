"""Throughput and peak memory of vit_plugin's ViT against timm's and mmpretrain's, in one process.

``python tools/analysis/benchmark.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_models`.
"""
from benchmarks.benchmark_models import main

if __name__ == '__main__':
    main()
