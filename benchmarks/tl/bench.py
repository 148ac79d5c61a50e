"""anatomy against TransformerLens on the same numbers (issue 20).

Runs in the separate environment made by ``benchmarks/tl/setup.sh`` (TransformerLens never goes
into the project's own environment or its tests):

    bash benchmarks/tl/setup.sh /work/tl-venv                    # once
    /work/tl-venv/bin/python benchmarks/tl/bench.py               # all figures, both models, docs/performance.md
    /work/tl-venv/bin/python benchmarks/tl/bench.py --models gpt2-small --skip e2e --runs 3 --out /tmp/tl.md

Models (``benchmarks/tl/models.py``, written once to ``--models-dir``): GPT-2 small's shape with
random weights and the real SmolLM2-135M-Instruct, both as ``save_pretrained`` directories that
``anatomy --model DIR`` and ``TransformerBridge.boot_transformers(DIR)`` load alike. The TL side of
every figure is ``benchmarks/tl/tl_side.py``. Each figure is a ratio anatomy / TransformerLens of
medians taken in one run, the two sides alternating (``benchmarks/run.py``'s ``alternate``, each
sample started on a quiet machine), with the largest absolute difference between the two sides'
numbers beside it: above 1e-3 it is flagged in the table.

Figures, as named by ``--skip``: e2e (1. end to end `trace`, and 6. the peak RSS of those runs),
inproc (2. warm trace in one process), heads (3.), dla (4.), patch (5.); 3-5 run both end to
end (wall, peak RSS) and warm in one process, when the command exists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
import models as bench_models  # noqa: E402  (benchmarks/tl/models.py)
import run as base  # noqa: E402  (benchmarks/run.py: measuring helpers)
import tl_side  # noqa: E402

PYTHON = sys.executable
_SCRIPT = shutil.which("anatomy", path=str(Path(PYTHON).parent))
ANATOMY = [_SCRIPT] if _SCRIPT else [PYTHON, "-m", "anatomy_cli"]
TL_SIDE = [PYTHON, str(HERE / "tl_side.py")]
TRACE_PROMPT = base.TRACE_PROMPT
# dla: logit(" the") - logit(" a") after TRACE_PROMPT; patch: an indirect-object pair, one name swapped
# (the same token count in both models' tokenizers), logit(" John") - logit(" Mary").
DLA_TOKENS = (" the", " a")
PATCH_CLEAN = "When John and Mary went to the store, Mary gave a drink to"
PATCH_CORRUPT = "When John and Mary went to the store, John gave a drink to"
PATCH_TOKENS = (" John", " Mary")
FLAG = 1e-3
MODELS = ("gpt2-small", "smollm2")


# ---------------------------------------------------------------- comparing numbers

def max_diff(ours, theirs, keys: tuple[str, ...]) -> tuple[float, str]:
    """Largest |ours[k] - theirs[k]| over ``keys`` in two parallel lists of records: (value, 'list.key').

    Records are paired in order; a key missing or None on either side is skipped.
    """
    worst, where = 0.0, ""
    for a, b in zip(ours, theirs):
        for key in keys:
            x, y = a.get(key), b.get(key)
            if x is None or y is None:
                continue
            d = abs(float(x) - float(y))
            if d > worst:
                worst, where = d, key
    return worst, where


def compare_trace(ours: dict, theirs: dict) -> dict:
    """Differences between anatomy's and TL's `trace` numbers: max |Δ| and top-token agreement."""
    keys = ("cos_to_embedding", "cos_to_previous", "resid_norm", "attn_norm", "mlp_norm", "lens_probability")
    d_layers, where = max_diff(ours["layers"], theirs["layers"], keys)
    d_top, _ = max_diff(ours["top"], theirs["top"], ("probability",))
    same_lens = [a["lens_token_id"] for a in ours["layers"]] == [b["lens_token_id"] for b in theirs["layers"]]
    same_top = [a["token_id"] for a in ours["top"]] == [b["token_id"] for b in theirs["top"]]
    worst = max(d_layers, d_top)
    return {"max_abs_diff": worst, "where": where if d_layers >= d_top else "top.probability",
            "same_tokens": same_lens and same_top}


def compare_heads(ours: dict, theirs: dict) -> dict:
    keys = ("entropy", "first_token", "prev_token", "induction", "duplicate_token")
    d, where = max_diff(ours["heads"], theirs["heads"], keys)
    return {"max_abs_diff": d, "where": where}


def compare_dla(ours: dict, theirs: dict) -> dict:
    """By component name: TL's decompose_resid has no row for the final norm's bias (anatomy's ``bias``)."""
    mine = {r["component"]: r["contribution"] for r in ours["rows"]}
    pairs = [({"c": mine.get(r["component"])}, {"c": r["contribution"]}) for r in theirs["rows"]]
    if any(a["c"] is None for a, _ in pairs):
        return {"max_abs_diff": float("inf"), "where": "component names differ"}
    d, _ = max_diff([a for a, _ in pairs], [b for _, b in pairs], ("c",))
    return {"max_abs_diff": d, "where": "contribution"}


def compare_patch(ours: dict, theirs: dict) -> dict:
    d_cells, _ = max_diff(ours["cells"], theirs["cells"], ("value",))
    d_metric, _ = max_diff([ours], [theirs], ("clean_metric", "corrupt_metric"))
    return {"max_abs_diff": max(d_cells, d_metric), "where": "value" if d_cells >= d_metric else "metric"}


# ---------------------------------------------------------------- anatomy in process
# Mirrors of the command bodies (anatomy_cli/cli/commands/*.py) without the rendering.

def anatomy_trace(lm, prompt: str) -> dict:
    """What `anatomy trace PROMPT` computes, minus rendering (benchmarks/run.py's mirror of commands/trace.py)."""
    return base.trace_in_process(lm, prompt)


def anatomy_heads(lm, prompt: str, seq_len: int = 50, seed: int = 0) -> dict:
    """What `anatomy heads PROMPT` computes (tasks/heads.py): the patterns of the prompt and of the
    random repeated sequence in one batched eager run, reduced layer by layer."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses import heads as analysis

    encoded = engine.check_length(lm, engine.encode(lm, [prompt]))
    ids = analysis.random_repeat(engine.ordinary_token_ids(lm), seq_len, seed)
    rand = engine.encode_ids(lm, ids, text="random")
    start = rand.special.index(False)

    def reduce(i, _layer, pattern):
        if i < len(encoded):
            return analysis.pattern_scores(pattern)
        return torch.cat([analysis.pattern_scores(pattern), analysis.repeat_scores(pattern, start=start,
                                                                                  seq_len=seq_len)])

    scores = engine.attention_patterns(lm, [*encoded, rand], reduce=reduce)
    return analysis.heads(scores[0], scores[-1][:, 3:], measured_on="prompt", seq_len=seq_len, seed=seed,
                          random_token_ids=ids[:seq_len]).to_dict()


def anatomy_dla(lm, prompt: str, target: int, foil: int) -> dict:
    """What `anatomy dla PROMPT --target-id T --foil-id F` computes (tasks/dla.py: its check and run), by layer:
    every row (the result's ``full``)."""
    from anatomy_cli import engine
    from anatomy_cli.tasks import dla as task

    encoded = engine.check_length(lm, engine.encode(lm, [prompt]))
    opts = task.DlaOptions(target_id=target, foil_id=foil)
    [result] = task.run(lm, encoded, opts, task.check(lm, opts, encoded))
    return result.full.to_dict()


def anatomy_patch(lm, clean: str, corrupt: str, target: int, foil: int) -> dict:
    """What `anatomy patch CLEAN CORRUPT --target-id T --foil-id F` computes (tasks/patch.py), site resid_pre."""
    from anatomy_cli import engine
    from anatomy_cli.analyses import patch as analysis
    from anatomy_cli.engine import interventions

    a, b = engine.encode(lm, [clean, corrupt])
    run = interventions.patch_grid(lm, a.ids, b.ids, "resid_pre", batch_size=32,
                                   reduce=analysis.logit_metric(target, foil))
    return analysis.patching("resid_pre", "logit_diff", run.layers, run.columns, run.grid, float(run.clean),
                             float(run.corrupt)).to_dict()


def token_ids(tokenizer, *texts: str) -> list[int]:
    """The single token id of each text (exits when one is several tokens)."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            sys.exit(f"{text!r} is {len(ids)} tokens in this tokenizer; the benchmark needs one")
        out.append(ids[0])
    return out


# ---------------------------------------------------------------- rows

class Table:
    """Rows of the TL comparison: figure, anatomy, TL, ratio, target, pass, max |Δ|."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, figure: str, a: str, b: str, ratio: float | None, target: str, ok: bool | None,
            diff: dict | None = None, **samples) -> None:
        self.rows.append(dict(figure=figure, anatomy=a, tl=b, ratio=ratio, target=target, ok=ok, diff=diff,
                              samples=samples))

    def ratio(self, figure: str, a: list[float], b: list[float], target: float, diff: dict | None = None,
              unit=base.fmt_s, higher_ok: bool = False, info: bool = False) -> None:
        ma, mb = base.median(a), base.median(b)
        r = ma / mb
        if info:
            target_s, ok = "(info)", None
        else:
            target_s = f"{'≥' if higher_ok else '≤'} {target:g}"
            ok = r >= target if higher_ok else r <= target
        self.add(figure, unit(ma), unit(mb), r, target_s, ok, diff, anatomy=a, tl=b,
                 pair_ratios=[x / y for x, y in zip(a, b)])


def diff_cell(diff: dict | None) -> str:
    if diff is None:
        return "—"
    d = diff["max_abs_diff"]
    text = f"{d:.1e}" + (f" ({diff['where']})" if diff.get("where") else "")
    if d > FLAG:
        text = f"**{text} > 1e-3**"
    if diff.get("same_tokens") is False:
        text += ", **tokens differ**"
    return text


# ---------------------------------------------------------------- figures

def fig_e2e(table: Table, name: str, path: Path, env, runs: int, warmup: int, log) -> None:
    log(f"1. e2e trace, {name}")
    a, b = base.alternate(lambda: base.run_proc([*ANATOMY, "trace", TRACE_PROMPT, "--model", str(path),
                                                 "--format", "json"], env),
                          lambda: base.run_proc([*TL_SIDE, "trace", str(path), TRACE_PROMPT], env), runs, warmup)
    ours, theirs = json.loads(a[0].stdout), json.loads(b[0].stdout)
    diff = compare_trace(ours, theirs)
    n = len(ours["token_ids"])
    table.ratio(f"1. e2e `trace` ({name}, {n} tokens), wall", [s.seconds for s in a], [s.seconds for s in b], 0.9,
                diff)
    rss_a, rss_b = [s.max_rss for s in a], [s.max_rss for s in b]
    table.ratio(f"6. peak RSS, `trace` e2e ({name})", rss_a, rss_b, 1.0, None, unit=base.fmt_mb, info=True)


def fig_inproc(table: Table, name: str, lm, bridge, tokenizer, runs: int, warmup: int, log) -> None:
    log(f"2. in-process trace, {name}")
    ids = tl_side.tokens(tokenizer, TRACE_PROMPT)
    ours, theirs = anatomy_trace(lm, TRACE_PROMPT), tl_side.trace(bridge, ids)
    diff = compare_trace(ours, theirs)
    a, b = base.alternate(base.timed(lambda: anatomy_trace(lm, TRACE_PROMPT)),
                          base.timed(lambda: tl_side.trace(bridge, ids)), runs, max(warmup, 1))
    table.ratio(f"2. warm trace in process ({name}, {ids.shape[1]} tokens) vs `run_with_cache` "
                f"({len(tl_side.trace_names(bridge.cfg.n_layers))} hooks)", a, b, 1.0, diff)


def fig_command(table: Table, fig: str, name: str, ours_cmd: list[str], theirs_cmd, compare, env, runs: int,
                warmup: int, log, target: float, higher_ok: bool = False, label: str = "") -> None:
    """A command end to end against its TL script: wall ratio (with ``target``) and peak RSS (6.).

    ``theirs_cmd``: the TL command line, or a function of anatomy's first JSON output returning it
    (heads passes the random token ids anatomy drew)."""
    log(f"{fig} e2e, {name}")
    first = base.run_proc(ours_cmd, env)
    cmd = theirs_cmd(json.loads(first.stdout)) if callable(theirs_cmd) else theirs_cmd
    a, b = base.alternate(lambda: base.run_proc(ours_cmd, env), lambda: base.run_proc(cmd, env), runs,
                          warmup)
    diff = compare(json.loads(a[0].stdout), json.loads(b[0].stdout))
    short = fig.split(" ", 1)[1]
    if higher_ok:  # a speed-up: TL time / anatomy time
        table.ratio(f"{fig} e2e ({name}{label}), speed-up", [y.seconds / x.seconds for x, y in zip(a, b)],
                    [1.0] * len(a), target, diff, unit=lambda x: f"{x:.2f}×", higher_ok=True)
        table.rows[-1].update(anatomy=base.fmt_s(base.median([x.seconds for x in a])),
                              tl=base.fmt_s(base.median([y.seconds for y in b])))
    else:
        table.ratio(f"{fig} e2e ({name}{label}), wall", [s.seconds for s in a], [s.seconds for s in b], target, diff)
    table.ratio(f"6. peak RSS, {short} e2e ({name})", [s.max_rss for s in a], [s.max_rss for s in b], 1.0,
                unit=base.fmt_mb, info=True)


def fig_warm(table: Table, fig: str, name: str, ours, theirs, compare, runs: int, warmup: int, log,
             target: float, higher_ok: bool = False, label: str = "") -> None:
    """Two in-process callables on loaded models: the time ratio (or TL / anatomy speed-up) and max |Δ|."""
    log(f"{fig} in process, {name}")
    diff = compare(ours(), theirs())
    a, b = base.alternate(base.timed(ours), base.timed(theirs), runs, max(warmup, 1))
    if higher_ok:
        table.ratio(f"{fig} warm in process ({name}{label}), speed-up", [y / x for x, y in zip(a, b)],
                    [1.0] * len(a), target, diff, unit=lambda x: f"{x:.2f}×", higher_ok=True)
        table.rows[-1].update(anatomy=base.fmt_s(base.median(a)), tl=base.fmt_s(base.median(b)))
    else:
        table.ratio(f"{fig} warm in process ({name}{label})", a, b, target, diff)


def warm_figures(table: Table, notes: list[str], name: str, path: Path, dla_ids: list[int], patch_ids: list[int],
                 skip: set[str], *, runs: int, inproc_runs: int, warmup: int, log) -> None:
    """Figures 2-5 in one process: anatomy's engine and a TL bridge on the same checkpoint, both warm."""
    from anatomy_cli import engine

    lm = engine.load(str(path), device="cpu")
    bridge, tokenizer = tl_side.boot(str(path))
    ids = tl_side.tokens(tokenizer, TRACE_PROMPT)
    fig_inproc(table, name, lm, bridge, tokenizer, inproc_runs, warmup, log)
    clean, corrupt = tl_side.tokens(tokenizer, PATCH_CLEAN), tl_side.tokens(tokenizer, PATCH_CORRUPT)
    warm = {}
    if has_command("heads"):
        rand = anatomy_heads(lm, TRACE_PROMPT)["random_token_ids"]
        warm["heads"] = ("3. `heads`", lambda: anatomy_heads(lm, TRACE_PROMPT),
                         lambda: tl_side.heads(bridge, ids, rand), compare_heads, 1.0, False, inproc_runs)
    if has_command("patch"):
        warm["patch"] = ("5. `patch` resid_pre grid",
                         lambda: anatomy_patch(lm, PATCH_CLEAN, PATCH_CORRUPT, *patch_ids),
                         lambda: tl_side.patch(bridge, clean, corrupt, *patch_ids), compare_patch, 3.0, True,
                         max(runs, 3))
    for key, (fig, ours, theirs, compare, target, higher, n) in warm.items():
        if key in skip:
            continue
        try:
            fig_warm(table, fig, name, ours, theirs, compare, n, warmup, log, target, higher)
        except (RuntimeError, KeyError, ValueError, AttributeError, TypeError) as exc:
            notes.append(f"{fig} in process ({name}) failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    if has_command("dla") and "dla" not in skip:
        bridge = None  # the folded bridge below is a second copy of the weights
        folded, _ = tl_side.boot_folded(str(path))
        try:
            fig_warm(table, "4. `dla`", name, lambda: anatomy_dla(lm, TRACE_PROMPT, *dla_ids),
                     lambda: tl_side.dla(folded, ids, *dla_ids), compare_dla, inproc_runs, warmup, log, 1.0)
        except (RuntimeError, KeyError, ValueError, AttributeError, TypeError) as exc:
            notes.append(f"4. `dla` in process ({name}) failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def has_command(name: str) -> bool:
    """True when anatomy has the command (its record, anatomy_cli/declare/commands.py)."""
    from anatomy_cli.declare.commands import BY_NAME

    return name in BY_NAME


# ---------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--models-dir", type=Path, default=ROOT.parent / "bench-models",
                        help="where the checkpoints are written once (default ../bench-models beside the clone)")
    parser.add_argument("--runs", type=int, default=5, help="recorded pairs of end-to-end figures (default 5)")
    parser.add_argument("--inproc-runs", type=int, help="recorded pairs of in-process figures (default 4x --runs)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded runs of each side first (default 1)")
    parser.add_argument("--skip", default="", help="figures to skip: e2e,inproc,heads,dla,patch")
    parser.add_argument("--max-wait", type=float, default=30.0,
                        help="seconds to wait for other processes to go quiet before each sample (0: never)")
    parser.add_argument("--threads", type=int, help="torch threads on both sides (default: torch's own, one per core)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md",
                        help="markdown file whose '## TransformerLens' section is (re)written")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args(argv)

    names = [m for m in args.models.split(",") if m]
    for m in names:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}; use {', '.join(MODELS)}")
    skip = set(filter(None, args.skip.split(",")))
    runs, warmup = args.runs, args.warmup
    inproc_runs = args.inproc_runs or 4 * runs
    base.BUSY["max_wait"] = args.max_wait

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(NO_COLOR="1")
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
        import torch

        torch.set_num_threads(args.threads)
    began, load_before = time.perf_counter(), base.loadavg()
    paths = bench_models.make_all(args.models_dir.resolve())
    table = Table()
    notes = []
    for name in names:
        path = paths[name]
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path))
        dla_ids, patch_ids = token_ids(tok, *DLA_TOKENS), token_ids(tok, *PATCH_TOKENS)
        model = ["--model", str(path), "--format", "json"]
        e2e = {
            "heads": ("3. `heads`", [*ANATOMY, "heads", TRACE_PROMPT, *model],
                      lambda ours: [*TL_SIDE, "heads", str(path), TRACE_PROMPT,
                                    ",".join(map(str, ours["random_token_ids"]))], compare_heads, 1.0, False),
            "dla": ("4. `dla`", [*ANATOMY, "dla", TRACE_PROMPT, "--target-id", str(dla_ids[0]), "--foil-id",
                                 str(dla_ids[1]), *model],
                    [*TL_SIDE, "dla", str(path), TRACE_PROMPT, *map(str, dla_ids)], compare_dla, 1.0, False),
            "patch": ("5. `patch` resid_pre grid", [*ANATOMY, "patch", PATCH_CLEAN, PATCH_CORRUPT, "--target-id",
                                                    str(patch_ids[0]), "--foil-id", str(patch_ids[1]), *model],
                      [*TL_SIDE, "patch", str(path), PATCH_CLEAN, PATCH_CORRUPT, *map(str, patch_ids)],
                      compare_patch, 3.0, True),
        }
        if "e2e" not in skip:
            fig_e2e(table, name, path, env, runs, warmup, log)
            for key, (fig, ours, theirs, compare, target, higher) in e2e.items():
                if key in skip:
                    continue
                if not has_command(key):
                    notes.append(f"{fig}: `anatomy {key}` does not exist in this tree; skipped")
                    continue
                try:
                    fig_command(table, fig, name, ours, theirs, compare, env, runs, warmup, log, target, higher)
                except (RuntimeError, KeyError, ValueError) as exc:
                    notes.append(f"{fig} e2e ({name}) failed: {str(exc).splitlines()[0]}")
        if "inproc" not in skip:
            warm_figures(table, notes, name, path, dla_ids, patch_ids, skip, runs=runs, inproc_runs=inproc_runs,
                         warmup=warmup, log=log)

    table.rows.sort(key=lambda r: r["figure"].split(" ")[0])
    info = base.machine()
    import transformer_lens  # noqa: F401
    from importlib.metadata import version

    info.update(date=datetime.datetime.now().astimezone().isoformat(timespec="minutes"), load_before=load_before,
                load_after=base.loadavg(), wall=f"{time.perf_counter() - began:.0f} s",
                transformer_lens=version("transformer_lens"))
    if base.BUSY["busy"]:
        notes.append(f"{base.BUSY['busy']} of {base.BUSY['waits']} samples started while other processes kept the "
                     f"CPUs busy for {base.BUSY['max_wait']:g} s: this machine was shared; those figures are noisier")
    section = render(table, info, notes, runs=runs, inproc_runs=inproc_runs, warmup=warmup, models=names,
                     argv=argv if argv is not None else sys.argv[1:])
    write_section(args.out, section)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "rows": table.rows}, indent=1))
    print(section)
    log(f"done in {info['wall']}; wrote {args.out}")
    return 0


