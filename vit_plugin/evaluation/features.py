"""Frozen feature extraction for the few-shot evaluation, from any mmengine model."""
import inspect
from typing import Iterable, Iterator, List, Optional

import torch
import torch.nn as nn
from mmengine.model import is_model_wrapper

FEATURE_STAGES = ('backbone', 'neck', 'pre_logits')
TOKEN_POOLS = ('cls', 'mean')


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside a DDP/FSDP/XLA wrapper (or the model itself)."""
    return model.module if is_model_wrapper(model) else model


def pool_features(output, token_pool: str = 'cls') -> torch.Tensor:
    """One vector per image (B, D): a tuple's last entry; maps averaged; tokens by ``token_pool`` 'cls' or 'mean'."""
    while isinstance(output, (tuple, list)):
        if not output:
            raise ValueError('the model returned an empty tuple of features')
        output = output[-1]
    if not isinstance(output, torch.Tensor):
        raise TypeError(f'expected the model to return tensors, got {type(output).__name__}')
    if output.dim() == 4:
        return output.mean(dim=(2, 3))
    if output.dim() == 3:
        if token_pool not in TOKEN_POOLS:
            raise ValueError(f'token_pool must be one of {TOKEN_POOLS}, got {token_pool!r}')
        return output[:, 0] if token_pool == 'cls' else output.mean(dim=1)
    if output.dim() == 2:
        return output
    raise ValueError(f'cannot turn a feature tensor of shape {tuple(output.shape)} into one vector per image')


def _extract(model: nn.Module, inputs: torch.Tensor, stage: Optional[str]):
    extract = getattr(model, 'extract_feat', None)
    if extract is None:
        return model(inputs)
    if stage is not None and 'stage' in inspect.signature(extract).parameters:
        return extract(inputs, stage=stage)
    return extract(inputs)


def _label_of(sample) -> int:
    label = sample.get('gt_label') if isinstance(sample, dict) else getattr(sample, 'gt_label', None)
    if label is None:
        raise ValueError('few-shot evaluation needs a class label per image, but a data sample has no '
                         '`gt_label`; use a classification dataset (mmpretrain style, packed with PackInputs)')
    label = torch.as_tensor(label).reshape(-1)
    if label.numel() != 1:
        raise ValueError(f'few-shot evaluation needs exactly one class label per image, got {label.tolist()} '
                         '(multi-label datasets are not supported)')
    return int(label[0])


def _index_of(sample, fallback: int) -> int:
    meta = sample.get('metainfo', sample) if isinstance(sample, dict) else getattr(sample, 'metainfo', {})
    idx = meta.get('sample_idx') if isinstance(meta, dict) else None
    return int(idx) if idx is not None else fallback


@torch.no_grad()
def iter_feature_records(model: nn.Module,
                         dataloader: Iterable,
                         split: str,
                         feature_stage: Optional[str] = 'pre_logits',
                         token_pool: str = 'cls') -> Iterator[tuple]:
    """Yield ``(data_batch, records)``, records dict(feat, gt_label, split, sample_idx), float32 CPU features.

    The model runs as it is (call ``model.eval()`` first); ``feature_stage`` is ``extract_feat``'s ``stage``
    ('backbone', 'neck', 'pre_logits'); ``token_pool`` as :func:`pool_features`."""
    if feature_stage is not None and feature_stage not in FEATURE_STAGES:
        raise ValueError(f'feature_stage must be one of {FEATURE_STAGES} or None, got {feature_stage!r}')
    model = unwrap_model(model)
    count = 0
    for data_batch in dataloader:
        preprocessor = getattr(model, 'data_preprocessor', None)
        if preprocessor is not None:
            data = preprocessor(data_batch, False)
        else:
            data = dict(inputs=torch.stack(list(data_batch['inputs'])).float(),
                        data_samples=data_batch.get('data_samples'))
        feats = pool_features(_extract(model, data['inputs'], feature_stage), token_pool)
        feats = feats.detach().float().cpu()
        samples = data.get('data_samples') or data_batch.get('data_samples')
        if samples is None or len(samples) != feats.shape[0]:
            raise ValueError('each batch must carry one data sample (with gt_label) per image')
        records: List[dict] = []
        for feat, sample in zip(feats, samples):
            records.append(dict(feat=feat, gt_label=_label_of(sample), split=split,
                                sample_idx=_index_of(sample, count)))
            count += 1
        yield data_batch, records
