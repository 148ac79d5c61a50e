"""In `verify`'s llama.cpp section, for a mixture-of-experts GGUF file: the experts llama.cpp chose against those
anatomy chose, per block and position, on the same token ids.

llama.cpp's graph names its choice of block ``il`` ``ffn_moe_topk-{il}`` (``llm_graph_context::build_moe_ffn``:
an I32 view ``[k, n_tokens]`` of the descending argsort of the router probabilities). llama-cpp-python exposes no
such tensor, but its low-level API takes a graph-eval callback (``cb_eval`` of ``llama_context_params``, a
``ggml_backend_sched_eval_callback``) that the scheduler asks about every node and calls again once a node it
wanted is computed; the callback here wants those nodes only and copies them out with
``ggml_backend_tensor_get``, row by row (the view's rows are ``nb[1]`` bytes apart). The struct layout read below
(``ggml_tensor``, ggml.h) is the one of llama-cpp-python 0.3.x; a layout it does not recognise, a missing tensor
or a failing call make the row a skipped one saying so, never a silent pass.

The sets are compared, not the order: the same experts chosen. A difference where anatomy's router margin
(``p_(k) − p_(k+1)``, :mod:`anatomy_cli.analyses.route`) is below :data:`MARGIN` is a near-tie (llama.cpp's 8-bit
activations before quantized matrix multiplies move router probabilities by about that); beyond it, a failure.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from anatomy_cli.analyses.route import block_rows
from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.runs import Runs


def llama_threads() -> int:
    """llama.cpp's thread count: torch's (which follows OMP_NUM_THREADS, so a test worker or a Ray worker keeps its
    share of the cores instead of one thread per core beside the others), at most 8."""
    return max(1, min(torch.get_num_threads(), 8))

NAME = "experts chosen: llama.cpp's ffn_moe_topk"
TOPK = "ffn_moe_topk-"
MARGIN = 0.02
I32 = 26  # GGML_TYPE_I32


class GGMLTensor(ctypes.Structure):
    """``struct ggml_tensor`` (ggml.h: GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64 bytes, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _reader(seen: dict[int, torch.Tensor], errors: list[str]):  # -> the ctypes callback
    import llama_cpp  # type: ignore[import-not-found, unused-ignore]
    from llama_cpp import _ggml  # type: ignore[import-not-found, unused-ignore]

    get = _ggml.libggml.ggml_backend_tensor_get
    get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    get.restype = None

    def callback(ptr: int, ask: bool, _user: int) -> bool:
        t = GGMLTensor.from_address(ptr)
        name = t.name.decode("utf-8", "replace")
        if ask or not name.startswith(TOPK):
            return name.startswith(TOPK) if ask else True
        k, n = int(t.ne[0]), int(t.ne[1])
        if t.type != I32 or t.nb[0] != 4 or not 0 < k <= 1024 or t.ne[2] != 1 or t.ne[3] != 1:
            errors.append(f"{name} is not the I32 [k, tokens] tensor expected (type {t.type}, ne {list(t.ne)})")
            return True
        row = (ctypes.c_int32 * k)()
        rows = []
        for i in range(n):
            get(ptr, ctypes.addressof(row), i * t.nb[1], 4 * k)
            rows.append(list(row))
        seen[int(name[len(TOPK):])] = torch.tensor(rows, dtype=torch.long)
        return True

    return llama_cpp.ggml_backend_sched_eval_callback(callback)


def llama_topk(path: str, prompts: Sequence[Sequence[int]]) -> list[dict[int, torch.Tensor]]:
    """llama.cpp's chosen experts of each prompt (evaluated alone, from an empty context, in one micro-batch):
    ``{block: [pos, k]}``, heaviest first. llama.cpp logs to file descriptors 1 and 2 (the caller quiets them).
    Raises RuntimeError when they cannot be read."""
    import llama_cpp

    seen: dict[int, torch.Tensor] = {}
    errors: list[str] = []
    callback = _reader(seen, errors)  # referenced until the context is freed
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise RuntimeError("llama.cpp cannot load the file")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = max(len(p) for p in prompts) + 8
    cparams.n_threads = cparams.n_threads_batch = llama_threads()
    cparams.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    out = []
    try:
        if not ctx:
            raise RuntimeError("llama.cpp cannot make a context")
        for ids in prompts:
            seen.clear()
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            _decode(llama_cpp, ctx, ids)
            if errors:
                raise RuntimeError(errors[0])
            out.append(dict(seen))
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return out


def _decode(llama_cpp, ctx, ids: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    """One batch of ``ids`` at positions 0.., sequence 0, every position an output (so that the last block's
    experts run at every position)."""
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    try:
        for i, tok in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(ids)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)


def topk_check(runs: Runs, theirs: list[dict[int, torch.Tensor]]) -> C.Check:
    """The row of the llama.cpp section on an MoE model from llama.cpp's choices ``theirs`` (:func:`llama_topk`):
    the (block, position) choices whose top-k sets differ beyond a near-tie (0 to pass); skipped, saying so,
    where llama.cpp's graph did not give every block and position."""
    moe = runs.lm.info.moe
    assert moe is not None
    blocks = list(moe.sparse_blocks)
    missing = sorted({b for t, e in zip(theirs, runs.encoded) for b in blocks if b not in t or len(t[b]) != len(e)})
    if missing:
        return C.skipped(NAME, f"llama.cpp's graph gave no ffn_moe_topk for every position of block(s) "
                               f"{', '.join(map(str, missing))}: not compared")
    total = agree = beyond = 0
    for cache, their, enc in zip(runs.batched, theirs, runs.encoded):
        for b in blocks:
            mine = cache["expert_indices", b]
            rows = block_rows(b, cache["router_logits", b], mine, cache["expert_weights", b], [""] * len(enc))
            for pos, row in enumerate(rows):
                same = set(mine[pos].tolist()) == set(their[b][pos].tolist())
                total, agree = total + 1, agree + same
                beyond += not same and (row.margin is None or row.margin >= MARGIN)
    return C.scalar_check(NAME, beyond, 0, note=f"top-{moe.top_k} sets differing beyond a near-tie; {agree}/{total} "
                                               f"(block, position) choices agree; a difference where anatomy's "
                                               f"router margin is below {MARGIN:g} is a near-tie")
