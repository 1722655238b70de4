from . import hooks  # noqa: F401
from .checkpointing import AtomicCheckpointHook, find_resumable_checkpoint  # noqa: F401
from .fsdp2 import FSDP2Strategy, vit_block_wrap_policy  # noqa: F401
from .global_batch import apply_global_batch_size, world_size_from_env  # noqa: F401
from .loops import IterBasedTrainLoop, ResumableDataloaderIterator  # noqa: F401
from . import optimizers  # noqa: F401
from .preemption import EXIT_PREEMPTED, PreemptionHook, TrainingPreempted  # noqa: F401
from .plan import RunEnv, RunPlan, plan_run  # noqa: F401
from .runner import FlexibleRunner, Runner, prepare_run  # noqa: F401
