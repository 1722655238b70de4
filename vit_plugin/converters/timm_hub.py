"""timm's ``timm/vit_*`` hub repositories as our whole classifiers.

See docs/checkpoints.md#the-papers-weights-from-the-hugging-face-hub."""
import json
import os.path as osp
import re
from typing import Any, Dict, Optional

from mmengine.logging import print_log

from .common import BACKBONE_PREFIX, HEAD_PREFIX, unwrap_state_dict
from .torch_formats import timm_to_vit

#: The ResNet of timm's hybrids (``vit_base_r50_s16_*``, ``vit_tiny_r_s16_p8_*``): the same names in ours.
_HYBRID_RESNET = re.compile(r'^patch_embed\.backbone\.')


def read_timm_config(path: str) -> Optional[Dict[str, Any]]:
    """A ``config.json`` written by timm (it names an ``architecture``), or None for another library's."""
    with open(path) as f:
        config = json.load(f)
    return config if isinstance(config, dict) and 'architecture' in config else None


def adapt_timm_checkpoint(checkpoint: Any, weights: str, config_file: Optional[str]) -> Any:
    """Safe-loader adapter: timm ViT weights beside timm's ``config.json`` -> our classifier (class names
    from ``label_names``); a file with keys ours cannot place is returned unchanged."""
    if not config_file or not isinstance(checkpoint, dict):
        return checkpoint
    config = read_timm_config(config_file)
    state_dict = unwrap_state_dict(checkpoint)
    if config is None or any(k.startswith(BACKBONE_PREFIX) for k in state_dict) or \
            not any(re.match(r'blocks\.\d+\.attn\.qkv\.weight$', k) for k in state_dict):
        return checkpoint
    resnet = {k: v for k, v in state_dict.items() if _HYBRID_RESNET.match(k)}
    out, report = timm_to_vit({k: v for k, v in state_dict.items() if k not in resnet}, source=weights)
    if report.unknown:
        return checkpoint
    out.update({BACKBONE_PREFIX + k: v for k, v in resnet.items()})
    meta: Dict[str, Any] = dict(source=osp.basename(weights), source_format='timm')
    names = config.get('label_names')
    head = out.get(HEAD_PREFIX + 'head.weight')
    if names and head is not None and len(names) == head.shape[0]:
        meta['dataset_meta'] = dict(classes=list(names))
    print_log(f'{weights}: timm {config["architecture"]} converted to vit_plugin\'s classifier layout '
              f'({len(out)} tensors).', logger='current')
    return dict(state_dict=out, meta=meta)
