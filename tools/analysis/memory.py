#!/usr/bin/env python
"""Plan training memory: weights, gradients, optimizer state, activations, the largest batch that fits.

``python tools/analysis/memory.py --help`` lists the options; the code is
:mod:`benchmarks.memory_planner`.
"""
import sys

from benchmarks.memory_planner import main
from vit_plugin.cli.common import run

if __name__ == '__main__':
    sys.exit(run(main))
