"""What each line of the README's tour promises, checked on its output (tests/test_tour.py runs the lines).

A line whose comment states figures of the model it runs on (``params``, ``tokens``, ``layernorm``, the default
model's ``next``) must print those figures. A line that runs on the tour's tiny random Llama is checked against
transformers' own forward of that model (``Reference``), or against the identity its output states (the DLA rows
add up to the logit difference; the ablation effects are metric minus the intact metric; the patching values are
normalised between the corrupt and the clean metric). A line that writes a file must write that file, in its
format. Residual-stream rows are checked by their order, never by their labels (docs/engine.md#layers).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def tables(stdout: str) -> list[list[dict[str, str]]]:
    """The tab-separated tables a piped command prints (blank-line separated, a header row each)."""
    out = []
    for chunk in stdout.strip().split("\n\n"):
        lines = [line for line in chunk.splitlines() if line]
        if lines:
            head = lines[0].split("\t")
            out.append([dict(zip(head, line.split("\t"))) for line in lines[1:]])
    return out


def close(a: float, b: float, tol: float = 1e-4) -> bool:
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol * 1e-2)


def stated_numbers(comment: str) -> list[str]:
    """The numbers a tour comment states: ``124,439,808``, ``0.796``, ``-0.3464``."""
    return re.findall(r"-?\d[\d,]*(?:\.\d+)?", comment)


def appears(number: str, stdout: str) -> bool:
    """``number`` (as the comment writes it) is a value in ``stdout``, to the comment's precision."""
    value = float(number.replace(",", ""))
    places = len(number.split(".")[1]) if "." in number else 0
    found = (float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", stdout))
    return any(abs(x - value) <= 0.5 * 10 ** -places + 1e-12 for x in found)


def after(pattern: str, text: str) -> float:
    """The number right after ``pattern`` (a regular expression) in ``text``."""
    m = re.search(pattern + r"(-?\d+(?:\.\d+)?)", text)
    assert m, (pattern, text)
    return float(m.group(1))


@dataclass
class Reference:
    """The tour's tiny Llama in plain transformers: ids, logits, hidden states, attention weights."""

    model: Any
    tokenizer: Any

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def forward(self, text: str) -> Any:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([self.ids(text)]), output_hidden_states=True, output_attentions=True)

    def log_probs(self, text: str) -> Any:
        return self.forward(text).logits[0, -1].double().log_softmax(-1)

    def logit_diff(self, text: str, target: str, foil: str) -> float:
        logits = self.forward(text).logits[0, -1].double()
        return float(logits[self.ids(target)[0]] - logits[self.ids(foil)[0]])


def check_trace(out: str, ref: Reference, n_layers: int) -> None:
    rows, top = tables(out)
    assert len(rows) == n_layers + 1  # embed and every block's output
    hidden = ref.forward("Thank you very").hidden_states
    for row, h in zip(rows[:n_layers], hidden[:n_layers]):  # hidden_states[i] is the i-th reading but the last
        assert close(row["resid_norm"], h[0, -1].norm())
    lp = ref.log_probs("Thank you very")
    for row in top:
        assert close(row["probability"], lp[int(row["token_id"])].exp())
    assert [int(r["token_id"]) for r in top] == lp.topk(len(top)).indices.tolist()
    assert rows[-1]["lens_token"] == top[0]["token"]  # the last reading's lens is the model's own logits


def check_next_target(out: str, ref: Reference) -> None:
    top, target = tables(out)
    lp = ref.log_probs("Thank you very")
    (row,) = target
    assert int(row["token_id"]) == ref.ids(" much")[0] == 881
    assert close(row["logprob"], lp[881])
    assert int(row["rank"]) == int((lp > lp[881]).sum()) + 1
    assert close(top[0]["probability"], lp.max().exp())


def check_next_top(out: str, ref: Reference, prompt: str) -> None:
    top = tables(out)[0]
    lp = ref.log_probs(prompt)
    assert [int(r["token_id"]) for r in top] == lp.topk(len(top)).indices.tolist()
    assert all(close(r["probability"], lp[int(r["token_id"])].exp()) for r in top)


