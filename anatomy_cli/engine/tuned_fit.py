"""Fitting the tuned lens: tuned-lens' training recipe (Belrose et al. 2023; ``tuned_lens.scripts.train_loop`` and
``ingredients`` of tuned-lens 0.2.0) on anatomy's hook points, for every decoder anatomy loads (a GGUF model
through its dequantized weights; the model is frozen, only the translators train).

Translator i (``torch.nn.Linear(d, d)`` with bias, zero-initialised) reads residual row i (transformers'
``hidden_states[i]``: row 0 the embeddings, row N + 1 block N's raw output), residually: ``h + A_i h + b_i``, then
the model's unembed (final norm + LM head). Translators 0..L−1; the last block's output has none. Per window (one
forward, batch 1, as tuned-lens' ``per_gpu_batch_size`` 1): the frozen model's own logits give the target
distribution p at every position; each translator's loss is ``KL(p ‖ q_i)`` at the same position (tuned-lens'
``token_shift`` 0 for the KL loss) averaged over the window's positions, divided by the windows in the step, and
back-propagated on its own (tuned-lens' sequential backward; the translators' parameters are disjoint, so the
gradient is that of the sum over translators). A step: ``clip_grad_norm_(all translators, 1.0)``, SGD step,
``zero_grad``, scheduler step. SGD: ``lr = lr_scale · (1 − 0.9)`` (tuned-lens undoes PyTorch's 1/(1 − β) scaling;
lr_scale 1), momentum 0.9, Nesterov, weight decay 1e-3; ``get_linear_schedule_with_warmup(opt, 0, steps)`` (0
warm-up steps: tuned-lens' default for SGD). anatomy computes in float32 where tuned-lens autocasts the lens to
bfloat16.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import torch

from anatomy_cli.engine.checkpoint import Checkpoint
from anatomy_cli.engine.checkpoint import atomic_save
from anatomy_cli.engine.checkpoint import atomic_write
from anatomy_cli.engine.forwarding import forward
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.gradients import grad_mode
from anatomy_cli.engine.hooks import capture
from anatomy_cli.engine.lens import unembed
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models import sites

MOMENTUM = 0.9
WEIGHT_DECAY = 1e-3
LR_SCALE = 1.0
CLIP = 1.0


def translators(d_model: int, n_layers: int, device: torch.device | str = "cpu") -> torch.nn.ModuleList:
    """``n_layers`` zero-initialised ``Linear(d_model, d_model)`` with bias (float32): tuned-lens'
    ``layer_translators``, whose ``state_dict`` keys are ``"{i}.weight"``, ``"{i}.bias"``."""
    mods = torch.nn.ModuleList([torch.nn.Linear(d_model, d_model, dtype=torch.float32, device=device)
                                for _ in range(n_layers)])
    with torch.no_grad():
        for p in mods.parameters():
            p.zero_()
    return mods


def optimizer(lens: torch.nn.ModuleList, steps: int) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR]:
    """tuned-lens' ``Optimizer.create_optim`` (SGD) and ``create_scheduler`` (linear, no warm-up) for ``steps``."""
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD(lens.parameters(), lr=LR_SCALE * (1 - MOMENTUM), momentum=MOMENTUM, nesterov=True,
                          weight_decay=WEIGHT_DECAY)
    return opt, get_linear_schedule_with_warmup(opt, 0, steps)


def window_backward(lm: LoadedModel, lens: torch.nn.ModuleList, ids: Sequence[int], scale: float) -> list[float]:
    """One window: the frozen forward (no graph), then per translator ``KL(final ‖ lens)`` at each position,
    averaged over the positions, times ``scale`` (1 / windows in the step), back-propagated into ``lens``'s
    gradients (accumulated). Returns each translator's KL (nats, unscaled)."""
    names = [sites.name(0, sites.Point.resid_pre)] + sites.names(range(lm.n_layers - 1), sites.Point.resid_post)
    x = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    with grad_mode(lm):
        with torch.no_grad(), capture(lm, names) as kept:
            final = forward(lm, x)
            target = head_logits(lm, final[0]).float().log_softmax(-1)        # [pos, vocab]
        rows = [kept[name][0] for name in names]
        losses = []
        for i, h in enumerate(rows):
            h = h.float()
            logq = unembed(lm, h + lens[i](h), grad=True).float().log_softmax(-1)
            loss = torch.sum(target.exp() * (target - logq), dim=-1).mean()
            torch.autograd.backward(loss * scale)
            losses.append(float(loss.detach()))
    return losses


