# ImageNet-21k for pre-training, one-folder-per-class layout (as unpacked from the winter21/fall11
# tarballs):  data/imagenet21k/train/<wnid>/<image>.JPEG
# Classes are the sorted sub-folder names. Scanning 14M files takes a while at start-up (and on
# every process); generating meta/train.txt once and using _base_/datasets/imagenet21k.py is faster.
_base_ = ['./imagenet21k.py']
train_dataloader = dict(dataset=dict(ann_file='', data_prefix='train'))
