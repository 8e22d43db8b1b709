"""Workers: the loop that pulls planned trials and the trainer that runs them."""

from archhpo.errors import MemoryRefused, NonFiniteLoss, TrialLost, TrialStopped
from archhpo.workers._build import BuiltTrial, DataCache, Seeds, TrialSpec, build_trial, trial_seeds
from archhpo.workers._loop import QueueLike, Worker, WorkerSummary
from archhpo.workers._memory import (
    CUDA_CONTEXT_BYTES,
    SAFETY,
    TrialShape,
    available_bytes,
    check_fits,
    estimate_training_bytes,
    is_oom,
    is_sticky_cuda_error,
    trial_shape,
)
from archhpo.workers._train import (
    StopTraining,
    TrainConfig,
    TrainResult,
    describe_result,
    evaluate,
    resolve_device,
    train,
    trial_seed,
)

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "SAFETY",
    "BuiltTrial",
    "DataCache",
    "MemoryRefused",
    "NonFiniteLoss",
    "QueueLike",
    "Seeds",
    "StopTraining",
    "TrainConfig",
    "TrainResult",
    "TrialLost",
    "TrialShape",
    "TrialSpec",
    "TrialStopped",
    "Worker",
    "WorkerSummary",
    "available_bytes",
    "build_trial",
    "check_fits",
    "describe_result",
    "estimate_training_bytes",
    "evaluate",
    "is_oom",
    "is_sticky_cuda_error",
    "resolve_device",
    "train",
    "trial_seed",
    "trial_seeds",
    "trial_shape",
]
