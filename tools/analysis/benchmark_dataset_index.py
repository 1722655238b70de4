"""Start-up time and memory of the ImageNet-21k list-file dataset: vit_plugin's index vs mmpretrain's.

``python tools/analysis/benchmark_dataset_index.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_dataset_index`.
"""
from benchmarks.benchmark_dataset_index import main

if __name__ == '__main__':
    main()
