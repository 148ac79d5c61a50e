"""How long a run will take, roughly: the one rule behind the cost warning commands print before long work.

The work is counted in floating-point operations from a model's :class:`~anatomy_cli.models.info.ModelInfo`
and the token counts (no weights needed), and turned into seconds by one assumed rate per device type.
Both are rough (within a few times): enough to say "this will take minutes" before it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.units import human_seconds

if TYPE_CHECKING:
    from anatomy_cli.models.info import ModelInfo

WARN_SECONDS = 60.0  # a run estimated to take longer than this is announced on stderr
# Sustained rates (FLOP/s) of float32 work. CPU: measured on the 2-core test machine (SmolLM2, torch's 2 threads;
# docs/performance.md): 4e10 for a 9-token forward, 1e11 for the lens's [tokens, d] x [d, vocab] products.
# MPS and CUDA: assumed (no device measured).
RATES = {"cpu": 5e10, "mps": 5e11, "cuda": 5e12}


def params(info: ModelInfo) -> float:
    """The multiply-accumulate weights one token meets: :func:`block_weights` per block plus the LM head
    (``lm_head_rows`` × ``d_model``)."""
    return float(info.n_layers * block_weights(info) + float(info.lm_head_rows) * info.d_model)


def forward_flops(info: ModelInfo, tokens: int) -> float:
    """One forward of a ``tokens``-token prompt: 2 FLOP per weight per token, plus attention's
    ``2 · n_layers · tokens² · d_model`` (scores and the weighted sum, causal half counted in full)."""
    return float(2.0 * params(info) * tokens + 2.0 * info.n_layers * tokens ** 2 * info.d_model)


def lens_flops(info: ModelInfo, positions: int) -> float:
    """The logit lens of every layer (embedding included) at ``positions`` positions: one LM-head product each."""
    return float(2.0 * (info.n_layers + 1) * positions * float(info.lm_head_rows) * info.d_model)


def mlp_weights(info: ModelInfo) -> float:
    """The multiply-accumulate weights one token meets in one block's MLP, ~8 d_model²."""
    return 8.0 * float(info.d_model) ** 2


def block_weights(info: ModelInfo) -> float:
    """The multiply-accumulate weights one token meets in one block, ~12 d_model²: attention's 4 and
    :func:`mlp_weights`' 8 (the rule of :func:`params`, for when the block's own weights are not at hand)."""
    return 4.0 * float(info.d_model) ** 2 + mlp_weights(info)


def jacobian_fit_flops(info: ModelInfo, tokens: int, dim_batch: int, first_source: int, target: int,
                       weights: float | None = None) -> float:
    """`fit-lens jacobian` on one prompt of ``tokens`` tokens (B = ``dim_batch`` copies, P = ``ceil(d_model / B)``
    backward passes), counted as the fit runs it (:func:`anatomy_cli.engine.jacobian_fit.jacobian_for_prompt`):

    - the forward: the base model's blocks, every one (no LM head: the fit reads block outputs), for B copies:
      ``B · n_layers · (2 · W · tokens + A)``, with W the block's weights (``weights``, one block's
      multiply-accumulate weights per token; None: :func:`block_weights`) and A attention's
      ``4 · tokens² · n_heads · d_head`` (scores and the weighted sum, the causal square in full, as SDPA runs it);
    - each backward pass: activation gradients only (no weight requires grad), so each matrix product once
      (``2 · W · tokens``) and attention's twice (the gradients of the scores' two inputs and of the weighted
      sum's two: ``2 · A``), through the blocks above the earliest source block up to the target,
      ``target − first_source`` of them (the graph starts at the source block's output), for B copies.

    Norms, activations and softmax are left out (a few FLOPs per element, against d_model per element of a
    product)."""
    w = block_weights(info) if weights is None else float(weights)
    attention = 4.0 * tokens ** 2 * info.n_heads * info.d_head
    forward = info.n_layers * (2.0 * w * tokens + attention)
    backward = (target - first_source) * (2.0 * w * tokens + 2.0 * attention)
    passes = -(-info.d_model // dim_batch)
    return float(dim_batch * (forward + passes * backward))


def tuned_fit_flops(info: ModelInfo, tokens: int, windows: int) -> float:
    """`fit-lens tuned` on ``tokens`` tokens in ``windows`` windows: each window's forward of the frozen model,
    plus per translator (``n_layers`` of them) and token the translator (2 d², its weight gradient 2 d²) and the
    unembed with its input gradient (2 · 2 · lm_head_rows · d): the unembeds are most of the work."""
    per_window = tokens / max(windows, 1)
    lens = info.n_layers * tokens * (4.0 * info.d_model ** 2 + 4.0 * float(info.lm_head_rows) * info.d_model)
    return float(windows * forward_flops(info, round(per_window)) + lens)


def tuned_fit_bytes(info: ModelInfo, ctx: int) -> float:
    """`fit-lens tuned`'s peak memory beyond the weights, roughly: the translators with their gradients and
    momentum (3 · n_layers · (d² + d) float32) and one window of ``ctx`` tokens (the residual rows, and about
    five ``[ctx, lm_head_rows]`` float32 tensors: the target and lens log-probabilities and their gradients)."""
    translators = 3.0 * info.n_layers * (info.d_model ** 2 + info.d_model) * 4
    window = 4.0 * ctx * (info.n_layers * info.d_model + 5.0 * float(info.lm_head_rows))
    return float(translators + window)


def seconds(flops: float, device: str) -> float:
    """``flops`` at the assumed rate of ``device`` (``cpu``, ``cuda``, ``mps``; others as cpu)."""
    return flops / RATES.get(device, RATES["cpu"])


def warning(what: str, flops: float, device: str) -> str | None:
    """``lens on 5,000 tokens: about 1.1e+13 FLOP, roughly 4 min on cpu (a rough estimate)``, or None when the
    estimate is under :data:`WARN_SECONDS`."""
    s = seconds(flops, device)
    if s < WARN_SECONDS:
        return None
    return f"{what}: about {flops:.2g} FLOP, roughly {human_seconds(s)} on {device} (a rough estimate)"
