"""Train a model from a config with MMEngine's runner (mmpretrain's command-line conventions).

    python tools/train.py configs/vit_l16_in21k.py [--work-dir DIR] [--resume [CKPT]] [--amp [bf16|fp16]]
        [--auto-scale-lr] [--fsdp] [--no-validate] [--cfg-options key=value ...]
        [--launcher {none,pytorch,slurm,mpi,xla}]

Several processes: ``bash tools/dist_train.sh CONFIG NUM_PROCS [args]`` (torchrun, DDP).
TPUs: ``PJRT_DEVICE=TPU python tools/train.py CONFIG --launcher xla`` (one process per device;
``--amp`` means bf16 there); add ``--xla-spmd`` for one process per host with the batch and the
weights split over a device mesh, and ``--xla-layer-scan`` to compile one Transformer block instead
of all of them. See docs/scaling.md.
``--amp bf16`` trains in bf16 on any device: mmengine's AmpOptimWrapper on GPUs, bf16 autocast on
CPU (vit_plugin.CPUAmpOptimWrapper), XLA autocast on TPUs.
SIGTERM / SIGUSR1 stop a run after the current iteration with a checkpoint and exit status 75
(vit_plugin.PreemptionHook); run the same command with ``--resume`` to continue.
"""
import argparse
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, REPO_ROOT)

from mmengine.config import Config, DictAction  # noqa: E402

LAUNCHERS = ['none', 'pytorch', 'slurm', 'mpi', 'xla']
# Exit status of a run stopped by vit_plugin.NonFiniteGuardHook (too many NaN/inf steps in a row).
NONFINITE_EXIT_CODE = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model (vit_plugin / mmpretrain config).')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or without a value from the newest intact '
                        'checkpoint in the work dir (damaged ones are skipped with a warning)')
    parser.add_argument('--amp', nargs='?', const='auto', choices=['auto', 'bf16', 'fp16'],
                        help='mixed precision: bf16 (GPU, CPU, XLA) or fp16 with dynamic loss '
                        'scaling (GPU); without a value fp16 on GPUs and bf16 elsewhere'),
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
    parser.add_argument('--no-pin-memory', action='store_true', help='do not pin data-loader memory')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries, e.g. train_dataloader.batch_size=32 '
                        'model.backbone.drop_rate=0.0')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='job launcher')
    # torchrun passes the rank through LOCAL_RANK; torch.distributed.launch passes --local-rank.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def setup_launcher(cfg, args) -> int:
    """Everything that depends on how the processes were launched; returns the world size.

    Sets ``cfg.launcher``, picks the process-group backend (NCCL on GPUs, Gloo on CPU-only hosts)
    and makes MMEngine's DDP wrapper usable without GPUs (it passes a CUDA device id otherwise).
    """
    import torch

    from vit_plugin.engine.global_batch import world_size_from_env

    cfg.launcher = args.launcher
    if args.xla_spmd and args.launcher != 'xla':
        raise SystemExit('--xla-spmd needs --launcher xla.')
    if args.xla_layer_scan and args.launcher != 'xla':
        raise SystemExit('--xla-layer-scan needs --launcher xla.')
    if args.launcher == 'none':
        return 1
    if args.launcher == 'xla':
        if args.fsdp:
            raise SystemExit('--fsdp is not available with --launcher xla (XLA replicates the model '
                             'and all-reduces gradients in the optimizer step).')
        from vit_plugin.xla import to_xla_config
        try:  # fail here, before any process starts, if it cannot run
            to_xla_config(cfg, spmd=args.xla_spmd, layer_scan=args.xla_layer_scan)
        except ValueError as err:
            raise SystemExit(f'--launcher xla: {err}') from None
        return None  # torch_xla.launch starts one process per device; they know the world size
    if not torch.cuda.is_available():
        cfg.env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
        if not args.fsdp and cfg.get('model_wrapper_cfg') is None:
            cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None,
                                         broadcast_buffers=False,
                                         find_unused_parameters=cfg.get('find_unused_parameters', False))
        if args.launcher == 'pytorch' and not torch.distributed.is_initialized():
            # MMEngine's init_dist calls torch.cuda.set_device unconditionally; on a CPU-only host we
            # join torchrun's process group ourselves and the runner then skips its own set-up.
            torch.distributed.init_process_group(backend='gloo')
    return world_size_from_env(args.launcher)


