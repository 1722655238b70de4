"""Test helper imported into training subprocesses via ``custom_imports``.

``HostPlanMPP`` is masked patch prediction with its corruption plan drawn from the host's torch
generator and then moved to the model's device. On an XLA device ``torch.rand`` draws from XLA's own
generator, whose numbers differ from the CPU's, so without this the XLA and eager-CPU runs would
corrupt different patches and their losses could not be compared number for number.
"""
from mmpretrain.registry import MODELS

from vit_plugin.models.selfsup.corruption import CorruptionPlan
from vit_plugin.models.selfsup.mpp import MaskedPatchPrediction


@MODELS.register_module()
class HostPlanMPP(MaskedPatchPrediction):

    def sample_corruption(self, batch_size, num_patches, device=None):
        plan = super().sample_corruption(batch_size, num_patches, device=None)
        return CorruptionPlan(plan.ids.to(device), plan.actions.to(device), plan.sources.to(device),
                              plan.num_patches)
