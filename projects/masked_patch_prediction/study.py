"""The pieces of the MPP study on the embedded digits: pre-train, fine-tune, probe, measure.

``run_experiment.py`` strings them together for MPP, ``compare_mim.py`` for MPP, MAE and MaskFeat; each
function runs one mmengine ``Runner`` (or none) in this process and returns plain numbers, so other
pre-training methods are fed to the same downstream code by handing it a checkpoint whose
``backbone.`` weights fit ``configs/_tiny_vit.py``.
"""
import glob
import os
import os.path as osp
import time

import numpy as np
import torch

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
CONFIGS = osp.join(HERE, 'configs')
NUM_CLASSES = 10


# ------------------------------------------------------------------------------------------ results files
def prepare(work_dir, data_root):
    """What every experiment of the project does first: register vit_plugin's components (the runners
    import it again via custom_imports), use at most 2 threads, create the work directory and write the
    digits dataset if needed. Returns the start time."""
    import vit_plugin  # noqa: F401
    from vit_plugin.datasets.digits import prepare_digits_dataset
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.makedirs(work_dir, exist_ok=True)
    prepare_digits_dataset(data_root, img_size=32)
    return time.time()


def relative(path):
    """A path inside the repository, relative to its root (results files are shared)."""
    if isinstance(path, str) and osp.abspath(path).startswith(ROOT + os.sep):
        return osp.relpath(osp.abspath(path), ROOT)
    return path


def portable(obj):
    """``obj`` (nested dicts/lists) with every string that is a path inside the repository made relative."""
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable(v) for v in obj]
    return relative(obj)


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return dict(mean=float(values.mean()), std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                runs=[float(v) for v in values])


