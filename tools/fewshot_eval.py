#!/usr/bin/env python
"""Few-shot linear evaluation of a checkpoint on any classification dataset config (paper, Section 4.1).

``python tools/fewshot_eval.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.fewshot_eval`.
"""
import sys

from vit_plugin.cli.common import run
from vit_plugin.cli.fewshot_eval import main

if __name__ == '__main__':
    sys.exit(run(main))