def step(lens: torch.nn.ModuleList, opt: torch.optim.SGD, scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """tuned-lens' step after the accumulated windows: clip the gradient norm of all translators to 1, step,
    zero the gradients (kept as zeros), step the schedule."""
    torch.nn.utils.clip_grad_norm_(lens.parameters(), CLIP)
    opt.step()
    opt.zero_grad(set_to_none=False)
    scheduler.step()


def state(lens: torch.nn.ModuleList, opt: torch.optim.SGD,
          scheduler: torch.optim.lr_scheduler.LambdaLR) -> dict[str, object]:
    """What a resumed fit needs besides its step: the translators (CPU copies), the SGD momentum buffers, the
    schedule (``torch.load(..., weights_only=True)`` reads it back)."""
    return {"translators": {k: v.detach().cpu().clone() for k, v in lens.state_dict().items()},
            "optimizer": opt.state_dict(), "scheduler": scheduler.state_dict()}


def load_state(lens: torch.nn.ModuleList, opt: torch.optim.SGD, scheduler: torch.optim.lr_scheduler.LambdaLR,
               saved: dict[str, object]) -> None:
    """:func:`state` put back into freshly made ``lens``, ``opt``, ``scheduler`` (in place)."""
    lens.load_state_dict(saved["translators"])  # type: ignore[arg-type]
    opt.load_state_dict(saved["optimizer"])  # type: ignore[arg-type]
    scheduler.load_state_dict(saved["scheduler"])  # type: ignore[arg-type]


def save(lens: torch.nn.ModuleList, out: Path, config: dict[str, object]) -> None:
    """tuned-lens' ``TunedLens.save``: ``params.pt`` (the translators' state dict) and ``config.json``, each
    written atomically (engine/checkpoint.py: no half-written file)."""
    atomic_save({k: v.detach().cpu().contiguous() for k, v in lens.state_dict().items()}, out / "params.pt")
    atomic_write(out / "config.json", lambda tmp: tmp.write_text(json.dumps(config), encoding="utf-8"))


def train(lm: LoadedModel, lens: torch.nn.ModuleList,
          optim: tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR], wins: Sequence[Sequence[int]],
          order: Sequence[int], steps: int, *, checkpoint: Checkpoint | None = None,
          resumed: dict[str, object] | None = None, report: Callable[[str], None] = lambda _: None
          ) -> tuple[list[float], list[float]]:
    """``steps`` steps over ``wins`` in ``order`` (step s: the windows ``order[s·n/steps : (s+1)·n/steps]``), from
    ``resumed``'s step when given (a checkpoint's, :func:`state` plus ``step``, ``kl_first``, ``kl_last``), saved to
    ``checkpoint`` when due; ``report``: a progress line per window. Returns each translator's mean KL over the
    first step's windows and over the last's."""
    opt, scheduler = optim
    n = len(wins)
    first: list[float] = []
    last: list[float] = []
    done = 0
    if resumed is not None:
        load_state(lens, opt, scheduler, resumed)
        done = int(resumed["step"])  # type: ignore[call-overload]
        first, last = list(resumed["kl_first"]), list(resumed["kl_last"])  # type: ignore[call-overload]
    for s in range(done, steps):
        chunk = order[s * n // steps:(s + 1) * n // steps]
        sums = [0.0] * lm.n_layers
        for k, w in enumerate(chunk, start=1):
            losses = window_backward(lm, lens, wins[w], 1.0 / len(chunk))
            sums = [a + b for a, b in zip(sums, losses)]
            report(f"fit-lens tuned · step {s + 1}/{steps} · window {k}/{len(chunk)} · "
                   f"KL {sum(losses) / len(losses):.4f} nats (mean over translators)")
        step(lens, opt, scheduler)
        last = [v / len(chunk) for v in sums]
        first = first or last
        if checkpoint is not None and checkpoint.due(s + 1, steps):
            checkpoint.save({**state(lens, opt, scheduler), "step": s + 1, "kl_first": first,
                             "kl_last": last})
    return first, last


def config(lm: LoadedModel, unembed_hash: str) -> dict[str, object]:
    """tuned-lens' ``TunedLensConfig`` of a lens for ``lm`` (its field order)."""
    return {"base_model_name_or_path": str(getattr(lm.model.config, "name_or_path", "") or lm.name),
            "d_model": lm.info.d_model, "num_hidden_layers": lm.n_layers, "bias": True,
            "base_model_revision": None, "unembed_hash": unembed_hash, "lens_type": "linear_tuned_lens"}