# ---------------------------------------------------------------- markdown

SECTION = "## TransformerLens"


def render(table: Table, info: dict, notes: list[str], *, runs: int, inproc_runs: int, warmup: int,
           models: list[str], argv: list[str]) -> str:
    lines = [SECTION, "",
             "The same numbers from TransformerLens, the library users compare anatomy with, measured by "
             "`benchmarks/tl/bench.py` in its own environment (`benchmarks/tl/setup.sh`; TransformerLens is no "
             "dependency of anatomy). The TL side of each figure is `benchmarks/tl/tl_side.py`: the bridge booted "
             "with `TransformerBridge.boot_transformers(DIR, tokenizer=...)` from the same local directory, token "
             "ids passed as a tensor (no BOS, as anatomy), `torch.no_grad()`. Ratio = anatomy / TransformerLens "
             "(medians); max |Δ| = the largest absolute difference between the two sides' numbers, flagged above "
             "1e-3. The bridge forces eager attention and anatomy uses transformers' default (sdpa): differences "
             "of about 1e-5 relative are expected from that alone.", "",
             f"`{' '.join(['/work/tl-venv/bin/python benchmarks/tl/bench.py', *argv])}`", "",
             f"- date: {info['date']}; whole run {info['wall']}",
             f"- machine: {info['cpu']}, {info['cores']} cores, {info['ram']} RAM; {info['os']}",
             f"- Python {info['python']}, torch {info['torch']} ({info['torch_threads']} threads), "
             f"transformers {info['transformers']}, transformer_lens {info['transformer_lens']}",
             f"- load average before / after: {info['load_before']} / {info['load_after']}",
             f"- medians of {runs} end-to-end runs and {inproc_runs} in-process runs after {warmup} warm-up run(s) "
             f"of each side, the two sides alternating; models: {', '.join(models)}", "",
             "| figure | anatomy | TransformerLens | ratio | target | pass | max \\|Δ\\| |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in table.rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "—"
        ok = "—" if r["ok"] is None else ("pass" if r["ok"] else "**FAIL**")
        lines.append(f"| {r['figure']} | {r['anatomy']} | {r['tl']} | {ratio} | {r['target']} | {ok} | "
                     f"{diff_cell(r['diff'])} |")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    lines += ["", "What each figure measures (PROMPT is \"" + TRACE_PROMPT + "\"):", "",
              "1. `anatomy trace PROMPT --model DIR --format json` vs `tl_side.py trace DIR PROMPT`: boot the "
              "bridge, `run_with_cache` with the hooks the numbers need (`resid_pre` of every block and the last "
              "`resid_post`, `attn_out`, `mlp_out`), `cache.accumulated_resid(pos_slice=-1)`, the logit lens as "
              "`bridge.unembed(bridge.ln_final(stack))` (the norm recomputed per layer), cosines and norms in "
              "float64, top-5; wall time from spawn to exit. max |Δ| over every layer's cosines, norms and lens "
              "probability and the top-5 probabilities.",
              "2. The same two computations in one process on loaded models, warm: anatomy's `engine.run` + "
              "logit lens + `analyses.trace` (as `benchmarks/run.py` figure 2) vs the TL function of figure 1 "
              "(`run_with_cache` with only those hooks).",
              "3. `anatomy heads PROMPT` vs `tl_side.py heads`: `run_with_cache` of every layer's `attn.hook_pattern` on the prompt and on the 50 random tokens anatomy drew, repeated, then the five scores (entropy, first_token, prev_token, induction, duplicate_token) per head; end to end and warm in one process.",
              "4. `anatomy dla PROMPT --target-id T --foil-id F` (by layer) vs `tl_side.py dla`: the bridge in compatibility mode, `decompose_resid(layer=-1, pos_slice=-1)` + `logit_attrs(..., incorrect_tokens=F)`; T, F = \" the\", \" a\".",
              "5. `anatomy patch CLEAN CORRUPT --target-id T --foil-id F` (site resid_pre, every layer × position) vs `tl_side.py patch`: `patching.get_act_patch_resid_pre`, one forward per cell, the same normalized logit-difference metric; the ratio column is the speed-up, TL time / anatomy time (pairwise, median).",
              "6. Peak RSS (`/usr/bin/time`'s maximum resident set size) of the end-to-end runs of figures 1, 3, 4 and 5."]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace this file's ``## TransformerLens`` section (up to the next ``## `` heading), else append it."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        after = "\n".join(lines[end:]).strip("\n")
        new = "\n".join(lines[:start]).rstrip("\n") + "\n\n" + section + ("\n" + after + "\n" if after else "")
    path.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