def check_drift(out: str, ref: Reference, n_layers: int) -> None:
    (rows,) = tables(out)
    assert len(rows) == n_layers + 1
    a = ref.forward("I deposited the cash at the bank.").hidden_states
    b = ref.forward("We sat on the muddy river bank.").hidden_states
    import torch

    for row, ha, hb in zip(rows[:n_layers], a, b):  # token 6, " bank", in both contexts
        assert close(row["similarity"], torch.cosine_similarity(ha[0, 6], hb[0, 6], dim=0), 1e-3)
    assert close(rows[0]["similarity"], 1.0)  # the same token at the same position: the same embedding


def check_lens(out: str, ref: Reference, n_layers: int, target: str | None) -> None:
    (cells,) = tables(out)
    prompt = "The capital of Germany is"
    n = len(ref.ids(prompt))
    assert len(cells) == (n_layers + 1) * n
    logits = ref.forward(prompt).logits[0].double().log_softmax(-1)
    for pos, cell in enumerate(cells[-n:]):  # the last reading, block L-1: the model's own distribution
        assert int(cell["position"]) == pos
        assert close(cell["logprob"], logits[pos].max())
        if target is not None:
            assert close(cell["target_probability"], logits[pos, ref.ids(target)[0]].exp())


def check_fit(args: list[str], work: Path, ref: Reference) -> None:
    """The file is jlens' format: one d_model x d_model matrix per source block (every block below the last); a
    tuned lens: tuned-lens' directory, one translator per residual row below the last block."""
    import torch

    if args[1] == "tuned":
        out = work / args[args.index("--out") + 1]
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "params.pt"], list(out.iterdir())
        params = torch.load(out / "params.pt", weights_only=True)
        assert len(params) == 2 * ref.model.config.num_hidden_layers, sorted(params)
        return
    saved = torch.load(work / args[args.index("--out") + 1], weights_only=True)
    d = ref.model.config.hidden_size
    n_layers = ref.model.config.num_hidden_layers
    assert saved["d_model"] == d and sorted(saved["J"]) == list(range(n_layers - 1)), sorted(saved["J"])
    assert all(tuple(j.shape) == (d, d) and bool(torch.isfinite(j).all()) for j in saved["J"].values())


def check_fitted_lens(out: str, work: Path, n_layers: int) -> None:
    """Read through the fitted file: the fitted blocks' rows and the last block's, no embed row."""
    (cells,) = tables(out)
    shown = sorted({c["layer"] for c in cells}, key=int)
    assert shown == [str(b) for b in range(n_layers)], shown


def check_lens_eval(out: str, n_layers: int) -> None:
    """pass@k per lens, in the order given, each lens reading every block below the last (the tour's lens.pt is
    fitted at all of them), pass@k a fraction that grows with k; then one rank row per intermediate."""
    summary, words = tables(out)
    assert [r["lens"] for r in summary] == ["logit", "jacobian"], summary
    assert all(r["blocks"] == f"0-{n_layers - 2}" for r in summary), summary
    for r in summary:
        values = [float(r[f"pass_at_{k}"]) for k in (1, 5, 10)]
        assert 0 <= values[0] <= values[1] <= values[2] <= 1, r
    assert words and {"rank_logit", "rank_jacobian"} <= set(words[0]), words[:1]


def check_dla(out: str, ref: Reference, err: str) -> None:
    (rows,) = tables(out)
    total = sum(float(r["contribution"]) for r in rows)
    diff = ref.logit_diff("The capital of Germany is", " Berlin", " Paris")
    assert abs(total - diff) < 1e-4, (total, diff)
    assert abs(after(r"model's logit\S* − logit\S* ", err) - diff) < 1e-5, err


def check_attn(out: str, ref: Reference) -> None:
    (rows,) = tables(out)
    weights = ref.forward("The cat sat on the mat").attentions[5][0, 1]
    assert len(rows) == 6 * 7 // 2  # causal: each query sees itself and what came before
    for r in rows:
        assert close(r["weight"], weights[int(r["query_position"]), int(r["key_position"])], 1e-4)


