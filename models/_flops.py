"""Compute accounting: measuring training FLOPs with FlopCounterMode, and closed-form pieces.

What is counted is what ``torch.utils.flop_counter.FlopCounterMode`` counts: matrix products at 2
FLOPs per multiply-add, and attention; element-wise ops, softmax, norms and look-ups count nothing.
Attention is counted as the math path computes it (4·s²·d forward, 8·s²·d backward per sequence
and layer, masks ignored), so ``count_flops`` runs under the MATH SDPA backend: the CPU's fused
flash kernel is invisible to FlopCounterMode, and CUDA's kernels would count the backward's
recomputation, which is not useful work (PaLM's 6N + 12·L·s·d "model FLOPs", used for MFU).  A linear
layer costs 2·m·k·n forward and twice that backward, or once when its input needs no gradient.

"Per sample" (``Family.flops_per_sample``) is the part of a step's count that grows with the batch:
count(B) = B·flops_per_sample(config) + c, c a batch-independent term few families have (see
``archhpo.models.signal.batch_flops``), so flops_per_sample = count(2) - count(1) exactly, and
``train_flops`` = flops_per_sample × samples trained leaves c out (far below one sample's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the closed forms are imported by `archhpo grid`, which never imports torch
    import torch
    from torch import nn


def linear_flops(m: int, k: int, n: int, input_grad: bool = True) -> int:
    """Forward + backward FLOPs of an (m, k) @ (k, n) product whose right operand is a weight.

    ``input_grad=False`` when the left operand (the input) needs no gradient, e.g. the data.
    """
    return 2 * m * k * n * (3 if input_grad else 2)


def attention_flops(s: int, d: int) -> int:
    """Forward + backward FLOPs of self-attention over s tokens of width d (any head count).

    QKᵀ and AV: 2·(2·s·s·d) forward, twice that backward (math path, masks not exploited).
    """
    return 12 * s * s * d


def encoder_layer_flops(s: int, d: int, d_ff: int) -> int:
    """Forward + backward FLOPs of one transformer layer over one sequence of s tokens.

    q,k,v projection (d→3d), attention, out projection (d→d), FFN d→d_ff→d; the layer's
    input always needs a gradient (it comes from parameters).  Same for ``nn.TransformerEncoderLayer``
    and ``archhpo.models._blocks.Block`` (biases and norms cost nothing here).
    """
    return (
        linear_flops(s, d, 3 * d) + attention_flops(s, d) + linear_flops(s, d, d)
        + linear_flops(s, d, d_ff) + linear_flops(s, d_ff, d)
    )


def block_params(d_model: int, d_ff: int, attn_bias: bool = True, first_norm: bool = True) -> int:
    """Exact parameter count of one ``archhpo.models._blocks.Block`` (n_heads does not change it)."""
    d = d_model
    attn = 4 * d * d + (4 * d if attn_bias else 0)  # q, k, v, out weights (+ biases)
    ffn = 2 * d * d_ff + d_ff + d  # Linear(d, d_ff) + Linear(d_ff, d), with biases
    norms = (4 if first_norm else 2) * d  # weight + bias per LayerNorm
    return attn + ffn + norms


def count_flops(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    *,
    extra_loss: bool = True,
) -> int:
    """FLOPs of one training step (forward, loss, backward) on this batch, as FlopCounterMode counts.

    The model is put in training mode (eval mode may take fused fast paths that hide matmuls)
    and attention runs on the MATH SDPA backend (see the module docstring).  When the model
    defines ``extra_loss()`` it is added to the loss, as the trainer does, unless
    ``extra_loss=False``.  Gradients are cleared afterwards (set to None); the training-mode flag
    is restored.  Divide by nothing: this is the whole batch's count.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    args = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    was_training = model.training
    model.train()
    try:
        with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
            loss = loss_fn(model(*args), target)
            extra = getattr(model, "extra_loss", None) if extra_loss else None
            if extra is not None:
                loss = loss + extra()
            loss.backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return int(counter.get_total_flops())
