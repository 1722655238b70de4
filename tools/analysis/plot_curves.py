#!/usr/bin/env python
"""The training curves (loss, learning rate, gradient norm, validation top-1) of one or several runs in one
figure, from their scalars.json or, with ``--source events``, their TensorBoard event files.

    python tools/analysis/plot_curves.py WORK_DIR [WORK_DIR ...] [--keys loss lr] [--out curves.png]

``--help`` lists the options; the code is :mod:`vit_plugin.cli.plot_curves` (docs/monitoring.md).
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.plot_curves import main

if __name__ == '__main__':
    sys.exit(run(main))
