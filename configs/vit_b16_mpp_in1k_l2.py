# Masked patch prediction, target 3) of the paper: L2 regression on all 16x16x3 pixel values of every
# corrupted patch (in the [-1, 1] input scale). Otherwise identical to vit_b16_mpp_in1k.py.
_base_ = ['./vit_b16_mpp_in1k.py']

model = dict(head=dict(target='pixel_l2'))
