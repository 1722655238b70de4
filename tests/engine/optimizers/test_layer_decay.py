"""The layer-decay optimizer constructor: a learning rate per depth, and the names that get no weight decay."""
import pytest

from helpers.shapes_detection import build_detector, demo_cfg


TINY = dict(embed_dims=48, num_layers=4, num_heads=3, mlp_dims=96)


# ---------------------------------------------------------------------------------------------- layer decay
def test_layer_decay_constructor_assigns_lr_per_depth_and_no_decay_names():
    from mmengine.optim import build_optim_wrapper
    model = build_detector(demo_cfg())
    base_lr, rate, wd = 1e-3, 0.5, 0.05
    optim_wrapper = build_optim_wrapper(model, dict(
        type='OptimWrapper', constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=base_lr, weight_decay=wd), paramwise_cfg=dict(layer_decay_rate=rate)))
    groups = optim_wrapper.optimizer.param_groups
    assert groups[0]['lr'] == base_lr  # the lr mmengine logs is the base (head) lr
    num_layers = model.backbone.num_layers
    seen = set()
    for group in groups:
        for name in group['param_names']:
            if name.startswith('backbone.blocks.'):
                depth = int(name.split('.')[2]) + 1
            elif name in ('backbone.cls_token', 'backbone.pos_embed') or name.startswith('backbone.patch_embed'):
                depth = 0
            else:  # final norm, neck, heads
                depth = num_layers + 1
            assert group['lr'] == pytest.approx(base_lr * rate**(num_layers + 1 - depth)), name
            param = dict(model.named_parameters())[name]
            no_decay = (param.ndim == 1 or name in ('backbone.cls_token', 'backbone.pos_embed')
                        or '.attn.rel_pos_' in name)  # position tables, like pos_embed
            assert group['weight_decay'] == (0 if no_decay else wd), name
            seen.add(name)
    assert seen == {n for n, p in model.named_parameters() if p.requires_grad}
    # an mmpretrain classifier (whose get_layer_depth takes only the name) works the same way
    from mmengine.registry import init_default_scope

    from mmpretrain.registry import MODELS as PRETRAIN_MODELS
    init_default_scope('mmpretrain')
    classifier = PRETRAIN_MODELS.build(dict(type='ImageClassifier', backbone=dict(type='vit_plugin.ViT', arch=TINY),
                                            head=dict(type='LinearClsHead', num_classes=3, in_channels=48)))
    groups = build_optim_wrapper(classifier, dict(
        constructor='vit_plugin.LayerDecayOptimWrapperConstructor', optimizer=dict(type='AdamW', lr=1.0, weight_decay=wd),
        paramwise_cfg=dict(layer_decay_rate=rate))).optimizer.param_groups
    lr_of = {n: g['lr'] for g in groups for n in g['param_names']}
    wd_of = {n: g['weight_decay'] for g in groups for n in g['param_names']}
    assert lr_of['head.fc.weight'] == 1.0 and lr_of['backbone.blocks.3.mlp.fc1.weight'] == rate
    assert lr_of['backbone.pos_embed'] == rate**5 and wd_of['backbone.pos_embed'] == 0
    assert wd_of['backbone.blocks.0.attn.qkv.weight'] == wd
    with pytest.raises(KeyError, match='layer_decay'):
        build_optim_wrapper(model, dict(constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
                                        optimizer=dict(type='AdamW', lr=1e-3), paramwise_cfg=dict(decay_rate=0.5)))
