"""What the bad-input checks cost: the label check of a list file at ImageNet-21k size, and the
truncation / size / format checks of every image decode.

``python tools/analysis/benchmark_input_checks.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_input_checks`.
"""
from benchmarks.benchmark_input_checks import main

if __name__ == '__main__':
    main()
