"""Train a model from a config with MMEngine's runner (mmpretrain's command-line conventions).

    python tools/train.py configs/vit_l16_in21k.py [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--fsdp] [--no-validate] [--cfg-options key=value ...]
        [--launcher {none,pytorch,slurm,mpi,xla}]

Several processes: ``bash tools/dist_train.sh CONFIG NUM_PROCS [args]`` (torchrun, DDP).
TPUs: ``PJRT_DEVICE=TPU python tools/train.py CONFIG --launcher xla`` (one process per device;
``--amp`` means bf16 there). See the README section on torch_xla.
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model (vit_plugin / mmpretrain config).')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='directory for logs and checkpoints '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from this checkpoint, or without a value from the latest '
                        'checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision (GPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate linearly with the real batch size '
                        '(auto_scale_lr.base_batch_size is the reference)')
    parser.add_argument('--fsdp', action='store_true',
                        help='shard parameters, gradients and optimizer state with FSDP (one wrap '
                        'unit per Transformer block) instead of replicating them with DDP')
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
    if args.launcher == 'none':
        return 1
    if args.launcher == 'xla':
        if args.fsdp:
            raise SystemExit('--fsdp is not available with --launcher xla (XLA replicates the model '
                             'and all-reduces gradients in the optimizer step).')
        from vit_plugin.xla import to_xla_config
        to_xla_config(cfg)  # fail here, before any process starts, if the config cannot run on XLA
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
    """Train with MMEngine's FlexibleRunner and FSDPStrategy, one FSDP unit per Transformer block."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit('--fsdp needs GPUs: torch\'s FullyShardedDataParallel refuses CPU-only hosts. '
                         'Use plain DDP here (drop --fsdp).')
    wrapper = dict(auto_wrap_policy=dict(type='vit_plugin.vit_block_wrap_policy'), use_orig_params=True)
    cfg.runner_type = 'FlexibleRunner'
    cfg.strategy = dict(type='FSDPStrategy', model_wrapper=wrapper)


def merge_args(cfg, args):
    """Apply the command-line options to the config."""
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    if args.amp and args.launcher == 'xla':
        # XLA computes in bf16 without loss scaling; vit_plugin.xla maps this to bf16 autocast.
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.dtype = 'bfloat16'
    elif args.amp:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit('--amp uses mmengine\'s AmpOptimWrapper, which needs a GPU; on CPU train '
                             'in float32 (drop --amp).')
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        cfg.setdefault('auto_scale_lr', {})['enable'] = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
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
    return cfg


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
            launch_training(cfg, prepare=apply_global_batch_size)
            return
        runner = build_runner(cfg)
        runner.train()
    except DataRootNotFoundError as err:
        # The message says which path is missing and where the README explains the data; a stack
        # trace from inside the data loader would only hide it.
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(2) from None


def _is_main() -> bool:
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


if __name__ == '__main__':
    main()
