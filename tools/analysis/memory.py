#!/usr/bin/env python
"""Plan training memory: weights, gradients, optimizer state, activations, the largest batch that fits.

``python tools/analysis/memory.py --help`` lists the options; the code is
:mod:`benchmarks.memory_planner`.
"""
import sys

from vit_plugin.apis.cli import run
from benchmarks.memory_planner import main

if __name__ == '__main__':
    sys.exit(run(main))
