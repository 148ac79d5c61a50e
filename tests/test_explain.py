"""`anatomy explain`: delphi's explainer prompt and detection/fuzzing scorers, checked against delphi's own code
(eai-delphi in a side environment, tests/reference/delphi_explain.py; skipped where it is not importable), the
metrics against a hand computation, the export read back by the labels readers of `sae` and `circuit`, resume
after an interruption, and the refusals before any model loads. Tiny random models: the tiny GPT-2 with a chat
template writes and scores (its answers do not parse: delphi's "could not be parsed" and unanswered batches), and
a deterministic stand-in for the chat model where the numbers matter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_features import TEXT
from test_features import invoke
from test_features import write_sae

REFERENCE = Path(__file__).parent / "reference" / "delphi_explain.py"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat_model(root: Path, tiny_model_dir) -> Path:
    """The tiny Llama as a chat model (rotary positions: its context raised to hold delphi's prompts; a template)."""
    import shutil

    from transformers import AutoTokenizer

    chat = root / "chat"
    shutil.copytree(tiny_model_dir("llama"), chat)
    config = json.loads((chat / "config.json").read_text())
    (chat / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    tok = AutoTokenizer.from_pretrained(chat)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(chat)
    return chat


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_model_dir):
    """``(subject model, sae, features dir, latents dir, chat model)``: a features run with delphi's cache."""
    root = tmp_path_factory.mktemp("explain")
    model = tiny_model_dir("gpt2")
    chat = chat_model(root, tiny_model_dir)
    sae = write_sae(root / "sae")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT * 2)
    feats, latents = root / "feats", root / "latents"
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--shard-windows", 3, "--top-k", 8, "--quantiles", 4, "--quantile-size", 2, "--out", feats,
                    "--delphi", latents, "--format", "json")
    assert result.exit_code == 0, result.output
    return model, sae, feats, latents, chat


def answer(messages):
    """The stand-in scorer of tests/reference/delphi_explain.py, written again here."""
    texts = [line.split(": ", 1)[1] if ": " in line else "" for line in messages[-1]["content"].splitlines()
             if line.startswith("Example ")]
    if texts and sum(map(ord, texts[0])) % 7 == 0:
        return "I cannot tell."
    return "[" + ",".join("1" if "<<" in t or sum(map(ord, t)) % 2 else "0" for t in texts) + "]"


def stand_in(monkeypatch, fail_at=None):
    """Replace the chat model's answers: an explanation naming the prompt's first highlighted run, the scorer's
    :func:`answer`; raise on call number ``fail_at`` (an interrupted run)."""
    import re

    from anatomy_cli.tasks import _explain_run

    calls = []

    def ask(self, messages, max_new_tokens, temperature=0.0, seed=0):
        calls.append(1)
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        if messages[0]["content"].startswith("You are a meticulous AI researcher"):
            runs = re.findall(r"<<(.*?)>>", messages[-1]["content"])
            return f"Thinking.\n[EXPLANATION]: the text {runs[0] if runs else 'nothing'!r}"
        return answer(messages)

    monkeypatch.setattr(_explain_run.Chat, "ask", ask)
    return calls


def explain(feats, latents, chat, *more):
    return invoke("explain", feats, "--delphi", latents, "--explainer", chat, "--device", "cpu", *more)


def read_examples(feats, latents, **kw):
    from anatomy_cli.tasks.explain import ExplainOptions
    from anatomy_cli.tasks.explain import read_dir

    return read_dir(ExplainOptions(feats, explainer="x", delphi=latents, **kw))


def delphi_env() -> dict[str, str]:
    """The environment tests/reference/delphi_explain.py runs in; skips where delphi is not importable."""
    env = dict(os.environ)
    extra = env.get("ANATOMY_DELPHI_PATH", "")
    code = "import sys; sys.path += [p for p in sys.argv[1:] if p]; import importlib.util as u; " \
           "sys.exit(0 if u.find_spec('delphi') and u.find_spec('jaxtyping') and u.find_spec('simple_parsing') " \
           "else 1)"
    if subprocess.run([sys.executable, "-c", code, *extra.split(os.pathsep)]).returncode != 0:
        pytest.skip("eai-delphi is not importable (pip install --no-deps eai-delphi and its modules' imports into "
                    "a folder named by ANATOMY_DELPHI_PATH)")
    return env


