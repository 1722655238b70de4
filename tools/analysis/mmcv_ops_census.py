"""Which of mmcv's compiled operators (``mmcv._ext``) our detection configs reach: one training step
(loss + backward) and one inference (``predict``) per config on small random images, with every
``mmcv._ext`` function wrapped to record its calls.

``python tools/analysis/mmcv_ops_census.py --help`` lists the options; the code is
:mod:`benchmarks.mmcv_ops_census`.
"""
from benchmarks.mmcv_ops_census import main

if __name__ == '__main__':
    main()
