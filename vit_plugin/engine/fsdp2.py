"""FSDP2 for mmengine's ``FlexibleRunner``, with sharded checkpoints (docs/scaling.md#sharded-training-with-fsdp2)."""
import os
import os.path as osp
import re
import shutil
import time
from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import is_distributed, is_main_process
from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from vit_plugin.checkpoint.safe_load import safe_torch_load
from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.compat.mmengine import DDPStrategy
from vit_plugin.engine.checkpointing import (ASIDE_SUFFIX, COMPLETE_MARKER, EXTRA_FILE, PARTIAL_SUFFIX,
                                             atomic_write_bytes, checkpoint_problem, fsync_directory,
                                             is_sharded_checkpoint, sharded_checkpoint_problem)
from vit_plugin.models.layers import EncoderBlock
from vit_plugin.registry import FUNCTIONS, STRATEGIES


@FUNCTIONS.register_module()
def vit_block_wrap_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int,
                          block_types: Optional[Sequence[type]] = None) -> bool:
    """FSDP auto-wrap policy (FSDP1 protocol): one unit per module of ``block_types`` (default ``EncoderBlock``)."""
    if recurse:
        return True
    return isinstance(module, tuple(block_types) if block_types else (EncoderBlock, ))


def commit_directory(partial: str, filename: str) -> None:
    """Rename the complete directory ``partial`` to ``filename``; a complete checkpoint exists throughout."""
    aside = filename + ASIDE_SUFFIX
    if osp.exists(filename):
        if osp.exists(aside):  # an older aside copy; filename itself is complete
            shutil.rmtree(aside)
        os.replace(filename, aside)
    os.replace(partial, filename)  # the commit
    fsync_directory(osp.dirname(osp.abspath(filename)))
    shutil.rmtree(aside, ignore_errors=True)


def _shard_placement(world_size: int) -> Callable:
    """Shard on dim 0, or on the largest dim where dim 0 is shorter than the world size."""
    from torch.distributed.tensor import Shard

    def placement(param: nn.Parameter):
        if param.dim() == 0 or param.shape[0] >= world_size:
            return Shard(0)
        return Shard(max(range(param.dim()), key=lambda d: param.shape[d]))
    return placement


def consolidate_sharded_checkpoint(src: str, dst: str) -> dict:
    """Write the sharded checkpoint directory ``src`` as one ordinary file ``dst`` (no optimizer state) and
    return it; one process. Raises ValueError if ``src`` is not a complete sharded checkpoint.
    """
    import io
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    problem = checkpoint_problem(src) if osp.isdir(src) else f'is not a sharded checkpoint directory'
    if problem is not None:
        raise ValueError(f'Cannot consolidate {src}: it {problem}.')
    with tempfile.TemporaryDirectory(dir=osp.dirname(osp.abspath(dst)) or None) as tmp:
        full = osp.join(tmp, 'full.pth')
        dcp_to_torch_save(src, full)
        tensors = safe_torch_load(full, map_location='cpu')
    extra = safe_torch_load(osp.join(src, EXTRA_FILE), map_location='cpu')
    meta = dict(extra.get('meta', {}), sharded=False, consolidated_from=osp.basename(osp.normpath(src)))
    checkpoint = {'meta': meta, 'state_dict': tensors['model']}
    if 'ema' in tensors:  # mmengine's EMA layout: state_dict averaged, ema_state_dict as trained
        checkpoint['ema_state_dict'] = tensors['ema']
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(buffer.getvalue(), dst)
    return checkpoint


def _barrier():
    if is_distributed():
        dist.barrier()