def check_heads(out: str, n_layers: int) -> None:
    (rows,) = tables(out)
    scores = [float(r["induction"]) for r in rows]
    assert len(rows) == 5 and scores == sorted(scores, reverse=True)
    assert all(0 <= int(r["layer"]) < n_layers and 0 <= int(r["head"]) < 4 for r in rows)


def check_ablate(out: str, ref: Reference, err: str, n_layers: int) -> None:
    (rows,) = tables(out)
    intact = float(ref.log_probs("Thank you very")[881])
    assert abs(after("intact run: ", err) - intact) < 1e-4, err
    assert len(rows) == 2 * n_layers  # attention and MLP of every block
    assert {int(r["layer"]) for r in rows} == set(range(n_layers))
    for r in rows:
        assert close(float(r["metric"]) - float(r["effect"]), intact, 1e-6)


def check_patch(out: str, ref: Reference) -> None:
    grid, *check = tables(out)
    clean = ref.logit_diff("The Eiffel Tower is in the city of", " Paris", " Rome")
    corrupt = ref.logit_diff("The Colosseum is in the city of", " Paris", " Rome")
    for r in grid:
        assert close(r["value"], (float(r["metric"]) - corrupt) / (clean - corrupt), 1e-3), r
    if check:  # --check N: the N largest estimates rerun exactly; the grid shows the estimates
        (rows,) = check
        assert len(rows) == 10
        estimates = {(r["layer"], r["head"]): float(r["value"]) for r in grid}
        assert all(close(estimates[r["layer"], r["head"]], r["estimate_value"]) for r in rows)


def check_attribute(out: str, ref: Reference, err: str) -> None:
    (rows,) = tables(out)
    assert [r["token"] for r in rows] == ["The", "·capital", "·of", "·Germany", "·is"]
    assert close(sum(abs(float(r["share"])) for r in rows), 1.0)
    f = float(ref.log_probs("The capital of Germany is")[ref.ids(" Berlin")[0]])
    assert abs(after("at the last position = ", err) - f) < 1e-4, err
    m = re.search(r"sum of attributions (\S+) vs f\(x\) - f\(baseline\) = \S+ - \S+ = (\S+);", err)
    assert m and close(sum(float(r["attribution"]) for r in rows), m.group(1), 1e-3)


def check_generate(out: str, ref: Reference) -> None:
    import torch

    (rows,) = tables(out)
    ids = ref.ids("The capital of France is")
    with torch.no_grad():
        greedy = ref.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert [int(r["token_id"]) for r in rows] == greedy[0, len(ids):].tolist()
    assert all(r["first_top1_layer"] == "" or 0 <= int(r["first_top1_layer"]) < 6 for r in rows)


def check_steer(out: str, ref: Reference, work: Path) -> None:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    (rows,) = tables(out)
    pos = ref.forward("I love this. It is wonderful").hidden_states[4][0, -1]  # block 3's output
    neg = ref.forward("I hate this. It is awful").hidden_states[4][0, -1]
    assert close(rows[0]["norm"], (pos - neg).norm(), 1e-4)
    (vector,) = load_file(work / "joy.safetensors").values()
    assert vector.reshape(-1).shape == (32,)
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(work / "joy.gguf").tensors}
    assert list(tensors) == ["direction.3"]  # llama.cpp's layer 3 is block 3


