"""One command that measures vit_plugin on a CUDA host and writes a report: ``make gpu-report``
(``tools/analysis/gpu_report.py``).

``python tools/analysis/gpu_report.py --help`` lists the options; the code is
:mod:`benchmarks.gpu_report`.
"""
from benchmarks.gpu_report import main

if __name__ == '__main__':
    main()