@STRATEGIES.register_module()
class FSDP2Strategy(DDPStrategy):
    """Shard the model with FSDP2: one ``fully_shard`` unit per Transformer block, one for the rest.

    Args:
        wrap_policy (str | callable): Selects the modules sharded as their own unit, called as
            ``policy(module, recurse=False, nonwrapped_numel=0)``. Defaults to
            'vit_plugin.vit_block_wrap_policy'.
        mixed_precision (str, optional): 'bf16': bf16 compute, fp32 gradient reduction (GPUs).
            Defaults to None (fp32).
        reshard_after_forward (bool): Free a unit's gathered parameters after its forward pass.
            Defaults to True.
        **kwargs: Passed to mmengine's ``DDPStrategy`` (``model_wrapper`` is not used).
    """

    def __init__(self, *, wrap_policy: Union[str, Callable] = 'vit_plugin.vit_block_wrap_policy',
                 mixed_precision: Optional[str] = None, reshard_after_forward: bool = True, **kwargs):
        kwargs.pop('model_wrapper', None)
        super().__init__(**kwargs)
        if isinstance(wrap_policy, str):
            name = wrap_policy
            wrap_policy = MMENGINE_FUNCTIONS.get(name)
            if wrap_policy is None:
                raise ValueError(f'FSDP2Strategy(wrap_policy={name!r}): no such function is registered; '
                                 f'use e.g. "vit_plugin.vit_block_wrap_policy".')
        if mixed_precision not in (None, 'bf16'):
            raise ValueError(f"FSDP2Strategy(mixed_precision={mixed_precision!r}): use None (fp32) or 'bf16'.")
        self.wrap_policy = wrap_policy
        self.mixed_precision = mixed_precision
        self.reshard_after_forward = reshard_after_forward

    # ----------------------------------------------------------------------------------- model
    def _wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(get_device())
        if not is_distributed():  # one process: nothing to shard; checkpoints still go through DCP
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device_type = 'cuda' if get_device() == 'cuda' else 'cpu'
        mesh = init_device_mesh(device_type, (dist.get_world_size(), ))
        options = dict(mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                       shard_placement_fn=_shard_placement(dist.get_world_size()))
        if self.mixed_precision == 'bf16':
            options['mp_policy'] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        units = [m for m in model.modules() if m is not model
                 and self.wrap_policy(m, recurse=False, nonwrapped_numel=0)]
        if not units:
            self.logger.warning('FSDP2Strategy: the wrap policy selected no module; the model is sharded as '
                                'one unit (all parameters are gathered at once).')
        for unit in units:  # innermost first is not needed: the policy selects disjoint blocks
            fully_shard(unit, **options)
        fully_shard(model, **options)
        self.logger.info(f'FSDP2: {len(units)} block units + the root, sharded over {dist.get_world_size()} '
                         f'processes')
        return model

    def build_optim_wrapper(self, optim_wrapper, model=None):
        """mmengine's optimizer wrapper, whose gradient clipping returns the global norm over all shards."""
        wrapper = super().build_optim_wrapper(optim_wrapper, model)
        clip = getattr(wrapper, 'clip_func', None)
        if clip is torch.nn.utils.clip_grad_norm_:
            def clip_global(params, **kwargs):
                norm = clip(params, **kwargs)
                return norm.full_tensor() if hasattr(norm, 'full_tensor') else norm
            wrapper.clip_func = clip_global
        return wrapper

    # ----------------------------------------------------------------------------------- saving
    def save_checkpoint(self, filename: str, *, save_optimizer: bool = True, save_param_scheduler: bool = True,
                        extra_ckpt: Optional[dict] = None, callback: Optional[Callable] = None) -> None:
        """Write the sharded checkpoint directory ``filename`` (every process writes its shards)."""
        start = time.perf_counter()
        optimizers = self.optim_wrapper.optimizer if save_optimizer and hasattr(self, 'optim_wrapper') else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        tensors = {}
        if save_optimizer and hasattr(self, 'optim_wrapper'):
            tensors['optim'] = optim_sd
        extra = dict(extra_ckpt or {})
        extra.setdefault('meta', {}).update(seed=self.seed, sharded=True,
                                            world_size=dist.get_world_size() if is_distributed() else 1)
        if save_param_scheduler and hasattr(self, 'param_schedulers'):
            extra['param_schedulers'] = self.scheduler_state_dict()
        # The hooks see the model's (sharded) state dict as mmengine's do: an EMA hook swaps the
        # averaged weights into it and adds ``ema_state_dict``. Both tensor dicts are then saved as
        # shards, not pickled into the rank-0 file.
        extra['state_dict'] = model_sd
        if callback is not None:
            callback(extra)
        tensors['model'] = extra.pop('state_dict')
        if 'ema_state_dict' in extra:
            tensors['ema'] = extra.pop('ema_state_dict')
            extra['meta']['ema'] = True

        partial = filename + PARTIAL_SUFFIX
        if is_main_process():
            shutil.rmtree(partial, ignore_errors=True)  # debris of an earlier interrupted save
            os.makedirs(partial)
        _barrier()
        dcp.save(tensors, checkpoint_id=partial)
        if is_main_process():  # every shard is written (dcp.save returns after all processes finished)
            with open(osp.join(partial, EXTRA_FILE), 'wb') as f:
                torch.save(extra, f)
                f.flush()
                os.fsync(f.fileno())
            with open(osp.join(partial, COMPLETE_MARKER), 'w') as f:
                f.write('complete\n')
                f.flush()
                os.fsync(f.fileno())
            commit_directory(partial, filename)
        _barrier()
        self.logger.info(f'Saved sharded checkpoint {filename} in {time.perf_counter() - start:.2f} s')

    # ----------------------------------------------------------------------------------- loading
    def _load_sharded(self, filename: str, with_optimizer: bool, callback: Optional[Callable]) -> dict:
        problem = sharded_checkpoint_problem(filename)
        if problem is not None:
            raise FileNotFoundError(f'{filename} {problem}; resume from an older one.')
        optimizers = self.optim_wrapper.optimizer if with_optimizer else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        tensors = {'model': model_sd}
        if with_optimizer:
            tensors['optim'] = optim_sd
        checkpoint = safe_torch_load(osp.join(filename, EXTRA_FILE), map_location='cpu')
        if checkpoint.get('meta', {}).get('ema'):
            tensors['ema'] = self._ema_template(filename, model_sd)
        dcp.load(tensors, checkpoint_id=filename)
        checkpoint['state_dict'] = tensors['model']
        if 'ema' in tensors:
            checkpoint['ema_state_dict'] = tensors['ema']
        if callback is not None:
            callback(checkpoint)
        set_state_dict(self.model, optimizers, model_state_dict=checkpoint['state_dict'],
                       optim_state_dict=tensors.get('optim', {}))
        return checkpoint

    @staticmethod
    def _ema_template(filename: str, model_sd: dict) -> dict:
        from torch.distributed.checkpoint import FileSystemReader
        metadata = FileSystemReader(filename).read_metadata().state_dict_metadata
        template = {}
        for fqn, info in metadata.items():
            if not fqn.startswith('ema.'):
                continue
            key = fqn[len('ema.'):]
            if key.startswith('module.') and key[len('module.'):] in model_sd:
                template[key] = torch.empty_like(model_sd[key[len('module.'):]])
            elif hasattr(info, 'size'):
                template[key] = torch.zeros(tuple(info.size), dtype=info.properties.dtype)
        return template

    def load_checkpoint(self, filename: str, *, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')], callback: Optional[Callable] = None) -> dict:
        """Load weights: a sharded checkpoint directory (resharded to this run) or an ordinary file."""
        if not is_sharded_checkpoint(filename):
            return super().load_checkpoint(filename, map_location=map_location, strict=strict,
                                           revise_keys=revise_keys, callback=callback)
        self.logger.info(f'Load sharded checkpoint from {filename}')
        return self._load_sharded(filename, with_optimizer=False, callback=callback)

    def load_model_state_dict(self, state_dict: dict, *, strict: bool = False,
                              revise_keys: list = [(r'^module.', '')]) -> None:
        """Load a full (unsharded) state dict into the sharded model; each process keeps its shard."""
        if not is_distributed():
            return super().load_model_state_dict(state_dict, strict=strict, revise_keys=revise_keys)
        for pattern, replacement in revise_keys:
            state_dict = {re.sub(pattern, replacement, k): v for k, v in state_dict.items()}
        set_model_state_dict(self.model, state_dict,
                             options=StateDictOptions(full_state_dict=True, strict=strict))

    def resume(self, filename: str, *, resume_optimizer: bool = True, resume_param_scheduler: bool = True,
               map_location='default', callback: Optional[Callable] = None) -> dict:
        """Resume weights, optimizer state (both resharded to this run), schedulers and the seed."""
        if not is_sharded_checkpoint(filename):
            raise ValueError(f'{filename} is not a sharded checkpoint directory; a run with --fsdp resumes '
                             f'from the iter_N.pth/ directories it writes (load other weights with load_from).')
        start = time.perf_counter()
        self.logger.info(f'Resume sharded checkpoint from {filename}')
        checkpoint = self._load_sharded(filename, with_optimizer=resume_optimizer, callback=callback)
        if resume_param_scheduler and hasattr(self, 'param_schedulers') and 'param_schedulers' in checkpoint:
            self.load_scheduler_state_dict(checkpoint.pop('param_schedulers'))
        accumulative_counts = mmengine_compat.accumulative_counts(getattr(self, 'optim_wrapper', None))
        if accumulative_counts > 1:  # gradient accumulation restarts its count where the run stopped
            self.optim_wrapper.initialize_count_status(self.model, checkpoint['meta']['iter'],
                                                       self.dispatch_kwargs['max_iters'])
        seed = checkpoint['meta'].get('seed')
        if seed is not None and seed != self._randomness.get('seed'):
            self._randomness.update(seed=seed)
            self._set_randomness(**self._randomness)
        self.logger.info(f'Resumed in {time.perf_counter() - start:.2f} s')
        return checkpoint
