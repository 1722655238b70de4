"""The simple feature pyramid (ViTDet): LayerNorm2d, strides and modes, maps laid out as mmcv's RoIAlign
reads them, and the backbone and neck under bf16 autocast."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.shapes_detection import build_detector, demo_cfg


# ---------------------------------------------------------------------------------------------- neck
def test_layer_norm_2d_normalises_channels():
    from vit_plugin.models.necks import LayerNorm2d
    norm = LayerNorm2d(6, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 6, 3, 5)
    ref = F.layer_norm(x.permute(0, 2, 3, 1), (6, ), norm.weight, norm.bias, 1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(norm(x), ref)


def test_simple_feature_pyramid_strides_and_modes():
    from vit_plugin.models.necks import SimpleFeaturePyramid
    single = SimpleFeaturePyramid(in_channels=64, out_channels=32, num_outs=5)
    single.init_weights()
    outs = single(torch.randn(2, 64, 6, 10))  # one stride-16 map of a 96x160 input
    assert [tuple(o.shape[1:]) for o in outs] == [(32, 24, 40), (32, 12, 20), (32, 6, 10), (32, 3, 5), (32, 2, 3)]
    # feeding mmdet's FPN: one map per branch, rescale only, ViTDet's widths
    rescale = SimpleFeaturePyramid(in_channels=64, out_channels=None)
    assert rescale.branch_channels == [16, 32, 64, 64]
    maps = [torch.randn(1, 64, 4, 4) for _ in range(4)]
    outs = rescale(maps)
    assert [tuple(o.shape[1:]) for o in outs] == [(16, 16, 16), (32, 8, 8), (64, 4, 4), (64, 2, 2)]
    torch.testing.assert_close(outs[2], maps[2])  # the 1x branch is the identity
    torch.testing.assert_close(outs[3], F.max_pool2d(maps[3], 2))
    with pytest.raises(ValueError, match='scale factors'):
        rescale(maps[:3])
    with pytest.raises(ValueError, match='4.0, 2.0, 1.0 or 0.5'):
        SimpleFeaturePyramid(in_channels=64, scale_factors=(8.0, ))
    # GroupNorm instead of channel LayerNorm: same shapes; each output level normalised per group
    grouped = SimpleFeaturePyramid(in_channels=64, out_channels=32, num_outs=5, norm='GN')
    grouped.init_weights()
    assert not any(isinstance(m, nn.LayerNorm) for m in grouped.modules())
    outs = grouped(torch.randn(2, 64, 6, 10))
    assert [tuple(o.shape[1:]) for o in outs][:4] == [(32, 24, 40), (32, 12, 20), (32, 6, 10), (32, 3, 5)]
    groups = outs[2].reshape(2, 32, -1)  # 32 channels -> 32 groups of one channel
    torch.testing.assert_close(groups.mean(-1), torch.zeros(2, 32), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="'LN' or 'GN'"):
        SimpleFeaturePyramid(in_channels=64, norm='BN')


@pytest.mark.parametrize('norm', ['LN', 'GN'])
def test_pyramid_maps_are_what_mmcv_roi_align_reads(norm):
    """Compiled mmcv's CPU RoIAlign reads a map's raw memory as NCHW: a map in channels-last memory (same
    values) gives wrong RoI features without any error (torchvision's kernels, which vit_plugin.ops uses
    without compiled mmcv, read values). Every pyramid level must therefore be contiguous, and RoIAlign on
    it must equal RoIAlign on a plain NCHW copy of the same values."""
    from mmcv.ops import roi_align

    from vit_plugin.models.necks import SimpleFeaturePyramid
    from vit_plugin.ops import ops_source
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16, 16)
    channels_last = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    rois = torch.tensor([[0, 2., 2., 10., 12.], [0, 0., 0., 15., 15.]])
    # why the neck must care: compiled mmcv silently misreads such a map
    misread = not torch.allclose(roi_align(channels_last, rois, (7, 7), 1.0, 2, 'avg', True),
                                 roi_align(x, rois, (7, 7), 1.0, 2, 'avg', True), atol=1e-3)
    assert misread == (ops_source()['kind'] == 'compiled')
    neck = SimpleFeaturePyramid(in_channels=32, out_channels=8, scale_factors=(2.0, 1.0, 0.5), norm=norm)
    neck.init_weights()
    for level, out in enumerate(neck(torch.randn(1, 32, 8, 8))):
        assert out.is_contiguous(), level
        plain = torch.empty(out.shape).copy_(out)  # NCHW memory, same values
        box = torch.tensor([[0, 0.5, 0.5, out.shape[-1] - 1.5, out.shape[-2] - 1.5]])
        torch.testing.assert_close(roi_align(out, box, (3, 3), 1.0, 2, 'avg', True),
                                   roi_align(plain, box, (3, 3), 1.0, 2, 'avg', True), msg=str(level))


def test_backbone_and_neck_under_bf16_autocast_match_fp32(tmp_path):
    """The mixed-precision path of our parts (what AmpOptimWrapper's autocast does on an accelerator):
    windowed ViT + simple pyramid under CPU bf16 autocast on a real, padded shapes batch stay finite,
    close to fp32, and give finite gradients to every backbone tensor. (mmcv's CPU NMS / RoIAlign have
    no bf16 kernels, so the heads are left to the fp32 part of this check.)"""
    from mmengine.dataset import pseudo_collate

    from mmdet.registry import DATASETS
    cfg = demo_cfg()
    model = build_detector(cfg)
    model.init_weights()
    cfg.train_dataloader.dataset.update(data_root=str(tmp_path) + '/', num_images=dict(train=2, val=1))
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    data = model.data_preprocessor(pseudo_collate([dataset[i] for i in range(2)]), training=True)
    inputs = data['inputs']
    assert inputs.shape[-2] % 32 == 0 and inputs.shape[-1] % 32 == 0
    reference = model.extract_feat(inputs)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        feats = model.extract_feat(inputs)
    assert len(feats) == 5
    for low, high in zip(feats, reference):
        assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
        assert (low.float() - high).abs().mean() < 0.05 * high.abs().mean()
    sum(f.float().square().mean() for f in feats).backward()
    for name, param in model.backbone.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    losses = model.loss(inputs, data['data_samples'])  # fp32 end to end, for completeness
    assert all(torch.isfinite(v).all() for k, v in model.parse_losses(losses)[1].items() if 'loss' in k)
