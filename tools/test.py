"""Evaluate a checkpoint on a config's test set (mmpretrain's command-line conventions).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out metrics.json]
        [--cfg-options key=value ...] [--launcher {none,pytorch,slurm,mpi}]

Several processes: ``bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [args]``. When the config
has an ``EMAHook`` and the checkpoint holds an EMA state, the averaged weights are evaluated.
"""
import argparse
import json
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from mmengine.config import Config, DictAction  # noqa: E402

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from train import LAUNCHERS, build_runner, setup_launcher  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Evaluate a checkpoint.')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file (runner checkpoint or weights)')
    parser.add_argument('--work-dir', help='directory for the evaluation logs '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--out', help='write the metrics to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    args.fsdp = False
    return args


def main(argv=None):
    args = parse_args(argv)
    from vit_plugin.datasets.checked import DataRootNotFoundError

    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if not cfg.get('test_dataloader'):
        raise SystemExit(f'{args.config} defines no test_dataloader (e.g. ImageNet-21k pre-training '
                         f'has no official test split); evaluate a fine-tuning config instead.')
    cfg.load_from = args.checkpoint
    cfg.resume = False
    from vit_plugin.engine.hooks import use_input_norm_check
    use_input_norm_check(cfg)
    # Evaluation needs no training state: drop what would only be built for training.
    cfg.train_dataloader = cfg.train_cfg = cfg.optim_wrapper = cfg.param_scheduler = None
    setup_launcher(cfg, args)
    try:
        runner = build_runner(cfg)
        metrics = runner.test()
    except DataRootNotFoundError as err:
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(2) from None
    if args.out and runner.rank == 0:
        with open(args.out, 'w') as f:
            json.dump({k: float(v) for k, v in metrics.items()}, f, indent=1)
    return metrics


if __name__ == '__main__':
    main()
