"""A trial across K ranks (docs/cluster.md#a-trial-across-k-ranks): the process group, the wrapping
(DDP, or FSDP2 where one rank's memory cannot hold the model's state), each rank's share of a batch,
and the checkpoint state gathered whole so it resumes at any world size.

A group is K processes launched by torchrun (`torchrun --nproc-per-node K -m archhpo worker ...`)
or by Ray Train's TorchTrainer; one rank per GPU (nccl), gloo on CPU. Every collective is bounded
by the group's timeout (`ARCHHPO_GROUP_TIMEOUT_S`, archhpo/environment.py): a dead or stalled rank
ends the group within it rather than after torch's 30 minutes. Control messages (the claim,
rung decisions, the stop flag) travel on a gloo side group of CPU tensors, so deciding to stop
before a step never waits for the device.

Checkpoints stay the one checksummed, weights_only file of workers/_checkpoints.py: under FSDP2
the state is gathered whole with torch.distributed.checkpoint's state-dict API on rank 0 (DCP's
own sharded format reads its metadata with pickle, which a checkpoint must never need).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from archhpo.config import SHARDS
from archhpo.environment import Environment
from archhpo.errors import ArchhpoError, TrialLost

# A model FSDP2 sharded in place -> its Ranks: a WSD cooldown branch shards a copy of it alike (Ranks.fork).
_SHARDED: weakref.WeakKeyDictionary[nn.Module, Ranks] = weakref.WeakKeyDictionary()


def is_group_failure(exc: BaseException) -> bool:
    """A collective that failed because a peer died, stalled past the timeout or closed its link."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        k in text for k in ("gloo", "nccl", "connection closed by peer", "connection reset", "timed out"))


