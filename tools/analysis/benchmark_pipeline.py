"""Images per second of JPEG training input pipelines (Inception crop + flip) on one CPU core.

``python tools/analysis/benchmark_pipeline.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_pipeline`.
"""
from benchmarks.benchmark_pipeline import main

if __name__ == '__main__':
    main()
