"""``tools/train.py``: its command line, the config keys each option sets, and the run.

Options only set config keys (docs/configs.md); the runner the config names applies the run plan.
``--dry-run`` prints the plan and exits.
"""
import argparse
import os
from typing import Optional, Sequence

from mmengine.config import Config, DictAction

from .launch import (LAUNCHERS, disable_pin_memory, disable_tf32, dry_run, exit_on_expected_errors,
                     merge_cfg_options, run_training, set_resume, set_work_dir, setup_launcher, skip_validation,
                     use_amp, use_auto_scale_lr, use_compile, use_fsdp, use_vis_backends)
from vit_plugin.engine.vis_backends import VIS_BACKENDS


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Train a model (vit_plugin / mmpretrain / mmdet config). Each option sets config keys, '
        'which --cfg-options sets as well (docs/configs.md lists them); the runner the config names '
        '(vit_plugin.Runner) applies global_batch_size, the device defaults and pre-emption safety.')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or without a value from the newest intact '
                        'checkpoint in the work dir (damaged ones are skipped with a warning by '
                        'vit_plugin.Runner)')
    parser.add_argument('--amp', nargs='?', const='auto', choices=['auto', 'bf16', 'fp16'],
                        help='mixed precision: bf16 without loss scaling (GPUs of compute capability 8.0 '
                        'or newer, CPU, XLA) or fp16 with dynamic loss scaling (GPUs); without a value '
                        'bf16 where the device has it, else fp16')
    parser.add_argument('--compile', action='store_true',
                        help='train a torch.compile\'d model (mmengine\'s compile option; '
                        '--cfg-options compile.mode=... passes torch.compile arguments)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate linearly with the real batch size '
                        '(auto_scale_lr.base_batch_size is the reference)')
    parser.add_argument('--fsdp', action='store_true',
                        help='shard parameters, gradients and optimizer state with FSDP2 (fully_shard '
                        'per Transformer block) instead of replicating them with DDP; sharded '
                        'checkpoints (tools/consolidate_checkpoint.py makes one file of them)')
    parser.add_argument('--xla-spmd', action='store_true',
                        help='with --launcher xla: one process drives all devices of the host (SPMD); '
                        'the batch and the parameters are split over one device mesh (FSDPv2)')
    parser.add_argument('--xla-layer-scan', action='store_true',
                        help='with --launcher xla: run the ViT blocks as one compiled loop, so compile '
                        'time does not grow with depth (blocks without dropout or drop path)')
    parser.add_argument('--no-validate', action='store_true', help='skip validation during training')
    parser.add_argument('--no-pin-memory', action='store_true',
                        help='do not pin data-loader memory (pinned by default on CUDA hosts)')
    parser.add_argument('--no-tf32', action='store_true',
                        help='fp32 matmuls and convolutions in full fp32 on GPUs (TF32 by default)')
    parser.add_argument('--vis', nargs='+', choices=sorted(VIS_BACKENDS), metavar='BACKEND',
                        help='also write the scalars (losses, learning rate, gradient norm, validation '
                        'metrics, data time) to tensorboard, wandb and/or mlflow (mmengine\'s vis '
                        'backends, written by rank 0; docs/monitoring.md)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries, e.g. train_dataloader.batch_size=32 '
                        'model.backbone.drop_rate=0.0')
    parser.add_argument('--launcher', choices=LAUNCHERS,
                        help="job launcher (default: the config's launcher, else none)")
    parser.add_argument('--dry-run', action='store_true',
                        help='print the run plan (global batch, device defaults, hooks, XLA conversion) and '
                        'each change it makes to the config, then exit without building a model or '
                        'loading data')
    parser.add_argument('--nproc', type=int, metavar='N',
                        help='with --dry-run: the number of processes to plan for (default: what the '
                        "launcher's environment says, e.g. WORLD_SIZE; 1 without a launcher)")
    # torchrun passes the rank through LOCAL_RANK; torch.distributed.launch passes --local-rank.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if args.nproc is not None and (not args.dry_run or args.nproc < 1):
        parser.error('--nproc N (N >= 1) goes with --dry-run; a run counts the processes its launcher starts.')
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def merge_args(cfg: Config, args: argparse.Namespace) -> Config:
    """Set the config keys of the command-line options (in place; returned for convenience)."""
    merge_cfg_options(cfg, args.cfg_options)
    set_work_dir(cfg, args.work_dir, args.config)
    launcher = args.launcher or cfg.get('launcher') or 'none'
    use_amp(cfg, args.amp, launcher)
    use_auto_scale_lr(cfg, args.auto_scale_lr)
    set_resume(cfg, args.resume)
    if args.no_validate:
        skip_validation(cfg)
    if args.no_pin_memory:
        disable_pin_memory(cfg)
    if args.no_tf32:
        disable_tf32(cfg)
    if args.fsdp:
        use_fsdp(cfg)
    use_compile(cfg, args.compile)
    use_vis_backends(cfg, args.vis)
    setup_launcher(cfg, launcher, xla_spmd=args.xla_spmd, xla_layer_scan=args.xla_layer_scan)
    return cfg


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    cfg = merge_args(Config.fromfile(args.config), args)
    with exit_on_expected_errors():
        if args.dry_run:
            print(dry_run(cfg, args.nproc))
            return
        run_training(cfg)