@dataclass
class Group:
    """This process's place in a trial group; `control` is the gloo side group for decisions;
    `owned`: this process initialised the default group (torchrun), not Ray Train."""

    rank: int
    world: int
    device: torch.device
    timeout_s: float
    control: Any
    owned: bool = False

    def leave(self) -> None:
        """Destroy the groups this process made, once its last collective is done: gloo's threads
        still running at interpreter exit can abort a finished rank ("terminate called without an
        active exception", exit -6), which torchrun reports as a failed group."""
        dist.destroy_process_group(self.control)
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (pickled on rank 0 only: its own claim and decisions)."""
        box = [obj if self.lead else None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def agree(self, code: int) -> int:
        """The largest of every rank's `code` (0: go on), asked by every rank before each step."""
        flag = torch.tensor([int(code)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        return int(flag.item())  # a CPU tensor: no device is waited for

    def decide(self, ask: Callable[[], bool]) -> bool:
        """Rank 0 asks the queue (`ask`: a rung report, True to prune); every rank gets its answer
        in the same validation, so every rank stops in the same step. Fenced out: TrialLost on all."""
        verdict: str | None = None
        if self.lead:
            try:
                verdict = "prune" if ask() else "go"
            except TrialLost:
                verdict = "lost"
            self.broadcast(verdict)
        else:
            verdict = self.broadcast()
        if verdict == "lost":
            raise TrialLost("the trial was reaped while this group held it")
        return verdict == "prune"


def join_group(device: str = "auto", timeout_s: float | None = None) -> Group | None:
    """This process's group when it runs under torchrun or Ray Train (WORLD_SIZE > 1), else None.

    A group Ray Train set up is adopted; otherwise it is initialised from torchrun's environment
    (nccl with one GPU per rank by LOCAL_RANK, gloo on CPU), its timeout bounded."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 and not dist.is_initialized():
        return None
    timeout = Environment.read().group_timeout_s if timeout_s is None else float(timeout_s)
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    cuda = device != "cpu" and torch.cuda.is_available()
    dev = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    owned = not dist.is_initialized()
    if owned:
        wait = dt.timedelta(seconds=timeout)
        store = _restart_store(world, wait)
        dist.init_process_group("nccl" if cuda else "gloo", timeout=wait, device_id=dev if cuda else None,
                                **({} if store is None else {"store": store, "rank": int(os.environ["RANK"]),
                                                             "world_size": world}))
    control = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout))
    return Group(dist.get_rank(), dist.get_world_size(), dev, timeout, control, owned)


def _restart_store(world: int, timeout: dt.timedelta) -> Any:
    """torchrun's agent store with this incarnation's keys apart (None: not under torchrun's agent).
    The agent keeps one store across `--max-restarts`: a restarted rank would otherwise read the
    dead group's addresses and fail to connect."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                         timeout=timeout)
    return dist.PrefixStore(f"archhpo/restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def choose_shard(requested: str, ddp_rank_bytes: int, param_count: int, world: int, free_bytes: int,
                 safety: float) -> str:
    """ddp or fsdp: as asked, or (auto) DDP while one rank holds the whole state and its share of
    the batch within `safety` of the device's free memory, FSDP2 once it would not."""
    if requested not in SHARDS:
        raise ArchhpoError(f"shard {requested!r} is not one of {', '.join(SHARDS)}; use auto, ddp or fsdp.")
    if requested != "auto":
        return requested
    return "ddp" if world <= 1 or ddp_rank_bytes <= safety * free_bytes else "fsdp"


def rank_shape(shape: Any, world: int, mode: str) -> Any:
    """One rank's memory shape (workers/_memory.TrialShape): its share of the batch, and under FSDP2
    1/K of the weights, gradients and AdamW moments (one layer's gathered weights are transient)."""
    share = dataclasses.replace(shape, batch_size=math.ceil(shape.batch_size / world))
    if mode == "fsdp":
        share = dataclasses.replace(share, param_count=math.ceil(shape.param_count / world))
    return share


class _Scaled(torch.autograd.Function):
    """The loss as it is, its gradient times `grad_k`: each rank's mean-loss gradient weighted by its
    share of the batch, so the ranks' average is the whole batch's mean-loss gradient, however the
    batch splits (a last batch that K does not divide); `value_k` 0 silences a stand-in share."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, value_k: float, grad_k: float) -> torch.Tensor:
        ctx.grad_k = grad_k
        return loss * value_k

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad * ctx.grad_k, None, None


class Ranks:
    """What train() asks of a group (workers/_train.py): the wrapped model, this rank's share of each
    batch, sums over ranks, and the run's state whole (the format a 1-rank run saves and loads)."""

    def __init__(self, group: Group, mode: str) -> None:
        self.group, self.mode = group, mode
        self.inner: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None  # the run's, set by train() once made
        self.template: nn.Module | None = None  # FSDP2: the model before sharding, weights on meta
        self._value_k, self._grad_k = 1.0, 1.0  # this step's share (set by `share`, read by `loss`)

    def wrap(self, model: nn.Module) -> nn.Module:
        """DDP around `model`, or FSDP2 applied to it in place (every block, then the whole)."""
        self.inner = model
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            cuda = self.group.device.type == "cuda"
            return DDP(model, device_ids=[self.group.device] if cuda else None, forward_sync_buffers=False)
        self.template = _meta_copy(model)
        _SHARDED[model] = self
        _fully_shard(model, self.group)
        return model

    def fork(self) -> tuple[nn.Module, Ranks]:
        """A WSD cooldown branch of this FSDP2 run: a copy of the model (weights on meta until
        wrapped) and the ranks that shard it as this run is sharded and fill each rank's shard,
        weights and AdamW moments, from this rank's own; no rank ever holds the whole copy."""
        assert self.template is not None and self.inner is not None and self.optimizer is not None
        return _meta_copy(self.template), _Fork(self)

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a batch's indices (sizes differ by at most one). A rank a
        batch smaller than K leaves without samples trains on the batch's first with no weight."""
        world = self.group.world
        part = batch.tensor_split(world)[self.group.rank]
        self._value_k, self._grad_k = 1.0, world * len(part) / max(1, len(batch))
        if len(part) == 0:
            part, self._value_k = batch[:1], 0.0
        return part

    def loss(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
             ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """`loss_fn` with this rank's share of the batch weighting its gradient (`_Scaled`)."""
        def scaled(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return _Scaled.apply(loss_fn(out, target), self._value_k, self._grad_k)

        return scaled

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (a copy: every rank's own running sum stays its own)."""
        out = value.detach().clone()
        dist.all_reduce(out)
        return out

    def own(self, value: torch.Tensor) -> torch.Tensor:
        """A group-wide sum resumed: rank 0 carries it, the others start from zero."""
        return value if self.group.lead else torch.zeros_like(value)

    def states(self, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's and optimizer's state as one process would hold them (gathered under FSDP2)."""
        assert self.inner is not None
        if self.mode == "ddp":
            return self.inner.state_dict(), opt.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        model_sd, optim_sd = get_state_dict(self.inner, opt, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        return model_sd, _by_index(self.inner, optim_sd)

    def load(self, opt: torch.optim.Optimizer, resume: dict[str, Any]) -> None:
        """A whole state (saved at any world size) into this rank's model and optimizer."""
        assert self.inner is not None
        if self.mode == "ddp":
            self.inner.load_state_dict(resume["model"])
            opt.load_state_dict(resume["optimizer"])
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.inner, opt, model_state_dict=resume["model"],
                       optim_state_dict=_by_name(self.inner, resume["optimizer"]),
                       options=StateDictOptions(full_state_dict=True))


class _Fork(Ranks):
    """The ranks of a cooldown branch forked from an FSDP2 run (Ranks.fork): the same group and
    mesh, so each rank's shard of the copy is the shard it holds of the run."""

    def __init__(self, live: Ranks) -> None:
        super().__init__(live.group, "fsdp")
        self.live = live

    def wrap(self, model: nn.Module) -> nn.Module:
        """Shard the meta copy, allocate only this rank's shards and copy the run's into them."""
        assert self.live.inner is not None
        self.inner = model
        _fully_shard(model, self.group)
        model.to_empty(device=self.group.device)
        with torch.no_grad():
            for new, old in zip(model.parameters(), self.live.inner.parameters(), strict=True):
                _local(new).copy_(_local(old))
            for new_b, old_b in zip(model.buffers(), self.live.inner.buffers(), strict=True):
                new_b.copy_(old_b)  # buffers are whole on every rank (masks, rotary tables)
        return model

    def load(self, opt: torch.optim.Optimizer, resume: dict[str, Any]) -> None:
        """The run's AdamW moments and steps, this rank's shards of them (a copy: the run goes on)."""
        assert self.live.optimizer is not None
        opt.load_state_dict(copy.deepcopy(self.live.optimizer.state_dict()))


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter (a DTensor)."""
    return p.to_local()  # type: ignore[attr-defined]


def sharded_ranks(model: nn.Module) -> Ranks | None:
    """The Ranks that sharded `model` with FSDP2 (Ranks.wrap); None for any other model (alone,
    or under DDP, whose replica is whole and is copied as a model alone is)."""
    return _SHARDED.get(model)


def _fully_shard(model: nn.Module, group: Group) -> None:
    """FSDP2 in place over the group's ranks: every block, then the whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(group.device.type, (group.world,))
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` whose parameters live on the meta device (no bytes); its buffers are
    copied (small, and some are not in a state dict: masks, rotary tables)."""
    memo: dict[int, Any] = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
                            for p in model.parameters()}
    return copy.deepcopy(model, memo)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one: the children of the model's ModuleLists."""
    return [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]


def _names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def _by_index(model: nn.Module, optim_sd: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) as
    Optimizer.state_dict() keys it (by position), which a 1-rank run loads."""
    index = {name: i for i, name in enumerate(_names(model))}
    groups = [{**g, "params": [index[p] for p in g["params"]]} for g in optim_sd.get("param_groups", [])]
    return {"state": {index[k]: v for k, v in optim_sd.get("state", {}).items()}, "param_groups": groups}


def _by_name(model: nn.Module, optim_sd: dict[str, Any]) -> dict[str, Any]:
    """The reverse of _by_index."""
    names = _names(model)
    groups = [{**g, "params": [names[int(p)] for p in g["params"]]} for g in optim_sd["param_groups"]]
    return {"state": {names[int(k)]: v for k, v in optim_sd["state"].items()}, "param_groups": groups}