# ------------------------------------------------------------------------------------------------ runners
def _schedule(cfg, iters, warmup):
    cfg.train_cfg.max_iters = iters
    cfg.param_scheduler[0].end = cfg.param_scheduler[1].begin = warmup
    cfg.param_scheduler[1].end = iters
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = max(1, min(25, iters // 4))


def _train(cfg, name, work_dir):
    from mmengine.registry import RUNNERS
    cfg.work_dir = osp.join(work_dir, name)
    cfg.experiment_name = name  # one logger per run inside this process
    runner = RUNNERS.build(cfg)  # the runner the config names
    start = time.time()
    runner.train()
    return runner, time.time() - start


def pretrain(config, work_dir, data_root, iters, seed=0, name=None, **model_overrides):
    """Self-supervised pre-training of the tiny ViT on the digits' training split (labels unused) with the
    method of ``config`` (MPP, MAE, MaskFeat), for ``iters`` iterations.

    Args:
        config (str): Config file name in ``configs/``, e.g. 'mpp_tiny-vit_digits.py'.
        work_dir (str): Parent of the run's directory.
        data_root (str): The digits dataset.
        iters (int): Iterations (warm-up: a fifteenth of them, then cosine).
        seed (int): Seed of the run. Defaults to 0.
        name (str, optional): Run directory under ``work_dir``. Defaults to None: the config's name
            and the seed.
        **model_overrides: Changes to the config's model, e.g. ``corrupt_ratio=0.15`` or
            ``head=dict(target='pixel_l2')`` (a dict updates that part of the model).

    Returns:
        dict: ``loss`` (per iteration), ``seconds`` (training wall-clock), ``images`` (images seen:
        iterations x batch), ``config``, ``model`` and ``checkpoint`` (the runner's last checkpoint).
    """
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(CONFIGS, config))
    for key, value in model_overrides.items():
        if isinstance(value, dict):
            cfg.model[key].update(value)
        else:
            cfg.model[key] = value
    _schedule(cfg, iters, max(1, iters // 15))
    cfg.train_dataloader.dataset.data_root = data_root
    cfg.train_dataloader.num_workers = 0
    cfg.randomness = dict(seed=seed)
    name = name or f"{osp.splitext(config)[0]}-seed{seed}"
    runner, seconds = _train(cfg, name, work_dir)
    loss = [float(v) for v in runner.message_hub.get_scalar('train/loss').data[0]]
    return dict(loss=loss, seconds=seconds, images=iters * cfg.train_dataloader.batch_size, config=cfg,
                model=runner.model, checkpoint=osp.join(cfg.work_dir, f'iter_{iters}.pth'))


def pretrain_mpp(work_dir, data_root, iters, seed=0, name='mpp', **model_overrides):
    """MPP pre-training (``configs/mpp_tiny-vit_digits.py``); see :func:`pretrain`."""
    return pretrain('mpp_tiny-vit_digits.py', work_dir, data_root, iters, seed=seed, name=name, **model_overrides)


def finetune_config(data_root, iters, seed, labels_per_class=None, checkpoint=None):
    """The config of one supervised run (see :func:`finetune`). Every arm gets the same recipe; only the
    backbone's ``init_cfg`` tells a pre-trained arm from a scratch one."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(CONFIGS, 'tiny-vit_digits_ft-mpp.py' if checkpoint
                                   else 'tiny-vit_digits_scratch.py'))
    if checkpoint:
        cfg.model.backbone.init_cfg.checkpoint = checkpoint
    _schedule(cfg, iters, max(1, iters // 10))
    cfg.train_cfg.val_interval = iters
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        loader.dataset.data_root = data_root
        loader.num_workers = 0
    # The subset's seed is the run's: every seed sees other labelled images, nested across label counts.
    cfg.train_dataloader.dataset = dict(type='vit_plugin.LabelSubsetDataset', dataset=cfg.train_dataloader.dataset,
                                        num_per_class=labels_per_class, seed=seed)
    cfg.randomness = dict(seed=seed)
    return cfg


def finetune(work_dir, data_root, iters, seed, labels_per_class=None, checkpoint=None, name=None):
    """Supervised training of the tiny ViT from ``checkpoint`` (its ``backbone.`` weights) or from random
    initialisation, on ``labels_per_class`` labelled images of every class (None: all), with the same
    recipe and number of iterations either way. Returns test top-1 (%), time, the number of labelled
    training images and the images seen (iterations x batch)."""
    cfg = finetune_config(data_root, iters, seed, labels_per_class, checkpoint)
    name = name or f"{'ft' if checkpoint else 'scratch'}-{labels_per_class or 'all'}pc-seed{seed}"
    runner, seconds = _train(cfg, name, work_dir)
    top1 = float(runner.message_hub.get_scalar('val/accuracy/top1').current())
    return dict(top1=top1, seconds=seconds, train_images=len(runner.train_dataloader.dataset),
                images=iters * cfg.train_dataloader.batch_size)


def label_efficiency(work_dir, data_root, iters, seeds, labels, checkpoints=None, prefix=None):
    """Fine-tuning top-1 at every label count, mean +- std over ``seeds``.

    Args:
        work_dir (str): Parent of the runs' directories.
        data_root (str): The digits dataset.
        iters (int): Supervised iterations of every run.
        seeds (list[int]): Seed s fine-tunes ``checkpoints[s]`` and draws its labelled subset with s.
        labels (list[int | None]): Labelled images per class (None: all).
        checkpoints (dict[int, str], optional): Pre-trained checkpoint per seed. Defaults to None
            (random initialisation).
        prefix (str, optional): Run names are ``{prefix}-{labels}pc-seed{seed}``. Defaults to None
            ('ft' or 'scratch').

    Returns:
        dict: {'1', ..., 'all': mean/std/runs of top-1, ``train_images`` (labelled images),
        ``images`` (images seen per run), ``seconds`` (mean per run)}.
    """
    table = {}
    for n in labels:
        runs = [finetune(work_dir, data_root, iters, seed, n, checkpoint=checkpoints[seed] if checkpoints else None,
                         name=f'{prefix}-{n or "all"}pc-seed{seed}' if prefix else None) for seed in seeds]
        table[str(n or 'all')] = dict(mean_std([r['top1'] for r in runs]), train_images=runs[0]['train_images'],
                                      images=runs[0]['images'], seconds=float(np.mean([r['seconds'] for r in runs])))
    return table


# ------------------------------------------------------------------------------------------------ probes
def load_split(data_root, split):
    """All images of a digits split as the configs normalise them ((x - 127.5) / 127.5), and labels."""
    from PIL import Image
    images, labels = [], []
    for path in sorted(glob.glob(osp.join(data_root, split, '*', '*.png'))):
        images.append(np.asarray(Image.open(path).convert('RGB')))
        labels.append(int(osp.basename(osp.dirname(path))))
    pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
    return (pixels - 127.5) / 127.5, np.array(labels)


@torch.no_grad()
def mean_patch_features(backbone, images):
    backbone.eval()
    tokens = torch.cat([backbone.forward_features(chunk) for chunk in images.split(256)])
    # MPP never trains the class token directly, so the mean patch token is its natural summary.
    return tokens[:, backbone.num_prefix_tokens:].mean(dim=1).numpy()


def fewshot_probe(backbone, data_root, shots, seeds):
    """The paper's closed-form few-shot linear probe of frozen features, for several draws of the shots:
    {shots: mean/std/runs of test top-1 (%)}."""
    from vit_plugin.evaluation.fewshot import fewshot_linear_eval
    train_x, train_y = load_split(data_root, 'train')
    test_x, test_y = load_split(data_root, 'test')
    support, query = mean_patch_features(backbone, train_x), mean_patch_features(backbone, test_x)
    per_seed = [fewshot_linear_eval(support, train_y, query, test_y, shots=shots, seed=seed,
                                    num_classes=NUM_CLASSES) for seed in seeds]
    return {str(k): mean_std([r[k]['top1'] for r in per_seed]) for k in shots}


def random_backbone(model_cfg, seed=0):
    """The tiny ViT at its initial weights (the probe's baseline)."""
    from mmpretrain.registry import MODELS
    torch.manual_seed(seed)
    backbone = MODELS.build(model_cfg.backbone)
    backbone.init_weights()
    return backbone


def load_backbone(checkpoint):
    """The tiny ViT (``configs/_tiny_vit.py``) with the ``backbone.`` weights of ``checkpoint``: a
    pre-training runner's checkpoint of MPP or a converted MAE / MaskFeat encoder. Every key must fit."""
    from mmengine.config import Config
    from mmpretrain.registry import MODELS

    from vit_plugin.checkpoint import safe_torch_load
    backbone = MODELS.build(Config.fromfile(osp.join(CONFIGS, '_tiny_vit.py')).backbone)
    state = safe_torch_load(checkpoint)
    state = state.get('state_dict', state)
    backbone.load_state_dict({k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')})
    return backbone


def probe_over_seeds(backbones, data_root, shots):
    """The few-shot probe of one backbone per seed (its shots drawn with that seed), mean +- std over the
    seeds: {shots: mean/std/runs of test top-1 (%)}."""
    per_seed = {seed: fewshot_probe(backbone, data_root, shots, [seed]) for seed, backbone in backbones.items()}
    return {k: mean_std([per_seed[s][k]['mean'] for s in per_seed]) for k in map(str, shots)}


def marginal_entropy(data_root, patch_size):
    """Cross-entropy (nats) of the best context-free guess of the 3-bit mean colour: the colour-class
    frequencies of the training set. An MPP model below it uses what it sees."""
    from vit_plugin.models.selfsup.targets import mean_color_target
    images, _ = load_split(data_root, 'train')
    target = mean_color_target(images * 127.5 + 127.5, patch_size).flatten()
    freq = torch.bincount(target, minlength=512).double()
    freq = freq[freq > 0] / freq.sum()
    return float(-(freq * freq.log()).sum())


@torch.no_grad()
def context_use(model, data_root, corrupt_ratio=0.5, seed=0):
    """Does the MPP model read the visible neighbours? Its loss on the same test patches (i) when only
    they are masked and (ii) when every patch of the image is masked (position alone): a model that
    uses the context has (i) well below (ii).
    """
    from vit_plugin.models.selfsup.corruption import ACTION_MASK, CorruptionPlan, sample_corruption
    model.eval()
    images, _ = load_split(data_root, 'test')
    B = images.shape[0]
    ph, pw = model.backbone.patch_size
    N = (images.shape[2] // ph) * (images.shape[3] // pw)
    gen = torch.Generator().manual_seed(seed)
    some = sample_corruption(B, N, corrupt_ratio, mask_prob=1.0, random_prob=0.0, generator=gen)
    every = CorruptionPlan(ids=torch.arange(N).expand(B, N).contiguous(),
                           actions=torch.full((B, N), ACTION_MASK, dtype=torch.long),
                           sources=torch.zeros(B, N, dtype=torch.long), num_patches=N)
    target = model._gather(model._targets(images, N), some.ids)
    out = {}
    for name, plan in (('neighbours_visible', some), ('all_masked', every)):
        latent, _ = model.encode_corrupted(images, plan)
        out[name] = float(model.head.loss(model._gather(latent, some.ids), target)['loss'])
    return out
