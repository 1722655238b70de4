"""``tools/test.py``: its command line, how each option changes the config, and the evaluation.

``tools/test.py MODEL_NAME`` evaluates a released model (:mod:`vit_plugin.zoo`) with its own config and
weights (a CHECKPOINT given after the name replaces its weights).
"""
import argparse
import json
import os
from typing import Dict, Optional, Sequence

from mmengine.config import Config, DictAction

from vit_plugin.checkpoint import HUB_PREFIX, HubCheckpointError, resolve_hub_checkpoint
from vit_plugin.engine.hooks import use_input_norm_check
from vit_plugin.zoo import UnknownModelError, find_model

from .launch import (LAUNCHERS, build_runner, exit_on_expected_errors, merge_cfg_options, release_process_group,
                     set_work_dir, setup_launcher, use_device_defaults)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Evaluate a checkpoint.')
    parser.add_argument('config', help='config file path, or the name of a released model '
                        '(vit_plugin.list_models())')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint file (runner checkpoint or weights); '
                        'optional after a model name, which brings its own')
    parser.add_argument('--work-dir', help='directory for the evaluation logs '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--out', help='write the metrics to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries')
    # Evaluation on TPUs is not wired up: the XLA path trains (tools/train.py --launcher xla).
    parser.add_argument('--launcher', choices=[name for name in LAUNCHERS if name != 'xla'], default='none',
                        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Apply the command-line options to the config and keep only what evaluation builds."""
    merge_cfg_options(cfg, args.cfg_options)
    set_work_dir(cfg, args.work_dir, args.config)
    if not cfg.get('test_dataloader'):
        raise SystemExit(f'{args.config} defines no test_dataloader (e.g. ImageNet-21k pre-training '
                         f'has no official test split); evaluate a fine-tuning config instead.')
    cfg.load_from = args.checkpoint
    cfg.resume = False
    use_input_norm_check(cfg)
    # Evaluation needs no training state: drop what would only be built for training.
    cfg.train_dataloader = cfg.train_cfg = cfg.optim_wrapper = cfg.param_scheduler = None
    use_device_defaults(cfg, args.launcher)  # on GPUs: TF32 and pinned loader memory
    return cfg


def read_config(args: argparse.Namespace) -> Config:
    """The config file, or the config of a released model by name (``args.checkpoint`` then defaults to
    the model's weights, and the work directory is named after the model)."""
    if args.config.endswith('.py') or os.path.isfile(args.config):
        if args.checkpoint is None:
            raise SystemExit(f'{args.config}: give the CHECKPOINT to evaluate after the config file.')
        return Config.fromfile(args.config)
    try:
        released = find_model(args.config)
    except UnknownModelError as err:
        raise SystemExit(f'ERROR: {err}') from None
    if not released.is_classifier:
        raise SystemExit(f'{released.name} is a backbone without classifier: nothing to evaluate; fine-tune it '
                         f'(docs/model_zoo.md) or name a classifier.')
    args.config = released.name  # the default work directory: work_dirs/<name>
    args.checkpoint = args.checkpoint or released.weights
    if args.checkpoint.startswith(HUB_PREFIX):  # not cached offline: say so before building anything
        try:
            resolve_hub_checkpoint(args.checkpoint)
        except HubCheckpointError as err:
            raise SystemExit(f'ERROR: {err}') from None
    return released.config(loader='vit_plugin.LoadImageFromFile')  # broken files named, as in training


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    args = parse_args(argv)
    cfg = merge_args(read_config(args), args)
    setup_launcher(cfg, args.launcher)
    with exit_on_expected_errors():
        runner = build_runner(cfg)
        metrics = runner.test()
    release_process_group()
    if args.out and runner.rank == 0:
        with open(args.out, 'w') as f:
            json.dump({k: float(v) for k, v in metrics.items()}, f, indent=1)
    return metrics
