"""Measure the peak memory of real CPU training steps, to check the planner against.

Each measurement runs in a fresh Python process (``python -m benchmarks.memory_measure``):
it imports everything, reads its anonymous resident memory, builds the config's model and
optimizer, runs ``steps`` training steps on random images and reports the peak resident set size
(``VmHWM``) less the file-backed pages (library code) and less the anonymous memory before the model
existed. glibc's allocator is told to serve every allocation above
64 KiB from its own mapping (``MALLOC_MMAP_THRESHOLD_``), so a freed tensor leaves the resident set
at once and the peak is that of live tensors, not of memory the allocator kept for later.

Classifiers and self-supervised models run their own ``train_step``; for detectors only the ViT
backbone is trained (a mean of its feature map as the loss), which is what the planner models.
"""
import argparse
import json
import subprocess
import sys
from typing import Optional

from benchmarks.child_process import child_env, child_failure
from vit_plugin.engine.optimizers import use_mixed_precision
from vit_plugin.evaluation.model_loading import load_config
from vit_plugin.models.vit_search import find_vit

ENV = dict(MALLOC_MMAP_THRESHOLD_='65536', MALLOC_TRIM_THRESHOLD_='0', MALLOC_ARENA_MAX='1')


def _status() -> dict:
    fields = {}
    with open('/proc/self/status') as f:
        for line in f:
            key, _, value = line.partition(':')
            if value.strip().endswith('kB'):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def _batch(model, batch: int, hw):
    import torch
    from mmpretrain.structures import DataSample
    inputs = [torch.randint(0, 256, (3, *hw), dtype=torch.uint8) for _ in range(batch)]
    samples = [DataSample().set_gt_label(i % 10) for i in range(batch)]
    return dict(inputs=inputs, data_samples=samples)


def _child(args) -> dict:
    import torch
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS

    torch.manual_seed(0)
    options = json.loads(args.cfg_options) if args.cfg_options else {}
    cfg = load_config(args.config, options)
    if args.with_cp is not None:
        cfg.model.backbone.with_cp = args.with_cp
    # Anonymous memory only: the library code paged in by the first use of each kernel is
    # file-backed and is no tensor memory.
    before = _status()['RssAnon']
    model = MODELS.build(cfg.model)
    model.train()
    vit = find_vit(model)[0]
    detector = getattr(model, 'neck', None) is not None or not hasattr(model, 'head')
    trained = vit if detector else model
    optim_cfg = dict(cfg.optim_wrapper)
    optim_cfg.pop('constructor', None)
    optim_cfg.pop('paramwise_cfg', None)
    if args.bf16:
        use_mixed_precision(optim_cfg, 'bf16', 'cpu')
    wrapper = build_optim_wrapper(trained, optim_cfg)
    hw = (vit._patch_grid[0] * vit.patch_size[0], vit._patch_grid[1] * vit.patch_size[1])
    for _ in range(args.steps):
        if detector:
            with wrapper.optim_context(vit):
                x = torch.randn(args.batch, 3, *hw)
                loss = sum(out.float().mean() for out in vit(x))
            wrapper.update_params(loss)
        else:
            model.train_step(_batch(model, args.batch, hw), wrapper)
    # The kernel keeps the peak of the whole resident set (VmHWM); file-backed pages only grow, so
    # subtracting those resident at the end leaves an upper bound on the anonymous peak that is
    # tight when no code was paged in after the peak (the second step runs the same kernels).
    status = _status()
    peak = status['VmHWM'] - status['RssFile'] - status.get('RssShmem', 0) - before
    return dict(peak=peak, params=sum(p.numel() for p in trained.parameters()))


def measure(config: str, batch: int, *, with_cp: Optional[bool] = None, bf16: bool = False,
            steps: int = 2, cfg_options: Optional[dict] = None, timeout: int = 900) -> dict:
    """Peak memory (bytes above the process before the model was built) of CPU training steps.

    Args:
        config (str): Config file.
        batch (int): Images per step.
        with_cp (bool, optional): Override ``model.backbone.with_cp``. Defaults to None.
        bf16 (bool): bf16 autocast (``vit_plugin.CPUAmpOptimWrapper``). Defaults to False.
        steps (int): Training steps; the first creates the optimizer state. Defaults to 2.
        cfg_options (dict, optional): Config overrides. Defaults to None.
        timeout (int): Seconds. Defaults to 900.

    Returns:
        dict: ``peak`` (bytes) and ``params`` (parameters trained).
    """
    cmd = [sys.executable, '-m', 'benchmarks.memory_measure', config, '--batch', str(batch),
           '--steps', str(steps)]
    if with_cp is not None:
        cmd += ['--with-cp', str(int(with_cp))]
    if bf16:
        cmd.append('--bf16')
    if cfg_options:
        cmd += ['--cfg-options', json.dumps(cfg_options)]
    env = child_env(**ENV)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(child_failure(f'memory measurement ({" ".join(cmd)})', proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--steps', type=int, default=2)
    parser.add_argument('--with-cp', type=int, choices=[0, 1], default=None)
    parser.add_argument('--bf16', action='store_true')
    parser.add_argument('--cfg-options', default=None, help='JSON dict of config overrides')
    args = parser.parse_args(argv)
    if args.with_cp is not None:
        args.with_cp = bool(args.with_cp)
    print(json.dumps(_child(args)))


if __name__ == '__main__':
    main()
