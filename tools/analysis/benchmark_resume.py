"""Time from ``runner.train()`` to the first trained iteration of a run resumed at a deep iteration:
mmengine's loop and sampler against vit_plugin's.

``python tools/analysis/benchmark_resume.py --help`` lists the options; the code is
:mod:`benchmarks.benchmark_resume`.
"""
from benchmarks.benchmark_resume import main

if __name__ == '__main__':
    main()