def use_fsdp(cfg) -> None:
    """Train with MMEngine's FlexibleRunner and vit_plugin's FSDP2Strategy (``fully_shard`` per
    Transformer block and on the root; CPU/Gloo and GPUs); ``cfg.fsdp_cfg`` (a dict) passes options
    such as ``mixed_precision='bf16'`` to the strategy. An ``EMAHook`` becomes
    ``vit_plugin.ShardedEMAHook``."""
    for hook in cfg.get('custom_hooks') or []:
        if str(hook.get('type')).split('.')[-1] == 'EMAHook':
            # mmengine's EMAHook deep-copies the model, which FSDP2 modules refuse; the sharded
            # version averages each process's shards in place (same settings, same checkpoints).
            hook['type'] = 'vit_plugin.ShardedEMAHook'
    cfg.runner_type = 'FlexibleRunner'
    cfg.strategy = dict(type='vit_plugin.FSDP2Strategy', **(cfg.get('fsdp_cfg') or {}))


def merge_args(cfg, args):
    """Apply the command-line options to the config."""
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        import torch

        from vit_plugin.engine.optimizers import use_mixed_precision
        # mmengine's AmpOptimWrapper refuses to build without an accelerator: pick by device.
        device = 'xla' if args.launcher == 'xla' else 'cuda' if torch.cuda.is_available() else 'cpu'
        precision = args.amp if args.amp != 'auto' else 'fp16' if device == 'cuda' else 'bf16'
        try:
            use_mixed_precision(cfg.optim_wrapper, precision, device)
        except ValueError as err:
            raise SystemExit(f'--amp {args.amp}: {err}') from None
    if args.auto_scale_lr:
        cfg.setdefault('auto_scale_lr', {})['enable'] = True
    if args.resume == 'auto':
        resume_latest(cfg)
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    if args.no_pin_memory:
        for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            if cfg.get(name):
                cfg[name]['pin_memory'] = False
    if args.fsdp:
        use_fsdp(cfg)
    from vit_plugin.engine.hooks import use_input_norm_check
    from vit_plugin.engine.preemption import use_preemption_safe_hooks
    use_preemption_safe_hooks(cfg)
    use_input_norm_check(cfg)
    return cfg


def resume_latest(cfg) -> None:
    """``--resume`` without a path: the newest intact checkpoint of the work dir (a truncated or corrupt
    one is skipped with a warning); a work dir without checkpoints starts from the beginning."""
    from vit_plugin.engine.checkpointing import find_resumable_checkpoint

    try:
        found = find_resumable_checkpoint(cfg.work_dir, warn=print if _is_main() else None)
    except FileNotFoundError as err:
        raise SystemExit(f'ERROR: {err}') from None
    if found is None and _is_main():
        print(f'--resume: no checkpoint in {cfg.work_dir}; training starts from the beginning.')
    cfg.resume = found is not None
    cfg.load_from = found


def build_runner(cfg):
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def main(argv=None):
    args = parse_args(argv)
    from vit_plugin.datasets.checked import DataRootNotFoundError
    from vit_plugin.engine.global_batch import apply_global_batch_size
    from vit_plugin.engine.hooks import NonFiniteTrainingError

    cfg = Config.fromfile(args.config)
    merge_args(cfg, args)
    world_size = setup_launcher(cfg, args)
    if args.auto_scale_lr and cfg.get('global_batch_size'):
        print(f'--auto-scale-lr: dropping global_batch_size={cfg.global_batch_size} (no gradient '
              f'accumulation); the learning rate is scaled to the real batch instead.')
        cfg.global_batch_size = None
    if world_size is not None:  # None: --launcher xla, whose processes know their world size
        apply_global_batch_size(cfg, world_size, logger=print if _is_main() else None)
    try:
        if world_size is None:
            from vit_plugin.xla import launch_training
            launch_training(cfg, prepare=apply_global_batch_size, spmd=args.xla_spmd,
                            layer_scan=args.xla_layer_scan)
            return
        runner = build_runner(cfg)
        runner.train()
    except DataRootNotFoundError as err:
        # The message says which path is missing and where the README explains the data; a stack
        # trace from inside the data loader would only hide it.
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(2) from None
    except NonFiniteTrainingError as err:
        # Expected outcome of a diverging run, not a bug: the message says what to do next.
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(NONFINITE_EXIT_CODE) from None


def _is_main() -> bool:
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


if __name__ == '__main__':
    main()
