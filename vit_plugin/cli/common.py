"""What the commands that load a config share (the figure tools, the memory planner, ``tools/fewshot_eval.py``):
a parser with CONFIG CHECKPOINT, the image options, and one ``error:`` line for an expected user error."""
import argparse
import sys
from typing import Callable, Optional, Sequence

from mmengine.config import DictAction

from vit_plugin.checkpoint import CheckpointError


def base_parser(description: str, with_model: bool = True) -> argparse.ArgumentParser:
    """A parser with CONFIG CHECKPOINT (when ``with_model``), --device and --cfg-options."""
    parser = argparse.ArgumentParser(description=description)
    if with_model:
        parser.add_argument('config', help='config file the checkpoint was trained with')
        parser.add_argument('checkpoint', help='checkpoint file (runner checkpoint or backbone state dict)')
    parser.add_argument('--device', default='cpu', help='device to run on, e.g. cpu, cuda:0 (default: cpu)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default=None,
                        help='override config settings, e.g. test_dataloader.batch_size=16')
    return parser


def image_args(parser: argparse.ArgumentParser, num_images: int) -> None:
    """--num-images / --images / --split options of the attention tools."""
    parser.add_argument('--num-images', type=int, default=num_images,
                        help=f'images taken from the config\'s dataset (default: {num_images})')
    parser.add_argument('--images', nargs='+', default=None, help='image files to use instead of the dataset')
    parser.add_argument('--split', default='test', choices=('test', 'val', 'train'),
                        help='which dataloader of the config supplies the images (default: test)')


def run(main: Callable[[Optional[Sequence[str]]], object], argv: Optional[Sequence[str]] = None) -> int:
    """Run a tool's ``main``; expected user errors end in one clear ``error:`` line and exit status 2."""
    try:
        main(argv)
    except (ValueError, FileNotFoundError, KeyError, CheckpointError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    return 0
