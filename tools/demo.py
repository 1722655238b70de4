"""The embedded demo behind ``make demo``: train and evaluate a small ViT on handwritten digits.

    python tools/demo.py [--work-dir work_dirs/vit_demo_digits] [--cfg-options key=value ...]

The code is :mod:`vit_plugin.cli.demo`.
"""
import sys

from vit_plugin.cli.demo import main

if __name__ == '__main__':
    sys.exit(main())
