"""GGUF MoE files (issue 50): a tiny random Qwen2-MoE (shared expert), Qwen3-MoE, Mixtral and OLMoE written as
llama.cpp's convert_hf_to_gguf.py writes them (``ffn_gate_inp``, ``ffn_{gate,up,down}_exps``, ``ffn_*_shexp``,
OLMoE's ``attn_q_norm``/``attn_k_norm``), loaded by anatomy, routed as their transformers source routes."""

from __future__ import annotations

import json

import models
import numpy as np
import pytest
import torch
from test_gguf import _permute
from test_gguf import write_gguf
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app

runner = CliRunner()
ARCHS = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe"}  # llama.cpp's
PROMPT = "The capital of France is Paris, and"


def build_source(arch: str):
    """The tiny random model of tests/models.py with every block an MoE block (llama.cpp's qwen2moe has no
    dense blocks: ``mlp_only_layers`` cannot be written to a GGUF file)."""
    import transformers

    config_cls, model_cls, _ = models.ARCHS[arch]
    extra = {"mlp_only_layers": []} if arch in ("qwen2_moe", "qwen3_moe") else {}
    if arch == "olmoe":  # as OLMoE's released models: one kv head per head (llama.cpp sizes k_norm by n_embd)
        extra = {"num_key_value_heads": models.config_kwargs(arch)["num_attention_heads"]}
    config = getattr(transformers, config_cls)(**{**models.config_kwargs(arch), **extra})
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def _tensors(model) -> dict[str, np.ndarray]:
    """``{gguf name: float32 array}`` as convert_hf_to_gguf.py names them for Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE: the
    fused ``gate_up_proj`` [E, 2F, D] split into ``ffn_gate_exps`` and ``ffn_up_exps`` [E, F, D]; Mixtral's
    q/k rows permuted as for LLaMA."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp",
             "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        for hf, gg in parts.items():
            for kind in ("weight", "bias"):
                if f"{pre}{hf}.{kind}" in sd:
                    out[f"blk.{i}.{gg}.{kind}"] = sd[f"{pre}{hf}.{kind}"]
        if f"blk.{i}.ffn_gate_inp_shexp.weight" in out:  # [1, D] in transformers, [D] in llama.cpp's files
            out[f"blk.{i}.ffn_gate_inp_shexp.weight"] = out[f"blk.{i}.ffn_gate_inp_shexp.weight"][0]
        if cfg.model_type == "mixtral":
            out[f"blk.{i}.attn_q.weight"] = _permute(out[f"blk.{i}.attn_q.weight"], cfg.num_attention_heads)
            out[f"blk.{i}.attn_k.weight"] = _permute(out[f"blk.{i}.attn_k.weight"], cfg.num_key_value_heads)
        gate_up = sd[f"{pre}mlp.experts.gate_up_proj"]
        f = gate_up.shape[1] // 2
        out[f"blk.{i}.ffn_gate_exps.weight"] = gate_up[:, :f]
        out[f"blk.{i}.ffn_up_exps.weight"] = gate_up[:, f:]
        out[f"blk.{i}.ffn_down_exps.weight"] = sd[f"{pre}mlp.experts.down_proj"]
    return out


def split_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` with each expert stack ``blk.N.ffn_{gate,up,down}_exps.weight`` [E, ...] written as older
    llama.cpp Mixtral files write it: one tensor per expert, ``blk.N.ffn_gate.E.weight`` and so on."""
    out = {}
    for name, data in tensors.items():
        block, _, rest = name.partition(".ffn_")
        if rest.endswith("_exps.weight"):
            kind = rest.removesuffix("_exps.weight")
            out.update({f"{block}.ffn_{kind}.{e}.weight": data[e] for e in range(data.shape[0])})
        else:
            out[name] = data
    return out


