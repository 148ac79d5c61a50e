"""Section 5 of `anatomy verify`: a GGUF file through llama.cpp (``llama-cpp-python``) against anatomy, on the
same token ids.

Per prompt, at the last position: top-1 agreement, |Δp| of llama.cpp's top token, KL(llama.cpp || anatomy) in
float64 over the whole vocabulary; and the cross-entropy of the prompts' next tokens (all positions, one window
each) under both. llama.cpp rounds activations to 8 bits before its quantized matrix multiplies, so anatomy's
dequantized fp32 forward differs from it by a KL of order 1e-3 nats, |Δp| up to a few hundredths, and top-1
flips only at near-ties: the tolerances below were measured on SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M),
docs/commands/verify.md. llama.cpp's own log lines are kept off stdout and stderr.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

import torch

from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.precision import kl
from anatomy_cli.analyses.verify.runs import Runs

KL_NATS, DELTA_P, CE_NATS, TOP1_FLIPS = 0.02, 0.05, 0.02, 0.34  # tolerances (module docstring)


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


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
        return ("llama-cpp-python is not installed (pip install 'anatomy[llamacpp]'; docs/commands/verify.md has "
                "the build recipe)")
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
                    n_threads=max(1, min(os.cpu_count() or 1, 8)))
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


def against_llamacpp(runs: Runs, path: str | None) -> C.SectionResult:
    title = "GGUF against llama.cpp"
    if path is None or not path.endswith(".gguf"):
        return C.SectionResult("llama.cpp", title, (C.skipped("llama.cpp", "the model is not a .gguf file"),))
    why = unusable(path)
    if why is not None:
        return C.SectionResult("llama.cpp", title, (C.skipped("llama.cpp", why),))
    theirs = llama_logits(path, [e.ids for e in runs.encoded])
    rows, kls, dps, flips, ce = [], [], [], 0, []
    for enc, cache, ref in zip(runs.encoded, runs.batched, theirs):
        mine = cache.logits.detach().to("cpu", torch.float32)
        width = min(mine.shape[-1], ref.shape[-1])
        mine, ref = mine[:, :width], ref[:, :width]
        top = int(ref[-1].argmax())
        flips += int(mine[-1].argmax()) != top
        kls.append(kl(ref[-1], mine[-1]))
        dps.append(abs(float(ref[-1].double().softmax(-1)[top] - mine[-1].double().softmax(-1)[top])))
        if len(enc) > 1:
            ce.append(abs(cross_entropy(ref, enc.ids) - cross_entropy(mine, enc.ids)))
    n = len(runs.encoded)
    rows.append(C.scalar_check("KL(llama.cpp || anatomy)", max(kls), KL_NATS,
                               note=f"nats, last position, worst of {n}; mean {sum(kls) / n:.2e}"))
    rows.append(C.scalar_check("|Δp| of llama.cpp's top token", max(dps), DELTA_P, note=f"worst of {n}"))
    rows.append(C.scalar_check("top-1 flips", flips / n, TOP1_FLIPS, note=f"{n - flips}/{n} prompts agree"))
    if ce:
        rows.append(C.scalar_check("|Δ cross-entropy|", max(ce), CE_NATS, note="nats per token, worst prompt"))
    return C.SectionResult("llama.cpp", title, tuple(rows),
                           note="llama.cpp rounds activations to 8 bits before quantized matmuls: KL ~1e-3 nats "
                                "is expected, not a bug")