def run_delphi(given):
    out = subprocess.run([sys.executable, str(REFERENCE)], input=json.dumps(given), capture_output=True, text=True,
                         env=delphi_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def hand_metrics(pairs):
    valid = [(a, p) for a, p in pairs if p is not None]
    tp = sum(a and p for a, p in valid)
    tn = sum((not a) and (not p) for a, p in valid)
    fp = sum((not a) and p for a, p in valid)
    pos = sum(a for a, _ in valid)
    neg = len(valid) - pos
    precision = tp / (tp + fp) if tp + fp else 0
    recall = tp / pos if pos else 0
    return ((tp / pos if pos else 0) + (tn / neg if neg else 0)) / 2, \
        (2 * precision * recall / (precision + recall) if precision + recall else 0)


# ---------------------------------------------------------------- delphi as the reference

def test_explainer_and_scorer_prompts_and_scores_equal_delphi_s(made):
    from anatomy_cli.analyses.explain_prompts import explainer_messages
    from anatomy_cli.analyses.explain_prompts import scorer_messages
    from anatomy_cli.analyses.explain_score import batches
    from anatomy_cli.analyses.explain_score import samples
    from anatomy_cli.analyses.explain_score import score

    _, _, feats, latents, _ = made
    cases = [ex for ex in read_examples(feats, latents).features if ex.test and ex.not_active][:3]
    assert len(cases) == 3
    explanation = "the text ' the'"
    given = [{"examples": ex.train, "max_activation": ex.max_activation, "test": ex.test,
              "not_active": ex.not_active, "explanation": explanation, "shown": 5} for ex in cases]
    for ex, ref in zip(cases, run_delphi(json.loads(json.dumps(given)))):
        assert explainer_messages(ex.train, ex.max_activation) == ref["explainer"]
        for kind in ("detection", "fuzz"):
            ours = [scorer_messages(kind, explanation, [s.text for s in b])
                    for b in batches(samples(kind, ex.test, ex.not_active), 5)]
            assert ours == ref[kind]["prompts"]
            got = score(kind, explanation, ex.test, ex.not_active, 5, answer)
            ba, f1 = hand_metrics([(a, p) for a, p in ref[kind]["pairs"]])
            assert got["balanced_accuracy"] == pytest.approx(ba) and got["f1"] == pytest.approx(f1)
            assert got["unanswered"] == sum(p is None for _, p in ref[kind]["pairs"])


def test_highlighting_and_the_activation_line_by_hand():
    from anatomy_cli.analyses.explain_prompts import activation_line
    from anatomy_cli.analyses.explain_prompts import highlight
    from anatomy_cli.analyses.explain_score import samples

    toks, acts = ["The", " cat", " sat", " on", " mats"], [0.0, 2.0, 10.0, 3.0, 0.5]
    assert highlight(toks, acts) == "The cat<< sat>> on mats"  # > 0.3 x 10 (3.0000000000000004 in float64)
    assert activation_line(toks, acts, [0, 2, 10, 3, 1]) == 'Activations: (" sat" : 10), '
    fuzz = samples("fuzz", [(toks, acts)], [(["a", "b", "c", "d"], [0.0] * 4)])
    # n_incorrect = ceil(4 nonzero / 1) = 4 tokens marked in the non-activating one, len - len // 4 = 3 first
    assert [s.text for s in fuzz] == ["<<abcd>>", "The cat<< sat on>> mats"]  # >= 3 in float32: " on" too


def test_metrics_equal_a_hand_computation():
    from anatomy_cli.analyses.explain_score import metrics

    pairs = [(True, True), (True, False), (True, None), (False, False), (False, True), (False, False), (True, True)]
    got = metrics(pairs)
    # valid: 6; P = 3 (tp 2, fn 1), N = 3 (tn 2, fp 1): BA = (2/3 + 2/3) / 2; precision 2/3, recall 2/3
    assert got["balanced_accuracy"] == pytest.approx(2 / 3) and got["f1"] == pytest.approx(2 / 3)
    assert (got["answered"], got["unanswered"]) == (6, 1)
    assert metrics([(True, None)])["balanced_accuracy"] == 0  # delphi: nothing answered reads 0


# ---------------------------------------------------------------- the command

def test_the_tiny_chat_model_writes_an_export_that_sae_and_circuit_labels_read(made, tmp_path):
    from anatomy_cli.models.sae.labels import read_labels
    from anatomy_cli.models.sae.labels import read_layer_labels

    model, sae, feats, latents, chat = made
    out = tmp_path / "out"
    result = explain(feats, latents, chat, "--max-features", 2, "--max-new-tokens", 8, "--out", out, "-f", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "per feature about" in result.stderr  # the cost, from the first generation
    export = json.loads((out / "explanations.json").read_text())
    assert [r["index"] for r in export] == [str(r["feature"]) for r in data["features"]]
    assert all({"layer", "index", "description", "explanationModelName"} <= set(r) for r in export)
    assert export[0]["layer"] == "0-sae" and export[0]["explanationModelName"] == str(chat)
    # the labels readers of sae --labels and circuit --labels
    labelled = {int(r["index"]): r["description"] for r in export}
    assert read_labels(out / "explanations.json") == labelled
    assert read_layer_labels(out / "explanations.json", 2) == {(0, f): d for f, d in labelled.items()}
    feature = min(labelled)
    run = invoke("sae", "The cat sat on the mat", "--sae", sae, "--model", model, "--device", "cpu", "--feature",
                 feature, "--labels", out / "explanations.json", "--format", "json")
    assert run.exit_code == 0, run.output
    followed = [f for f in json.loads(run.stdout)["features"] if f["feature"] == feature]
    assert followed and followed[0]["label"] == labelled[feature]


def test_the_cost_is_printed_once_the_first_prompt_is_read(made, tmp_path, monkeypatch):
    """The cost line comes during the first generation, right after its prompt and RATE_STEPS new tokens (before
    any explanation is written), and the JSON records it: the rates are that generation's own stamps."""
    import anatomy_cli.engine.generate as engine
    from anatomy_cli.tasks import _explain_run
    from anatomy_cli.tasks import notes

    _, _, feats, latents, chat = made
    events, real, info = [], engine.generate, notes.info

    def generate(lm, ids, *, max_new_tokens, choose, stop, progress):
        def step(done, total):
            events.append(("token", done))
            progress(done, total)

        events.append(("start", len(ids)))
        out = real(lm, ids, max_new_tokens=max_new_tokens, choose=choose, stop=(), progress=step)  # every token
        events.append(("done", len(out.tokens)))
        return out

    monkeypatch.setattr(engine, "generate", generate)
    monkeypatch.setattr(notes, "info", lambda text: (events.append(("info", text)), info(text)))
    result = explain(feats, latents, chat, "--max-features", 2, "--max-new-tokens", 8, "--out", tmp_path / "o",
                     "-f", "json")
    assert result.exit_code == 0, result.output
    busy = [e for e in events if e[0] == "info" and "the machine is busy" in e[1]]  # a loaded machine: one thread
    assert len(busy) <= 1
    events = [e for e in events if e not in busy]
    lines = [i for i, e in enumerate(events) if e[0] == "info" and "per feature about" in e[1]]
    assert len(lines) == 1
    before = events[:lines[0]]
    assert [e[0] for e in before] == ["start"] + ["token"] * (_explain_run.RATE_STEPS + 1)
    assert not any(e[0] == "info" and e[1].startswith("explain: feature") for e in before)
    assert events[lines[0] + 1][0] == "token"  # the generation goes on after the line
    cost = json.loads(result.stdout)["cost"]
    assert cost["prompt_tokens"] == before[0][1] and cost["features"] == 2
    assert cost["per_feature_s"] == pytest.approx(cost["explain_s"] + cost["score_s"])


def test_scores_and_control_with_a_stand_in_and_resume_after_an_interruption(made, tmp_path, monkeypatch):
    from anatomy_cli.analyses.explain_score import score

    _, _, feats, latents, chat = made
    stand_in(monkeypatch)
    whole = explain(feats, latents, chat, "--max-features", 4, "--out", tmp_path / "whole", "-f", "json")
    assert whole.exit_code == 0, whole.output
    data = json.loads(whole.stdout)
    ex = {e.feature: e for e in read_examples(feats, latents, max_features=4).features}
    by_id = {int(r["index"]): r for r in data["explanations"]}
    for r in data["features"]:
        f = r["feature"]
        for kind in ("detection", "fuzz"):
            if not ex[f].test or not ex[f].not_active:
                assert r[f"{kind}_balanced_accuracy"] is None
                continue
            own = score(kind, by_id[f]["description"], ex[f].test, ex[f].not_active, 5, answer)
            other = score(kind, by_id[r["control_of"]]["description"], ex[f].test, ex[f].not_active, 5, answer)
            assert r[f"{kind}_balanced_accuracy"] == own["balanced_accuracy"]
            assert r[f"control_{kind}_balanced_accuracy"] == other["balanced_accuracy"]
        assert r["control_of"] != f and r["control_of"] in by_id
    for fail_at in (3, 9):  # during the explanations, then during the scoring
        out = tmp_path / f"cut-{fail_at}"
        stand_in(monkeypatch, fail_at=fail_at)
        cut = explain(feats, latents, chat, "--max-features", 4, "--out", out, "-f", "json")
        assert cut.exit_code != 0
        kept = json.loads((out / "explanations.json").read_text())
        assert kept and len(kept) <= 4
        stand_in(monkeypatch)
        again = explain(feats, latents, chat, "--max-features", 4, "--out", out, "-f", "json")
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["resumed"] == len(kept)
        assert (out / "explanations.json").read_text() == (tmp_path / "whole" / "explanations.json").read_text()
    other = explain(feats, latents, chat, "--max-features", 3, "--out", tmp_path / "whole")
    assert other.exit_code == 2 and "other settings" in other.output


def test_a_score_nothing_was_answered_for_is_blank_and_out_of_the_means(made, tmp_path, monkeypatch):
    """Issue 60 follow-up: the scorer gives no parsable answer for the first feature's explanation: its own scores
    (and the control that borrows that explanation) are None in the rows, blank in the table and left out of the
    means, which are the mean of the other features' scores computed again here; the export keeps delphi's 0."""
    import re
    import statistics

    from anatomy_cli.analyses.explain_score import score
    from anatomy_cli.tasks import _explain_run

    _, _, feats, latents, chat = made
    mute = "the text nobody can score"
    explained = []
    ex = {e.feature: e for e in read_examples(feats, latents, max_features=5).features}
    scored = [i for i, e in enumerate(ex.values()) if e.test and e.not_active]
    first = list(ex)[scored[0]]  # the first feature that is scored gets the explanation no answer parses for

    def scorer(messages):
        return "I cannot tell." if mute in messages[-1]["content"] else answer(messages)

    def ask(self, messages, max_new_tokens, temperature=0.0, seed=0):
        if messages[0]["content"].startswith("You are a meticulous AI researcher"):
            explained.append(1)
            runs = re.findall(r"<<(.*?)>>", messages[-1]["content"])
            return f"[EXPLANATION]: {mute if len(explained) == scored[0] + 1 else f'the text {runs[0]!r}'}"
        return scorer(messages)

    monkeypatch.setattr(_explain_run.Chat, "ask", ask)
    out = tmp_path / "o"
    result = explain(feats, latents, chat, "--max-features", 5, "--out", out, "-f", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    by_id = {int(r["index"]): r for r in data["explanations"]}
    assert by_id[first]["description"] == mute
    expected, blanks = {"": [], "control_": []}, 0
    for r in data["features"]:
        f = r["feature"]
        if not ex[f].test or not ex[f].not_active:
            continue
        for prefix, text in (("", by_id[f]["description"]), ("control_", by_id[r["control_of"]]["description"])):
            got = score("detection", text, ex[f].test, ex[f].not_active, 5, scorer)
            if got["answered"] == 0:
                blanks += 2  # detection and fuzzing: no answer parses for this explanation
                assert r[f"{prefix}detection_balanced_accuracy"] is None and r[f"{prefix}fuzz_f1"] is None
            else:
                assert r[f"{prefix}detection_balanced_accuracy"] == got["balanced_accuracy"]
                expected[prefix].append(got["balanced_accuracy"])
    row = next(r for r in data["features"] if r["feature"] == first)
    assert row["detection_balanced_accuracy"] is None and row["fuzz_balanced_accuracy"] is None and blanks >= 2
    assert data["unanswered"] == blanks
    assert by_id[first]["scores"]["detection"]["balanced_accuracy"] == 0  # the export: delphi's 0
    assert by_id[first]["scores"]["detection"]["answered"] == 0
    own, control = data["means"]
    assert expected[""]  # another feature was answered
    assert own["detection_balanced_accuracy"] == pytest.approx(statistics.mean(expected[""]))
    assert control["detection_balanced_accuracy"] == (pytest.approx(statistics.mean(expected["control_"]))
                                                      if expected["control_"] else None)
    table = explain(feats, latents, chat, "--max-features", 5, "--out", out, "-f", "tsv")  # resumed: no model
    assert table.exit_code == 0, table.output
    header, *lines = table.stdout.split("\n\n")[0].splitlines()
    cells = {c["feature"]: c for c in (dict(zip(header.split("\t"), line.split("\t"))) for line in lines)}
    assert cells[str(first)]["detection_balanced_accuracy"] == ""
    assert f"{blanks} scores left blank and out of the means" in table.stderr


def test_an_explainer_that_loops_is_cut_after_the_first_copy(made, tmp_path, monkeypatch):
    """Issue 60 follow-up: an explanation that repeats a phrase (the explainer looped up to --max-new-tokens) is
    kept once, said on stderr and in the record's ``loop``; the scorers read the cut text."""
    from anatomy_cli.analyses.explain_prompts import cut_loop
    from anatomy_cli.tasks import _explain_run

    _, _, feats, latents, chat = made
    unit, times = "the word ' cat',", 9
    looping = "Tokens like " + " ".join([unit] * times) + " the word"  # cut off mid-copy, as max tokens cut it
    prompts = []

    def ask(self, messages, max_new_tokens, temperature=0.0, seed=0):
        if messages[0]["content"].startswith("You are a meticulous AI researcher"):
            return f"[EXPLANATION]: {looping}"
        prompts.append(messages[-1]["content"])
        return answer(messages)

    monkeypatch.setattr(_explain_run.Chat, "ask", ask)
    result = explain(feats, latents, chat, "--max-features", 2, "--out", tmp_path / "o", "-f", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["explanations"]
    assert [r["description"] for r in records] == ["Tokens like the word ' cat'"] * 2
    assert [r["loop"] for r in records] == [{"repeated": unit, "times": times, "original_chars": len(looping)}] * 2
    assert result.stderr.count(f"says {unit!r} {times} times in a row (the explainer looped)") == 2
    assert prompts and all("Tokens like the word ' cat'\n" in p and p.count("word ' cat'") == 1 for p in prompts)
    plain = "The token ' the' before a noun, as in 'the cat, the dog'."  # no run said 4 times: kept whole
    assert cut_loop(plain) == (plain, None)
    assert cut_loop("a b a b a b a b a")[1] == {"repeated": "a b", "times": 4, "original_chars": 17}


@pytest.mark.parametrize("case, match", [
    ("plain dir", "is not a features output"),
    ("zero", "--max-features"),
    ("unknown model", "error:"),
    ("no cache", "holds no delphi latent cache (explain reads there where a feature does not fire): run the "
                 "features command again with --delphi added"),
])
def test_bad_input_is_one_line_before_any_model_loads(made, tmp_path, monkeypatch, case, match):
    import anatomy_cli.tasks._explain_run as explain_run

    _, _, feats, latents, chat = made
    monkeypatch.setattr(explain_run, "load_weights", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    args = {"plain dir": (tmp_path, "--explainer", chat),
            "zero": (feats, "--delphi", latents, "--explainer", chat, "--max-features", 0),
            "unknown model": (feats, "--delphi", latents, "--explainer", tmp_path / "no-such-model"),
            "no cache": (feats, "--explainer", chat)}[case]
    result = invoke("explain", *args, "--out", tmp_path / "o")
    assert result.exit_code in (1, 2), result.output
    assert match in result.output and "Traceback" not in result.output and "loaded" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.parametrize("option", ["--explainer", "--scorer"])
def test_a_hub_name_not_cached_offline_names_the_option_that_gave_it(made, tmp_path, empty_hf_cache, option):
    """Issue 60 follow-up: the offline refusal names --explainer or --scorer (it said "pass --model PATH", an
    option explain does not take), and offers no --init random (explain has none)."""
    _, _, feats, latents, chat = made
    name = "nobody/no-such-chat-model"
    given = ("--explainer", name) if option == "--explainer" else ("--explainer", chat, "--scorer", name)
    result = invoke("explain", feats, "--delphi", latents, *given, "--out", tmp_path / "o")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (f"error: {name} is not in the local Hugging Face cache and the Hub cannot be "
                                     f"reached; pass {option} PATH to a local checkpoint or .gguf file, or fetch it "
                                     f"once on a connected machine")


def test_the_python_api_returns_the_command_s_json(made, tmp_path, monkeypatch):
    import anatomy_cli.api as anatomy

    _, _, feats, latents, chat = made
    stand_in(monkeypatch)
    got = anatomy.explain(feats, explainer=str(chat), delphi=latents, max_features=2, out=tmp_path / "api",
                          device="cpu")
    cli = explain(feats, latents, chat, "--max-features", 2, "--out", tmp_path / "cli", "-f", "json")
    assert got.to_dict()["features"] == json.loads(cli.stdout)["features"]
    assert got.rows == got.to_dict()["features"] and got.records == tuple(got.to_dict()["explanations"])
    pd = pytest.importorskip("pandas")  # to_pandas(): one row per explained feature, a missing score NaN
    frame = got.to_pandas()
    assert isinstance(frame, pd.DataFrame) and frame["feature"].tolist() == [r["feature"] for r in got.rows]
    assert frame["description"].tolist() == [r["description"] for r in got.rows]
    for key in ("detection_balanced_accuracy", "control_fuzz_f1"):
        assert frame[key].dtype == "float64"
        assert [None if pd.isna(v) else v for v in frame[key]] == [r[key] for r in got.rows]


def test_a_plot_inside_a_fresh_out_dir_is_written(made, tmp_path, monkeypatch):
    """``explain FEATURES_DIR --out DIR --plot DIR/page.html`` with DIR not made yet: the export and the page are
    written there, the page holding each explanation the export holds."""
    import html

    _, _, feats, latents, chat = made
    stand_in(monkeypatch)
    out = tmp_path / "new" / "labels"
    result = explain(feats, latents, chat, "--max-features", 2, "--out", out, "--plot", out / "page.html")
    assert result.exit_code == 0, result.output
    export = json.loads((out / "explanations.json").read_text())
    page = (out / "page.html").read_text()
    assert len(export) == 2
    for record in export:
        assert json.dumps(record["description"])[1:-1] in page or html.escape(record["description"]) in page


@pytest.mark.parametrize("case, match", [
    ("missing", "explain reads what anatomy features DICT --corpus PATH --out {dir} --delphi {dir}/latents writes"),
    ("unfinished", "is an unfinished features run (the same features command again finishes it"),
    ("empty", "is not a features output (run anatomy features DICT --corpus PATH --out {dir} --delphi "
              "{dir}/latents first)"),
])
def test_a_dir_without_what_explain_reads_names_the_command_that_makes_it(made, tmp_path, case, match):
    _, _, feats, _, chat = made
    target = tmp_path / "dir"
    if case != "missing":
        target.mkdir()
    if case == "unfinished":  # a features run interrupted before its tables: its manifest, no features.parquet
        (target / "manifest.json").write_text((feats / "manifest.json").read_text())
    result = invoke("explain", target, "--explainer", chat)
    assert result.exit_code == 2, result.output
    assert match.format(dir=target) in result.output.replace("\n", " ")


def test_a_dictionary_or_a_busy_folder_is_offered_a_features_command_that_runs(made, tmp_path):
    """A new user passed the dictionary's folder to explain: the refusal offered `features ... --out` into that
    folder, which `features` refuses (not empty, no run). A dictionary is now offered as DICT, a folder holding
    other files never as --out; the offered command, run, makes what explain reads."""
    from anatomy_cli.tasks.explain import ExplainOptions
    from anatomy_cli.tasks.explain import read_dir

    model, _, _, _, chat = made
    sae = write_sae(tmp_path / "dict")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    result = invoke("explain", sae, "--explainer", chat)
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2 and f"{sae} is a dictionary, not a features output: explain reads what anatomy " \
        f"features {sae} --corpus PATH --out FEATS --delphi FEATS/latents writes into a new folder FEATS" in said
    assert f"--out {sae}" not in said
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    other = invoke("explain", busy, "--explainer", chat)
    assert other.exit_code == 2 and f"--out {busy}" not in other.stderr and "into a new folder FEATS" in other.stderr
    assert invoke("features", sae, "--corpus", corpus, "--model", model, "--ctx", 16, "--out", busy).exit_code == 2
    feats = tmp_path / "feats"  # the offered command, FEATS a new folder: explain reads it (no model loads)
    made_it = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                     "--out", feats, "--delphi", feats / "latents", "--format", "json")
    assert made_it.exit_code == 0, made_it.output
    assert read_dir(ExplainOptions(features_dir=feats, explainer=str(chat))).features


def test_a_folder_of_dictionaries_is_offered_a_features_command_with_hook(made, tmp_path):
    """A new user passed fit-sae --layer all's folder (one dictionary per block) to explain: the offered features
    command named the folder alone, which features refuses (it holds several). It now names its first block
    with --hook, and that --hook reads that block's dictionary (its weights, as written)."""
    import re

    import numpy as np
    from safetensors.numpy import load_file

    from anatomy_cli.models.sae.read import read

    _, _, _, _, chat = made
    multi = tmp_path / "multi"
    write_sae(multi / "layers.10", seed=1)
    first = write_sae(multi / "layers.2", seed=2)  # natural order: layers.2 before layers.10
    result = invoke("explain", multi, "--explainer", chat)
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2 and f"anatomy features {multi} --hook 2 --corpus PATH --out FEATS" in said, said
    hook = re.search(r"--hook (\S+)", said).group(1)
    written = load_file(str(first / "sae_weights.safetensors"))["W_enc"]
    np.testing.assert_array_equal(np.asarray(read(multi, hook=hook).W_enc), written)
    single = invoke("explain", first, "--explainer", chat)
    assert single.exit_code == 2 and "--hook" not in single.stderr


@pytest.mark.parametrize("n, said", [(1, "1 feature: at most 60 s"), (3, "3 features: at most 3 min")])
def test_the_cost_line_counts_its_features_in_number(n, said):
    """A new user read `1 features: at most 2 min`: the cost line counts its features as a noun of number, the
    total n features x the per-feature seconds."""
    from anatomy_cli.tasks._explain_cost import line

    c = {"prefill_s_per_token": 1e-3, "decode_s_per_token": 0.02, "per_feature_s": 60.0, "explain_prompt_tokens": 900,
         "explain_s": 20.0, "scorer_prompts": 4, "scorer_prompt_tokens": 800, "score_s": 40.0, "features": n,
         "total_s": n * 60.0}
    assert line(c, False).endswith(f"; {said}")
