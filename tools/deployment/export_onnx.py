"""Export a trained classifier (or its ViT backbone) to ONNX, checked against ONNX Runtime.

``python tools/deployment/export_onnx.py --help`` lists the options; the code is
:mod:`vit_plugin.cli.export_onnx`.
"""
import sys

from vit_plugin.cli.export_onnx import main

if __name__ == '__main__':
    sys.exit(0 if main() else 1)
