# Masked patch prediction, target 2) of the paper: each corrupted 16x16 patch averaged down to 4x4 cells,
# every cell a 3-bit colour (16 parallel 512-way predictions). Otherwise identical to vit_b16_mpp_in1k.py.
_base_ = ['./vit_b16_mpp_in1k.py']

model = dict(head=dict(target='downsized_4x4_3bit'))