def write_moe_gguf(path, arch: str, model=None, quant: str = "F32", per_expert: bool = False):
    """``model`` (default :func:`build_source` of ``arch``: qwen2_moe, qwen3_moe, mixtral, olmoe) as a GGUF file
    of llama.cpp's architecture name (qwen2moe, qwen3moe, olmoe; llama for Mixtral) through test_gguf's
    ``write_gguf``: F32, or Q8_0 where rows are whole blocks of 32. ``per_expert``: one tensor per expert, as
    older llama.cpp Mixtral files have them (:func:`split_experts`)."""
    model = build_source(arch) if model is None else model
    cfg = model.config

    def more(w) -> None:
        w.add_expert_count(cfg.num_local_experts if arch == "mixtral" else cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        if arch in ("qwen2_moe", "qwen3_moe"):  # Mixtral's and OLMoE's experts are feed_forward_length wide
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if arch == "qwen2_moe":
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
        if getattr(cfg, "clip_qkv", None) is not None:  # OLMoE's, as convert_hf_to_gguf.py writes it
            w.add_clamp_kqv(cfg.clip_qkv)
        if arch == "qwen3_moe":
            w.add_key_length(cfg.head_dim)
            w.add_value_length(cfg.head_dim)

    tensors = _tensors(model)
    return write_gguf(path, ARCHS[arch], f"tiny-{arch}", cfg, split_experts(tensors) if per_expert else tensors,
                      quant, more)


def make_moe_files(root) -> dict:
    """``{arch: (source model, F32 .gguf path, save_pretrained directory of the source)}`` under ``root``."""
    from conftest import build_gpt2_tokenizer

    tok, out = build_gpt2_tokenizer(), {}
    for arch in ARCHS:
        src = build_source(arch)
        folder = root / arch
        src.save_pretrained(folder)
        tok.save_pretrained(folder)
        out[arch] = src, write_moe_gguf(root / f"tiny-{arch}.F32.gguf", arch, src), folder
    return out


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory):
    return make_moe_files(tmp_path_factory.mktemp("gguf-moe"))


def routing(src, ids):
    """transformers' own router logits (``output_router_logits=True``) of every block, routed by hand: softmax,
    top k, divided by their sum where ``norm_topk_prob``: ``{block: (indices [pos, k], weights [pos, k])}``."""
    with torch.no_grad():
        out = src(torch.tensor([ids]), output_router_logits=True)
    k, norm = src.config.num_experts_per_tok, getattr(src.config, "norm_topk_prob", True)  # Mixtral: always
    routes = {}
    for b, logits in enumerate(out.router_logits):
        w, i = torch.topk(torch.softmax(logits.float(), -1), k, dim=-1)
        routes[b] = i, (w / w.sum(-1, keepdim=True) if norm else w)
    return routes