def check_files(line: str, work: Path) -> None:
    """The files a line writes, in the format its name says."""
    if "--plot lens.png" in line:
        assert (work / "lens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if "-o report.html" in line:
        page = (work / "report.html").read_text(encoding="utf-8")
        assert page.lstrip().lower().startswith("<!doctype html") and "The capital of Germany is" in page
    if "--out run1" in line:
        import pyarrow.parquet as pq

        summary = pq.read_table(work / "run1" / "summary.parquet").to_pylist()
        assert len(summary) == 7  # embed and the six blocks' outputs
        assert all(row["kl_nats"] is not None and row["resid_norm"] > 0 for row in summary[1:])
    if "--to ./source" in line:
        assert (work / "source" / "config.json").exists() and list((work / "source").glob("*.safetensors"))


def check_params(args: list[str], out: str) -> None:
    (rows,) = tables(out)
    by_key = {r["key"]: r for r in rows}
    total = int(by_key["total"]["parameters"])
    assert sum(int(r["parameters"]) for r in rows if r["key"] != "total") == total
    if args[-2:] == ["--dtype", "bf16"]:  # two bytes a parameter
        assert all(int(r["memory_bytes"]) == 2 * int(r["parameters"]) for r in rows)
    if args[1:] == ["mixtral-8x7b"]:  # top-2 of 8 experts: a quarter of the routed experts is active
        experts = by_key["routed_experts"]
        assert 4 * int(experts["active"]) == int(experts["parameters"]) and int(by_key["total"]["active"]) < total
    if "--per-layer" in args:  # SmolLM2-135M: 30 blocks; its GGUF file's bits per weight from the header
        assert len([r for r in rows if r["key"].startswith("layer_")]) == 30 and total == 134515008
        assert close(by_key["total"]["bits_per_weight"], 8 * int(by_key["total"]["disk_bytes"]) / total)


def stated(line: str) -> list[str]:
    """The figures a tour line's comment states (``124,439,808``, ``0.796``, ``-0.3464``), not the digits of
    names (``gpt2``, ``llama-7b``, ``fp32``), nor a fit line's cost and settings (``about 2 min``, ``100+ prompts``,
    ``--tokens 100000``: issue 61 item 3)."""
    comment = line.partition("#")[2]
    comment = re.sub(r"--[\w-]+ \S+|\d[\d,]*\+? (?:s|min|h|prompts?|tokens)\b", "", comment)
    return [n.rstrip(",") for n in re.findall(r"(?<![\w.-])-?\d[\d,]*(?:\.\d+)?(?![\w.])", comment)]


def check(line: str, args: list[str], out: str, err: str, work: Path, ref: Reference) -> None:
    """Everything the tour line ``line`` (run as ``args``) promises."""
    command, n_layers = args[0], 6
    for number in stated(line):
        assert appears(number, out), (line, number)
    checks = {
        "models": lambda: "smollm2" in out or "--default" in line,
        "params": lambda: check_params(args, out),
        "tokens": lambda: [r["token"] for r in tables(out)[0]] == ["Thank", "·you", "·very"],
        "layernorm": lambda: bool(stated(line)),
        "trace": lambda: check_trace(out, ref, n_layers),
        "drift": lambda: check_drift(out, ref, n_layers),
        "lens": lambda: (check_fitted_lens(out, work, n_layers) if "--lens" in args else
                         check_lens(out, ref, n_layers, " Berlin" if "--target" in line else None)),
        "fit-lens": lambda: check_fit(args, work, ref),
        "lens-eval": lambda: check_lens_eval(out, n_layers),
        "dla": lambda: check_dla(out, ref, err),
        "attn": lambda: check_attn(out, ref),
        "heads": lambda: check_heads(out, n_layers),
        "ablate": lambda: check_ablate(out, ref, err, n_layers),
        "patch": lambda: check_patch(out, ref),
        "attribute": lambda: check_attribute(out, ref, err),
        "generate": lambda: check_generate(out, ref),
        "steer": lambda: check_steer(out, ref, work),
        "verify": lambda: "fail" not in out.lower() and "pass" in out.lower(),
        "report": lambda: True, "corpus": lambda: bool(out.strip()), "convert": lambda: True,
    }
    if command == "next":
        checks["next"] = (lambda: "·Berlin" in tables(out)[0][0]["token"]) if "Germany" in line else (
            lambda: check_next_target(out, ref))
    assert command in checks, f"no check for the tour's `{command}` line: add one"
    assert checks[command]() is not False, line
    check_files(line, work)
