"""The workloads every benchmark shares: GPT-2-shaped random checkpoints, prompts, the offline
tiktoken cache, and the in-process loops each side runs (anatomy's and the raw transformers baseline's).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

from common import GPT2_BPE

# GPT-2 shapes; "tiny" only keeps the smoke test fast (real vocabulary, tiny width).
SIZES = {
    "tiny": dict(n_embd=64, n_layer=2, n_head=2),
    "small": dict(n_embd=768, n_layer=12, n_head=12),
    "medium": dict(n_embd=1024, n_layer=24, n_head=16),
}


LLAMA_70B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=8192, num_hidden_layers=80,
                 intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)




SHORT_PROMPT = "Thank you very"


_TIKTOKEN_URLS = {
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}


_WORDS = ("time year people way day man thing woman life child world school state family student group country "
          "problem hand part place case week company system program question work government number night point "
          "home water room mother area money story fact month lot right study book eye job word business issue "
          "side kind head house service friend father power hour game line end member law car city community name "
          "president team minute idea kid body information back parent face others level office door health "
          "person art war history party result change morning reason research girl guy moment air teacher force "
          "education foot boy age policy music market sense nation plan college interest death experience effect "
          "class control care field development role effort rate heart drug show leader light voice wife police "
          "mind price report decision son view relationship town road arm difference value building action model "
          "season society tax director position player record paper space ground form event official matter "
          "center couple site project activity star table need court oil situation cost industry figure street "
          "image phone data picture practice piece land product doctor wall patient worker news test movie north "
          "love support technology step baby computer type attention film tree source organization hair window "
          "evidence population site truth garden river bank summer winter bird horse ocean island bridge forest "
          "little old new good great small large long young important public bad same able early free simple "
          "and the of to in for on with at by from about over after into under again then also only very").split()


def seed_tiktoken(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    for name, url in _TIKTOKEN_URLS.items():
        target = cache / hashlib.sha1(url.encode()).hexdigest()
        if not target.exists():
            shutil.copyfile(GPT2_BPE / name, target)


def make_checkpoint(size: str, out: Path, log) -> tuple[Path, int]:
    """A random GPT-2 of ``size`` saved with save_pretrained (+ tokenizer); reused when present.

    Returns (directory, parameter count)."""
    import torch
    from transformers import GPT2Config
    from transformers import GPT2LMHeadModel

    from anatomy_cli.models.model_files import gpt2_tokenizer

    config = GPT2Config(vocab_size=50257, n_positions=1024, bos_token_id=50256, eos_token_id=50256,
                        **SIZES[size])
    done = out / "done.json"
    if done.exists():
        return out, json.loads(done.read_text())["n_params"]
    log(f"writing the {size} checkpoint to {out}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer = gpt2_tokenizer()  # built from the gpt2 files seeded into TIKTOKEN_CACHE_DIR
    assert len(tokenizer) == 50257, len(tokenizer)
    tokenizer.save_pretrained(out)
    del model
    done.write_text(json.dumps({"n_params": n_params}))
    return out, n_params


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of about 16 GPT-2 tokens (14-16 common words), fixed seed."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < n:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(14, 16))]
        prompts.append(" ".join(words).capitalize())
    return prompts


def trace_in_process(lm, prompt: str):
    """What `anatomy trace PROMPT` computes, minus rendering (mirrors commands/trace.py)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import trace as analysis
    from anatomy_cli.cli.commands._common import describe

    encoded = engine.check_length(lm, engine.encode(lm, [prompt]))
    names = engine.residual_names(lm) + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
    names.append("logits")
    [cache] = engine.run(lm, encoded, names, positions=[[-1]])
    resid = cache.residual_stream()[:, 0]
    return analysis.trace(resid, attn_out=cache.stack("attn_out")[:, 0], mlp_out=cache.stack("mlp_out")[:, 0],
                          lens_logits=engine.unembed(lm, resid), logits=cache.logits[0], k=5,
                          describe=describe(lm)).to_dict()


def hf_forward(model, tokenizer, prompt: str):
    """A bare HF forward with hidden states, and the top-5 of the last position."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc, output_hidden_states=True, use_cache=False)
    return torch.topk(torch.softmax(out.logits[0, -1].double(), -1), 5).indices.tolist()


def next_in_process(lm, prompts: list[str], batch_size: int):
    """What `anatomy next -` computes for stdin prompts, minus rendering (mirrors commands/next_token.py)."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import next_token as analysis
    from anatomy_cli.cli.commands._common import describe

    encoded = engine.check_length(lm, engine.encode(lm, prompts))
    caches = engine.run(lm, encoded, ["logits"], positions=[[-1]] * len(encoded), batch_size=batch_size)
    name_token = describe(lm)
    return [analysis.next_tokens(c.logits[0], 10, name_token).to_dict() for c in caches]


def raw_batches(model, tokenizer, prompts: list[str], batch_size: int):
    """The baseline's batched loop (benchmarks/baseline.py next) on an already loaded model."""
    import torch

    out = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            hidden = model.base_model(**enc, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[torch.arange(len(batch)), enc["attention_mask"].sum(1) - 1])
        out.append(torch.topk(torch.log_softmax(logits.double(), -1), 10).indices)
    return out