def _block_inputs(src, ids) -> dict[int, torch.Tensor]:
    """Each MoE block's input (the post-attention norm's output) in the source model, ``[pos, d]``."""
    seen: dict[int, torch.Tensor] = {}
    handles = [layer.mlp.register_forward_pre_hook(lambda _m, args, b=b: seen.__setitem__(b, args[0][0].clone()))
               for b, layer in enumerate(src.model.layers)]
    try:
        with torch.no_grad():
            src(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return seen


def _by_hand(src, b, x, idx, w):
    """Σ_k w_k · expert_{idx_k}(x) (+ sigmoid(shared_expert_gate · x) · shared_expert(x)) from the source's
    weights: expert_e(x) = down_e (silu(gate_e x) * up_e x)."""
    mlp = src.model.layers[b].mlp
    gate_up, down = mlp.experts.gate_up_proj.double(), mlp.experts.down_proj.double()
    f = gate_up.shape[1] // 2
    x = x.double()
    out = torch.zeros_like(x)
    for p in range(x.shape[0]):
        for e, weight in zip(idx[p].tolist(), w[p].double()):
            h = gate_up[e] @ x[p]
            out[p] += weight * (down[e] @ (torch.nn.functional.silu(h[:f]) * h[f:]))
    if getattr(mlp, "shared_expert", None) is not None:
        s = mlp.shared_expert
        shared = s.down_proj.weight.double() @ (torch.nn.functional.silu(x @ s.gate_proj.weight.double().T)
                                                * (x @ s.up_proj.weight.double().T)).T
        out += torch.sigmoid(x @ mlp.shared_expert_gate.weight.double().T) * shared.T
    return out


def test_moe_gguf_loads_the_source_weights(moe_files):
    for arch, (src, path, _) in moe_files.items():
        lm = engine.load(str(path), device="cpu")
        ours, theirs = dict(lm.model.named_parameters()), dict(src.named_parameters())
        assert sorted(ours) == sorted(theirs), arch
        assert all(torch.equal(ours[n], theirs[n]) for n in ours), arch
        assert lm.info.moe is not None and lm.info.moe.to_dict() == engine.load(str(moe_files[arch][2]),
                                                                                device="cpu").info.moe.to_dict()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_moe_gguf_routes_as_its_source(moe_files, arch):
    src, path, _ = moe_files[arch]
    lm = engine.load(str(path), device="cpu")
    enc = engine.encode(lm, [PROMPT])[0]
    blocks = range(src.config.num_hidden_layers)
    names = [f"blocks.{b}.{p}" for b in blocks for p in
             ("hook_mlp_out", "mlp.hook_expert_indices", "mlp.hook_expert_weights")]
    [cache] = engine.run(lm, [enc], names)
    ref, inputs = routing(src, enc.ids), _block_inputs(src, enc.ids)
    for b in blocks:
        idx, w = ref[b]
        assert torch.equal(cache[f"blocks.{b}.mlp.hook_expert_indices"], idx)
        assert_close(cache[f"blocks.{b}.mlp.hook_expert_weights"].float(), w, rtol=1e-5, atol=1e-6)
        assert_close(cache[f"blocks.{b}.hook_mlp_out"].double(), _by_hand(src, b, inputs[b], idx, w),
                     rtol=1e-4, atol=1e-5)


def _json(*args):
    result = runner.invoke(app, [*args, "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_route_and_dla_by_expert_on_a_moe_gguf(moe_files, arch):
    src, path, folder = moe_files[arch]
    data = _json("route", PROMPT, "--model", str(path))
    ref = routing(src, data["token_ids"])
    assert data["shared_expert"] == (arch == "qwen2_moe")
    assert [(r["block"], r["position"]) for r in data["rows"]] == [(b, p) for b in ref
                                                                  for p in range(len(data["token_ids"]))]
    for row in data["rows"]:
        idx, w = ref[row["block"]]
        assert row["experts"] == idx[row["position"]].tolist()
        assert row["weights"] == pytest.approx(w[row["position"]].tolist(), rel=1e-5)
    ours = _json("dla", PROMPT, "--model", str(path), "--target", " the", "--by", "expert")
    theirs = _json("dla", PROMPT, "--model", str(folder), "--target", " the", "--by", "expert")
    assert [r["component"] for r in ours["rows"]] == [r["component"] for r in theirs["rows"]]
    assert [r["contribution"] for r in ours["rows"]] == pytest.approx([r["contribution"] for r in theirs["rows"]],
                                                                      rel=1e-4, abs=1e-7)
    assert any(".shared_expert" in r["component"] for r in ours["rows"]) == (arch == "qwen2_moe")


def test_q8_0_expert_stacks_dequantize_as_gguf_does(moe_files, tmp_path):
    import gguf

    src = moe_files["qwen2_moe"][0]
    lm = engine.load(str(write_moe_gguf(tmp_path / "q8.gguf", "qwen2_moe", src, quant="Q8_0")), device="cpu")
    assert lm.dequantized_from == "Q8_0 (F32, Q8_0)"  # the 16-wide expert down stacks stay F32
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name in ("mlp.experts.gate_up_proj", "mlp.gate.weight", "mlp.shared_expert.up_proj.weight"):
        want = src.get_parameter(f"model.layers.0.{name}").detach().float().numpy()
        back = gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(want), q8), q8)
        assert torch.equal(lm.model.get_parameter(f"model.layers.0.{name}"), torch.from_numpy(back)), name
    [cache] = engine.run(lm, engine.encode(lm, [PROMPT]), ["blocks.0.mlp.hook_expert_indices"])
    assert cache["blocks.0.mlp.hook_expert_indices"].shape[-1] == 2


def test_a_mixtral_gguf_with_a_placement_is_refused_in_one_line(moe_files):
    from anatomy_cli.errors import UsageError

    with pytest.raises(UsageError) as exc:
        engine.load(str(moe_files["mixtral"][1]), device_map="auto")
    assert "\n" not in str(exc.value) and "loads on one device" in str(exc.value)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_corpus_experts_on_a_moe_gguf_equal_its_source(moe_files, tmp_path, arch):
    """`corpus --experts` (its counts checked against a hand count in tests/test_corpus_experts.py) on the GGUF
    file and on the source's directory: the same slots and weights per expert."""
    _, path, folder = moe_files[arch]
    text = tmp_path / "t.txt"
    text.write_text("The cat sat on the mat.\nThank you very much, said the bank of the river.\n")
    ours, theirs = (_json("corpus", str(text), "--model", str(m), "--experts", "--out", str(tmp_path / m.name))
                    for m in (path, folder))
    assert ours["tokens"] == theirs["tokens"] and [r["slots"] for r in ours["experts"]] == [
        r["slots"] for r in theirs["experts"]]
    assert sum(r["slots"] for r in ours["experts"]) == ours["tokens"] * 2 * 2  # tokens x k x blocks
    assert [r["mean_weight"] for r in ours["experts"]] == pytest.approx([r["mean_weight"] for r in theirs["experts"]],
                                                                        rel=1e-5)
    assert ours["expert_pairs"] == theirs["expert_pairs"]
