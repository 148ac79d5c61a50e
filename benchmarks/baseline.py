"""Hand-written transformers baselines that `benchmarks/run.py` times against anatomy.

Each one is what a user would write instead of calling anatomy: nothing from
anatomy_cli is imported, only torch and transformers, so the comparison measures
what anatomy adds.

    python benchmarks/baseline.py trace DIR PROMPT        # load, tokenize, one forward, top-5
    python benchmarks/baseline.py next DIR BATCH < lines  # batched forward loop, top-10 per prompt (jsonl)
    python benchmarks/baseline.py params                  # GPT-2 on the meta device, sum of parameters
    python benchmarks/baseline.py next-gguf FILE PROMPT   # a GGUF file through transformers, one forward, top-10
"""

from __future__ import annotations

import json
import sys


def trace(model_dir: str, prompt: str) -> None:
    """Load DIR, run PROMPT once with ``output_hidden_states=True``, print the top-5 next tokens as JSON."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model(**enc, output_hidden_states=True, use_cache=False)
    probs = torch.softmax(out.logits[0, -1].double(), dim=-1)
    top = torch.topk(probs, 5)
    print(json.dumps({"n_hidden_states": len(out.hidden_states),
                      "top": [{"token_id": int(i), "token": tokenizer.decode([int(i)]), "probability": float(p)}
                              for p, i in zip(top.values, top.indices)]}))


def next_tokens(model_dir: str, batch_size: int) -> None:
    """Stdin lines through DIR in batches of BATCH; one JSON line per prompt with its top-10 next tokens.

    Right padding with EOS and the attention mask; the LM head is applied to each prompt's
    last real position only (the cheapest correct way, and what anatomy does).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    prompts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = sys.stdout
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            hidden = model.base_model(**enc, use_cache=False).last_hidden_state
            last = enc["attention_mask"].sum(1) - 1
            logits = model.lm_head(hidden[torch.arange(len(batch)), last])
        logp = torch.log_softmax(logits.double(), dim=-1)
        values, ids = torch.topk(logp, 10)
        for prompt, v, i in zip(batch, values.tolist(), ids.tolist()):
            out.write(json.dumps({"prompt": prompt, "top": [
                {"token_id": t, "token": tokenizer.decode([t]), "logprob": lp} for t, lp in zip(i, v)]}) + "\n")


def next_gguf(path: str, prompt: str) -> None:
    """Load a GGUF file as transformers does (``from_pretrained(folder, gguf_file=name)``: the tokenizer converted
    from the file's vocabulary, the weights dequantized to fp32), run PROMPT once, print the top-10 next tokens."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    file = Path(path).resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32).eval()
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**enc, use_cache=False).logits[0, -1]
    probs = torch.softmax(logits.double(), dim=-1)
    top = torch.topk(probs, 10)
    print(json.dumps([{"token_id": int(i), "token": tokenizer.decode([int(i)]), "probability": float(p)}
                      for p, i in zip(top.values, top.indices)]))


def params() -> None:
    """Build GPT-2 small on the meta device and print its parameter count (tied weights once)."""
    import torch
    from transformers import GPT2Config
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    print(sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "trace":
        trace(args[0], args[1])
    elif command == "next":
        next_tokens(args[0], int(args[1]))
    elif command == "next-gguf":
        next_gguf(args[0], args[1])
    elif command == "params":
        params()
    else:
        sys.exit(f"unknown baseline {command!r}")
