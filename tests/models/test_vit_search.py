"""The one search for a sub-module inside a model, and the ViT search the offline tools use."""
import pytest
import torch.nn as nn

from vit_plugin.models.backbones.vit import ViT
from vit_plugin.models.vit_search import WrongModelError, find_module, find_vit

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)


def test_find_module_returns_the_first_match_with_its_prefix():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    assert find_module(model, lambda m: isinstance(m, nn.Linear)) == ('0.', model[0])
    assert find_module(model, lambda m: isinstance(m, nn.ReLU)) == ('1.0.', model[1][0])
    assert find_module(model, lambda m: m is model) == ('', model)  # the model itself first
    assert find_module(model, lambda m: isinstance(m, nn.Conv2d)) is None


def test_find_vit_names_the_backbone_or_refuses():
    vit = ViT(arch=TINY, img_size=16, patch_size=4)
    model = nn.ModuleDict(dict(backbone=vit, head=nn.Linear(32, 10)))
    assert find_vit(model) == (vit, 'backbone.')
    assert find_vit(vit) == (vit, '')
    with pytest.raises(WrongModelError, match='contains no vit_plugin.ViT backbone'):
        find_vit(nn.Linear(2, 2))
