"""The XLA layer scan reaches a ViT through its one extension point (``ViT.set_block_runner``), finds
ViTs by type, and computes what the Python loop computes (torch_xla's CPU backend, in this process)."""
import pytest
import torch
import torch.nn as nn
from helpers.stack import import_torch_xla_or_skip_module

torch_xla = import_torch_xla_or_skip_module()  # the classic stack pins it: a missing one fails here

pytestmark = pytest.mark.xla

from vit_plugin.models import ViT  # noqa: E402
from vit_plugin.xla.scan import check_scannable, enable_layer_scan, scan_blocks  # noqa: E402

TINY = dict(arch=dict(embed_dims=24, num_layers=3, num_heads=2, mlp_dims=48), img_size=16, patch_size=4)


class LookAlike(nn.Module):
    """Has a ViT's attribute names, but is no ViT: the scan must leave it alone."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])
        self.block_runner = None


def test_layer_scan_switches_vits_by_type_through_set_block_runner():
    model = nn.Module()
    model.backbone, model.other = ViT(**TINY), LookAlike()
    assert enable_layer_scan(model) == ['backbone']
    assert model.backbone.block_runner is scan_blocks and model.other.block_runner is None
    with pytest.raises(ValueError, match='has no vit_plugin ViT backbone to scan'):
        enable_layer_scan(LookAlike())
    with pytest.raises(ValueError, match=r'neck \(LookAlike\) is not a vit_plugin ViT'):
        check_scannable(LookAlike(), 'neck')


def test_scanned_blocks_give_the_python_loops_outputs():
    torch.manual_seed(0)
    device = torch_xla.device()
    loop = ViT(**TINY, out_type='gap').eval()
    loop.init_weights()
    scanned = ViT(**TINY, out_type='gap').eval()
    scanned.load_state_dict(loop.state_dict())
    enable_layer_scan(scanned)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = loop(x)[0]
        got = scanned.to(device)(x.to(device))[0].cpu()
        features = scanned.forward_features(x.to(device)).cpu()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(features, loop.forward_features(x).detach(), rtol=0, atol=1e-5)
