"""Run a trained classifier or detector on images: top-k classes, or detections drawn into PNGs.

``python tools/infer.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.infer`.
"""
import sys

from vit_plugin.cli.infer import main

if __name__ == '__main__':
    sys.exit(0 if main() is not None else 1)
