"""Measurements of the training stack on this machine's accelerator, for ``tools/analysis/gpu_report.py``
and the ``cuda`` tests: the environment, real training steps of a config's classifier (peak memory
against the planner, the largest batch that fits), a detector's training and inference steps.

Every function works on ``'cuda'`` and, smaller, on ``'cpu'`` (the report's smoke subset).
"""
import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
from typing import Dict, Optional

import numpy as np
import torch

from vit_plugin import ops
from benchmarks.gpu_datasheet import cuda_device_info
from benchmarks.peak_memory import cuda_peak_bytes
from benchmarks.timing import Stopwatch, time_calls
from vit_plugin.engine.device_defaults import optimizer_defaults
from vit_plugin.engine.optimizers import use_mixed_precision
from vit_plugin.evaluation.model_loading import load_config
from vit_plugin.models.vit_search import find_vit

#: Distributions whose versions the report lists (the first installed of each group).
PACKAGES = [('torch', ), ('torchvision', ), ('mmengine', ), ('mmcv', 'mmcv-lite'), ('mmpretrain', ), ('mmdet', ),
            ('timm', ), ('numpy', ), ('opencv-python', 'opencv-python-headless'), ('pycocotools', )]


def _version(names) -> Optional[str]:
    for name in names:
        try:
            return f'{name} {importlib.metadata.version(name)}'
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _nvidia_driver() -> Optional[str]:
    if not shutil.which('nvidia-smi'):
        return None
    try:
        out = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def mmcv_ops_origin() -> Dict[str, object]:
    """Where mmcv's operators (``mmcv._ext``: NMS, RoIAlign...) come from in this process: compiled mmcv
    or vit_plugin's torchvision provider (:func:`vit_plugin.ops.ops_source`), with a description."""
    source = ops.ops_source()
    return dict(source, description=ops.describe(source))


def environment() -> Dict[str, object]:
    """Host, GPU, driver, CUDA and package versions, and the origin of mmcv's operators."""
    env = dict(python=platform.python_version(), platform=platform.platform(), cpus=os.cpu_count(),
               torch=torch.__version__, cuda_available=torch.cuda.is_available(),
               cuda=torch.version.cuda, hip=torch.version.hip,
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
               packages=[v for v in (_version(names) for names in PACKAGES) if v])
    if torch.cuda.is_available():
        env.update(gpu=cuda_device_info(), gpu_count=torch.cuda.device_count(), driver=_nvidia_driver(),
                   nccl='.'.join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, 'nccl') else None)
    env['mmcv_ops'] = mmcv_ops_origin()
    return env


# ------------------------------------------------------------------------------------------ classifier
def _classifier_batch(batch: int, hw, num_classes: int, device: str):
    from mmpretrain.structures import DataSample
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randint(0, 256, (3, *hw), dtype=torch.uint8, generator=gen).to(device) for _ in range(batch)]
    samples = [DataSample().set_gt_label(i % num_classes) for i in range(batch)]
    return dict(inputs=inputs, data_samples=samples)


