"""Section 6 of `anatomy verify`: a GGUF file through llama.cpp (``llama-cpp-python``) against anatomy, on the
same token ids.

Per prompt, at the last position: top-1 agreement, |Δp| of llama.cpp's top token, KL(llama.cpp || anatomy) in
float64 over the whole vocabulary; and the cross-entropy of a built-in text (:data:`TEXT`) in one window under
both. llama.cpp rounds activations to 8 bits before its quantized matrix multiplies, so anatomy's
dequantized fp32 forward differs from it by a KL of order 1e-3 nats, |Δp| up to a few hundredths, and top-1
flips only at near-ties: the tolerances below were measured on SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M),
docs/commands/verify.md. llama.cpp's own log lines are kept off stdout and stderr.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from anatomy_cli import engine
from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify import llamacpp_moe
from anatomy_cli.analyses.verify.llamacpp_moe import llama_threads
from anatomy_cli.analyses.verify.precision import kl
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.models.resolve import first_line

# Tolerances, from measurements on SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M (12 prompts and a 100-token text
# each, docs/commands/verify.md): worst KL 0.015 nats, |Δp| 0.052, |ΔCE| 0.012 nats/token; about 2x margin.
# A top-1 flip is a failure only beyond a near-tie: anatomy's own probabilities of the two tokens more than
# NEAR_TIE apart (Gemma 3 flipped one prompt at a gap of GAP_MEASURED).
KL_NATS, DELTA_P, CE_NATS, NEAR_TIE = 0.05, 0.1, 0.03, 0.1
NOTE = ("llama.cpp rounds activations to 8 bits before its quantized matrix multiplies: a KL of order 1e-3 nats "
        "is expected, not a bug")
# The text whose cross-entropy both compute, in one window (about 120 tokens of plain English prose).
TEXT = ("The river runs through the middle of the old town, and on market days the bridges are crowded with "
        "people carrying baskets of bread, fish and vegetables. In the morning the farmers arrive early to set "
        "up their stalls along the water, while the children of the town walk to school past the bakery. By "
        "noon the square is full, and the sound of bargaining mixes with the bells of the church on the hill. "
        "When the sun goes down, the traders pack their carts and return home along the narrow roads.")


def available() -> bool:
    """``llama_cpp`` can be imported (not imported here: it loads llama.cpp's library)."""
    return importlib.util.find_spec("llama_cpp") is not None  # None too where sys.modules["llama_cpp"] is None


_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=16, verbose=False)
llm.eval([llm.token_bos() if llm.token_bos() >= 0 else 0, 1])
"""


@functools.lru_cache(maxsize=8)
def unusable(path: str) -> str | None:
    """Why llama.cpp cannot run ``path`` here, or None when it can: not installed, or it dies in a child
    process on a two-token eval (a build for instructions this CPU lacks dies with SIGILL, which would take
    this process with it)."""
    if not available():
        return ("llama-cpp-python is not installed (in a clone of anatomy: pip install -e '.[llamacpp]'; "
                "docs/commands/verify.md has the build recipe)")
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, path], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "llama.cpp did not answer a two-token eval within 300 s"
    if done.returncode == 0:
        return None
    if done.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        return ("llama.cpp died with SIGILL: it was built for instructions this CPU lacks; rebuild it with "
                "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=OFF ...' (docs/commands/verify.md)")
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return f"llama.cpp failed on a two-token eval: {tail[0]}"


@contextlib.contextmanager
def quiet_fds() -> Iterator[None]:
    """File descriptors 1 and 2 pointed at /dev/null for the block (llama.cpp writes to them from C)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def llama_logits(path: str, prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """llama.cpp's logits of each prompt's ids (evaluated from an empty context): float32 ``[pos, vocab]``."""
    from llama_cpp import Llama  # type: ignore[import-not-found, unused-ignore]

    n_ctx = max(len(p) for p in prompts) + 8
    out = []
    with quiet_fds():
        llm = Llama(model_path=path, logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, verbose=False,
                    n_threads=llama_threads())
        try:
            for ids in prompts:
                llm.reset()
                llm.eval(list(ids))
                out.append(torch.tensor(llm.scores[:len(ids)].copy(), dtype=torch.float32))
        finally:
            llm.close() if hasattr(llm, "close") else None
    return out


def cross_entropy(logits: torch.Tensor, ids: Sequence[int]) -> float:
    """Mean -ln p(next token) over positions 0..n-2, float64."""
    logp = logits[:-1].to(torch.float64).log_softmax(-1)
    nxt = torch.tensor(list(ids[1:]), dtype=torch.long)
    return float(-logp.gather(1, nxt[:, None]).mean())


@dataclass(frozen=True)
class Agreement:
    """One prompt at its last position: llama.cpp's top token, anatomy's, |Δp| of llama.cpp's top token and
    KL(llama.cpp || anatomy) in nats (float64, the whole vocabulary); ``gap``: anatomy's p(its top) - p(llama.cpp's
    top), 0 when they agree."""

    top_llama: int
    top_anatomy: int
    delta_p: float
    kl: float
    gap: float = 0.0


def agreement(ref: torch.Tensor, mine: torch.Tensor) -> Agreement:
    """llama.cpp's last-position logits ``ref`` against anatomy's ``mine`` (``[vocab]`` each)."""
    top, p = int(ref.argmax()), mine.double().softmax(-1)
    dp = abs(float(ref.double().softmax(-1)[top] - p[top]))
    return Agreement(top, int(p.argmax()), dp, kl(ref, mine), float(p.max() - p[top]))


def _width(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both logits cut to the common vocabulary (a padded embedding matrix has more rows than tokens)."""
    width = min(a.shape[-1], b.shape[-1])
    return a[..., :width].to("cpu", torch.float32), b[..., :width].to("cpu", torch.float32)


def against_llamacpp(runs: Runs, path: str | None, *, required: bool = False) -> C.SectionResult:
    """The section on ``path``; where it cannot run (not a .gguf file, llama.cpp unusable here) one skipped row
    saying why, or a failed one when the section was asked for by name (``required``: ``--against llama.cpp``)."""
    title = "GGUF against llama.cpp"
    why = "the model is not a .gguf file" if path is None else unusable(path)
    if path is None or why is not None:
        row = C.Check("llama.cpp", passed=False, note=why or "") if required else C.skipped("llama.cpp", why or "")
        return C.SectionResult("llama.cpp", title, (row,))
    text = engine.encode(runs.lm, [TEXT])[0]
    *theirs, their_text = llama_logits(path, [e.ids for e in runs.encoded] + [text.ids])
    per = [agreement(*_width(ref[-1], cache.logits[-1].detach())) for ref, cache in zip(theirs, runs.batched)]
    ref, mine = _width(their_text, engine.run(runs.lm, [text], ["logits"])[0].logits.detach())
    ce_llama, ce_mine = cross_entropy(ref, text.ids), cross_entropy(mine, text.ids)
    n, flips = len(per), sum(a.top_llama != a.top_anatomy for a in per)
    beyond = sum(a.gap > NEAR_TIE for a in per)
    kls, dps = [a.kl for a in per], [a.delta_p for a in per]
    rows: tuple[C.Check, ...] = (
        C.scalar_check("KL(llama.cpp || anatomy)", max(kls), KL_NATS,
                       note=f"nats, last position, worst of {n} prompts; mean {sum(kls) / n:.2e}"),
        C.scalar_check("|Δp| of llama.cpp's top token", max(dps), DELTA_P, note=f"worst of {n} prompts"),
        C.scalar_check("top-1 flips beyond a near-tie", beyond, 0,
                       note=f"{n - flips}/{n} prompts agree; a flip where anatomy's p of the two tokens are within "
                            f"{NEAR_TIE:g} is a near-tie" + (f" (largest gap {max(a.gap for a in per):.3f})"
                                                            if flips else "")),
        C.scalar_check("|Δ cross-entropy|", abs(ce_llama - ce_mine), CE_NATS,
                       note=f"nats per token, a {len(text)}-token text in one window: llama.cpp {ce_llama:.4f}, "
                            f"anatomy {ce_mine:.4f} (in bits, corpus's unit: {ce_llama / math.log(2):.4f}, "
                            f"{ce_mine / math.log(2):.4f})"),
    )
    if runs.lm.info.moe is not None:
        rows += (_experts(runs, path),)
    return C.SectionResult("llama.cpp", title, rows, note=NOTE)


def _experts(runs: Runs, path: str) -> C.Check:
    """An MoE model: the experts llama.cpp chose (its graph's ``ffn_moe_topk-{il}``) against anatomy's; a
    skipped row saying why where llama-cpp-python's graph callback cannot give them."""
    try:
        with quiet_fds():
            theirs = llamacpp_moe.llama_topk(path, [e.ids for e in runs.encoded])
    except Exception as exc:  # ctypes, a struct layout of another version, llama.cpp: said, never a silent pass
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        return C.skipped(llamacpp_moe.NAME, f"llama.cpp's own top-k could not be read through its graph "
                                            f"callback (cb_eval): {first_line(exc)}")
    return llamacpp_moe.topk_check(runs, theirs)
