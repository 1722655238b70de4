"""The fine-tuning transfer of a converted checkpoint: a zero-initialised head and the pre-logits layer."""
import torch

from helpers.official_npz import official_arrays
from vit_plugin.converters import convert_jax_vit, finetune_transfer


def test_finetune_transfer_zero_head_and_pre_logits():
    state = convert_jax_vit(official_arrays(pre_logits=24))[0]
    new, report = finetune_transfer(state, num_classes=7)
    assert not any(k.startswith('head.layers.pre_logits') for k in new)
    assert new['head.layers.head.weight'].shape == (7, 32) and not new['head.layers.head.weight'].any()
    assert new['head.layers.head.bias'].shape == (7, ) and not new['head.layers.head.bias'].any()
    assert {'head.layers.head.weight', 'head.layers.pre_logits.weight'} <= set(report.dropped)
    kept, _ = finetune_transfer(state, num_classes=7, keep_pre_logits=True)
    assert torch.equal(kept['head.layers.pre_logits.weight'], state['head.layers.pre_logits.weight'])
    assert kept['head.layers.head.weight'].shape == (7, 24)
    assert all(torch.equal(new[k], state[k]) for k in state if k.startswith('backbone.'))
