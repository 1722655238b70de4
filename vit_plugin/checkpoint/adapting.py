"""The interface of a module that turns incoming weights of another layout into its own as they load."""
import abc
from typing import Dict, List

import torch


class AdaptsIncomingWeights(abc.ABC):
    """A module that adapts the weights it is given as they load (e.g. ``LabelSpaceClsHead``).

    Call :meth:`adapt_incoming_weights` from the module's load-state-dict pre-hook; the strict loader
    calls it before comparing shapes. A second call changes nothing.
    """

    @abc.abstractmethod
    def adapt_incoming_weights(self, state_dict: Dict[str, torch.Tensor], prefix: str) -> List[str]:
        """Adapt the ``prefix`` part of ``state_dict`` to this module, in place.

        Returns:
            list[str]: One message per change made (already logged).

        Raises:
            ValueError: Weights this module cannot take, with what to set.
        """
