from .label_space_head import LabelSpaceClsHead, describe_remap, remap_head_rows

__all__ = ['LabelSpaceClsHead', 'describe_remap', 'remap_head_rows']
