"""Training-step time and peak memory of the ViT Mask R-CNN, with/without activation checkpointing,
windowed attention and ViTDet's relative position bias.

``python tools/analysis/benchmark_detection.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_detection`.
"""
from benchmarks.benchmark_detection import main

if __name__ == '__main__':
    main()
