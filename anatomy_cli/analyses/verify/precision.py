"""Section 3 of `anatomy verify`: precision control and devices.

At a reduced dtype (bf16, fp16) the same model is loaded again at fp32 and sections 1-2 run on it too: a
check that passes at fp32 and drifts at bf16 is precision, not a bug. The requested dtype's logits are then
compared with the fp32 logits (relative error, top-1 agreement, KL(fp32 || dtype) in float64 at the last
position): reported with tolerances of bf16/fp16 rounding. Devices: when CUDA or MPS is present, the model is
loaded on the other side (CPU against the accelerator) and its logits and last residual compared.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.engine.model import LoadedModel

# Logits of bf16/fp16 weights against fp32 weights: relative error, KL (nats) at the last position.
DEVIATION = {"bf16": (0.1, 0.05), "fp16": (0.02, 0.01)}

Reload = Callable[[str, str], LoadedModel]  # (dtype, device) -> the same model loaded so


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p || q) in nats, float64, over the whole vocabulary: ``[vocab]`` logits each."""
    p = p_logits.detach().to("cpu", torch.float64).log_softmax(-1)
    q = q_logits.detach().to("cpu", torch.float64).log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


def deviation_rows(runs: Runs, control: Runs, what: str, tolerances: tuple[float, float]) -> list[C.Check]:
    """``runs``' logits against ``control``'s, worst prompt: relative error, KL(control || runs), top-1."""
    rel_tol, kl_tol = tolerances
    rows = [C.worst([C.tensor_check(f"logits vs {what}", a.logits, b.logits.to(a.logits.device), rel_tol)
                     for a, b in zip(runs.batched, control.batched)])]
    kls = [kl(b.logits[-1], a.logits[-1]) for a, b in zip(runs.batched, control.batched)]
    rows.append(C.scalar_check(f"KL({what} || this) last position", max(kls), kl_tol, note="nats, worst prompt"))
    agree = [int(a.logits[-1].argmax()) == int(b.logits[-1].argmax()) for a, b in zip(runs.batched, control.batched)]
    rows.append(C.Check(f"top-1 vs {what}", error=float(sum(not x for x in agree)), passed=True,
                        note=f"{sum(agree)}/{len(agree)} prompts agree (a flip at a near-tie is precision: "
                        "reported, not failed; the KL row bounds it)"))
    return rows


def precision(runs: Runs, control: Runs | None,
              sections: Callable[[Runs], list[C.SectionResult]]) -> C.SectionResult:
    """The fp32 ``control`` (the same model at fp32; None when the requested dtype is fp32) through ``sections``
    (1-2), and the requested dtype's deviation from it."""
    if control is None:
        return C.SectionResult("precision", "precision control",
                               (C.skipped("fp32 control", "the requested dtype is fp32: sections 1-2 are the "
                                          "control (run with --dtype bf16 to measure bf16 against it)"),))
    rows: list[C.Check] = []
    for section in sections(control):
        rows += [C.Check(f"fp32: {c.name}", c.layer, c.error, c.tolerance, c.passed, c.max_abs, c.rel_error,
                         c.cosine, c.score, c.threshold, c.note) for c in section.checks]
    rows += deviation_rows(runs, control, "fp32", DEVIATION.get(runs.dtype, (0.1, 0.05)))
    return C.SectionResult("precision", f"precision control: the same checks at fp32, {runs.dtype} against fp32",
                           tuple(rows), note=f"a check that passes at fp32 and not at {runs.dtype} is precision")


def other_device(lm: LoadedModel) -> str | None:
    """The device to compare ``lm``'s with: the accelerator when ``lm`` is on the CPU (CUDA, else MPS), the CPU
    when it is on one; None when this machine has none."""
    if lm.device.type != "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def no_accelerator() -> str:
    """Why this machine has no accelerator for torch: no CUDA in this torch build, or none visible; no MPS."""
    cuda = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
    return f"no CUDA or MPS device here ({cuda}; no MPS)"


def devices(runs: Runs, reload: Reload) -> C.SectionResult:
    other = other_device(runs.lm)
    title = "devices"
    if other is None:
        why = f"skipped: {no_accelerator()}, so there is nothing to compare the CPU with"
        return C.SectionResult("devices", title, (C.skipped("cpu vs accelerator", why),), note=why)
    lm2 = reload(runs.dtype, other)
    twin = Runs(lm2, runs.encoded, runs.batch_size)
    tol = C.RELATIVE[runs.dtype] * 10  # other kernels, other summation orders
    here, there = runs.lm.device.type, other
    rows = [C.worst([C.tensor_check(f"resid_post {here} vs {there}", a["resid_post", -1],
                                    b["resid_post", -1].to(a["resid_post", -1].device), tol,
                                    layer=runs.lm.n_layers - 1) for a, b in zip(runs.batched, twin.batched)])]
    if runs.lm.has_unembed:
        rows += deviation_rows(runs, twin, there, (tol, tol))
    return C.SectionResult("devices", f"devices: {here} against {there}", tuple(rows))