class ClassifierTrainer:
    """A config's classifier with its optimizer on ``device``, ready for training steps on random
    images (bf16 autocast without loss scaling when ``bf16``; the run's optimizer kernel defaults).

    Args:
        config (str): Config file (an mmpretrain ``ImageClassifier`` with a vit_plugin ViT).
        device (str): ``'cuda'`` or ``'cpu'``.
        with_cp (bool): Activation checkpointing in every block.
        bf16 (bool): bf16 autocast.
        cfg_options (dict, optional): Config overrides.
    """

    def __init__(self, config: str, device: str, *, with_cp: bool = False, bf16: bool = True,
                 cfg_options: Optional[dict] = None):
        from mmengine.optim import build_optim_wrapper
        from mmengine.registry import MODELS


        cfg = load_config(config, cfg_options or {})
        cfg.model.backbone.with_cp = with_cp
        self.cfg, self.device = cfg, device
        torch.manual_seed(0)
        self.model = MODELS.build(cfg.model).to(device).train()
        vit = find_vit(self.model)[0]
        self.hw = (vit._patch_grid[0] * vit.patch_size[0], vit._patch_grid[1] * vit.patch_size[1])
        self.num_classes = cfg.model.head.get('num_classes', 10)
        optim_cfg = dict(cfg.optim_wrapper)
        optim_cfg.pop('constructor', None)
        optim_cfg.pop('paramwise_cfg', None)
        optimizer_defaults(optim_cfg, device)
        if bf16:
            use_mixed_precision(optim_cfg, 'bf16', device)
        self.wrapper = build_optim_wrapper(self.model, optim_cfg)

    def step(self, batch: int) -> float:
        """One training step at ``batch`` images; returns the loss."""
        data = _classifier_batch(batch, self.hw, self.num_classes, self.device)
        losses = self.model.train_step(data, self.wrapper)
        return float(losses['loss'].detach())

    def peak_bytes(self, batch: int) -> int:
        """``torch.cuda.max_memory_allocated`` over one training step (after a first step created the
        optimizer state), as the planner counts it: weights, optimizer state, gradients, activations."""
        if self.device != 'cuda':
            raise ValueError('peak_bytes measures the CUDA allocator; on the CPU use '
                             'benchmarks.memory_measure.measure')
        if not self.wrapper.optimizer.state:
            self.step(min(batch, 2))
        self.wrapper.zero_grad(set_to_none=True)
        return cuda_peak_bytes(lambda: self.step(batch))

    def fits(self, batch: int) -> bool:
        """Whether a training step at ``batch`` runs without running out of GPU memory."""
        import gc
        try:
            self.step(batch)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            self.wrapper.zero_grad(set_to_none=True)
            gc.collect()  # the failed step's tensors, held by its traceback until collected
            torch.cuda.empty_cache()

    def largest_batch(self, guess: int, max_probes: int = 9, precision: float = 0.05) -> Dict[str, object]:
        """The largest batch whose training step fits, found with real steps from ``guess`` (e.g. the
        planner's answer): doubling/halving to bracket it, then bisection to ``precision``."""
        probes = []

        def probe(batch):
            ok = self.fits(batch)
            probes.append((batch, ok))
            return ok

        guess = max(1, int(guess))
        lo, hi = (guess, None) if probe(guess) else (None, guess)
        while len(probes) < max_probes and (lo is None or hi is None):
            if lo is None:
                batch = max(1, hi // 2)
                if probe(batch):
                    lo = batch
                else:
                    hi = batch
                    if batch == 1:
                        break
            else:
                batch = int(lo * 1.25) + 1
                if probe(batch):
                    lo = batch
                else:
                    hi = batch
        while len(probes) < max_probes and lo is not None and hi is not None and hi - lo > max(1, precision * lo):
            mid = (lo + hi) // 2
            if probe(mid):
                lo = mid
            else:
                hi = mid
        return dict(largest=lo or 0, first_failing=hi, probes=probes)


# ------------------------------------------------------------------------------------------ detection
def random_detection_batch(batch: int, size: int, num_classes: int = 80, boxes: int = 4, seed: int = 0,
                           min_side: Optional[float] = None):
    """``batch`` random images with ``boxes`` random boxes and box-shaped masks each, as mmdet's
    ``train_step`` takes them. Box sides are at least ``min_side`` pixels (default ``size / 32``)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    gen = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=gen))
        xy = torch.rand(boxes, 2, generator=gen) * size * 0.6
        wh = torch.rand(boxes, 2, generator=gen) * size * 0.3 + (size / 32 if min_side is None else min_side)
        box = torch.cat([xy, xy + wh], 1)
        masks = np.zeros((boxes, size, size), dtype=np.uint8)
        for i, (x0, y0, x1, y1) in enumerate(box.int().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size),
                                             scale_factor=(1., 1.), batch_input_shape=(size, size)))
        sample.gt_instances = InstanceData(bboxes=box, labels=torch.randint(0, num_classes, (boxes, ), generator=gen),
                                           masks=BitmapMasks(masks, size, size))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def detection_steps(config: str, device: str, *, img_size: int, batch: int = 1, steps: int = 3, bf16: bool = False,
                    cfg_options: Optional[dict] = None) -> Dict[str, object]:
    """Time a detector's training steps and inference on ``device`` (random images with boxes and
    masks), with its peak memory on CUDA.

    Returns:
        dict: ``train_s`` / ``infer_s`` (median seconds per step after one warm-up), ``losses`` (of the
        last step, all finite), ``detections`` (instances predicted for the first image), ``peak_mib``
        (CUDA) and ``outputs_device`` (where the predictions live).
    """
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from mmdet.registry import MODELS

    cfg = load_config(config, dict(cfg_options or {}))
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    cfg.model.backbone.init_cfg = None
    if 'img_size' in cfg.model.backbone:
        cfg.model.backbone.img_size = (img_size, img_size)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model = model.to(device).train()
    optim_cfg = dict(cfg.optim_wrapper)
    optimizer_defaults(optim_cfg, device)
    if bf16:
        use_mixed_precision(optim_cfg, 'bf16', device)
    wrapper = build_optim_wrapper(model, optim_cfg)
    num_classes = cfg.model.roi_head.bbox_head.num_classes if 'roi_head' in cfg.model else 80
    data = random_detection_batch(batch, img_size, num_classes)
    watch = Stopwatch(device)
    last = {}

    def train_step():
        last['losses'] = model.train_step(data, wrapper)

    def test_step():
        last['results'] = model.test_step(data)

    def train_then_infer():
        # One untimed warm-up step each, then ``steps`` timed ones.
        last['train'] = time_calls(train_step, steps, warmup=1, stopwatch=watch)
        model.eval()
        with torch.no_grad():
            last['infer'] = time_calls(test_step, steps, warmup=1, stopwatch=watch)

    if device == 'cuda':
        peak_bytes = cuda_peak_bytes(train_then_infer)
    else:
        train_then_infer()
    train_times, infer_times, losses, results = last['train'], last['infer'], last['losses'], last['results']
    values = {k: float(v.detach().sum()) if isinstance(v, torch.Tensor) else float(sum(x.detach().sum() for x in v))
              for k, v in losses.items() if 'loss' in k}
    pred = results[0].pred_instances
    return dict(train_s=statistics.median(train_times), infer_s=statistics.median(infer_times),
                losses=values, finite=all(np.isfinite(v) for v in values.values()),
                detections=int(len(pred)), outputs_device=str(pred.bboxes.device),
                peak_mib=peak_bytes / 2**20 if device == 'cuda' else None,
                img_size=img_size, batch=batch)
