"""Throughput and peak memory of vit_plugin's ViT against timm's and mmpretrain's, in one process.

``python tools/analysis/benchmark.py --help`` lists the options; the code is
:mod:`vit_plugin.benchmarks.benchmark_models`.
"""
from vit_plugin.benchmarks.benchmark_models import main

if __name__ == '__main__':
    main()
