from .corruption import CorruptionPlan, apply_corruption, sample_corruption
from .hog import PatchHOGGenerator
from .mpp import MaskedPatchPrediction
from .mpp_head import MPPHead
from .targets import TARGETS, compute_targets, unnormalize

__all__ = [
    'CorruptionPlan', 'MPPHead', 'MaskedPatchPrediction', 'PatchHOGGenerator', 'TARGETS', 'apply_corruption',
    'compute_targets', 'sample_corruption', 'unnormalize'
]
