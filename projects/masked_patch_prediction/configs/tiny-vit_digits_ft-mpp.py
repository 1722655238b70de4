# Fine-tune the MPP-pre-trained tiny ViT on the digits: tiny-vit_digits_scratch.py plus the backbone
# weights of an MPP runner checkpoint (prefix 'backbone.': the [mask] embedding and the MPP head are
# not loaded; the classifier stays zero-initialised). run_experiment.py sets the checkpoint path.
_base_ = ['./tiny-vit_digits_scratch.py']

model = dict(backbone=dict(init_cfg=dict(type='Pretrained', prefix='backbone.',
                                         checkpoint='work_dirs/mpp_tiny-vit_digits/iter_3000.pth')))
