"""Feature labels wherever a feature appears (issue 60 item 3): `sae`, `generate --steer-feature` and `circuit` read
explanations.json beside the dictionary by default, a `features --out` folder's with `--features-dir` (its top
promoted tokens marked as top tokens where a feature has no label, its dashboard page linked), and `--labels` given
explicitly wins. The labels are checked against the export written here; the top tokens against the `features`
run's own logit effects."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from test_features import TEXT
from test_features import invoke
from test_features import write_sae

PROMPT = "The cat sat on the mat"


def export(labels: dict[int, str], layer: str = "0-res") -> list[dict[str, str]]:
    """A Neuronpedia explanations export (what `explain` writes as explanations.json)."""
    return [{"modelId": "tiny", "layer": layer, "index": str(f), "description": d, "explanationModelName": "test"}
            for f, d in labels.items()]


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_model_dir):
    """``(model, sae, feats, features JSON)``: a `features --out feats --plot feats/features.html` run on the tiny
    GPT-2, with feats/explanations.json labelling features 2 and 3."""
    root = tmp_path_factory.mktemp("labels")
    model = tiny_model_dir("gpt2")
    sae = write_sae(root / "sae")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT)
    feats = root / "feats"
    feats.mkdir()  # --plot checks its folder before the pass makes --out
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--max-tokens", 64, "--out", feats, "--plot", feats / "features.html", "--format", "json")
    assert result.exit_code == 0, result.output
    (feats / "explanations.json").write_text(json.dumps(export({2: "cats and mats", 3: "warm things"})))
    return model, sae, feats, json.loads(result.stdout)


def top_tokens(data: dict, feature: int) -> str:
    from anatomy_cli.text.display import visible

    rows = [r for r in data["logit_effects"] if r["feature"] == feature and r["side"] == "top" and r["rank"] < 3]
    return " ".join(visible(r["token"]) for r in sorted(rows, key=lambda r: r["rank"]))


def sae_json(model, sae, *more) -> dict:
    result = invoke("sae", PROMPT, "--sae", sae, "--model", model, "--device", "cpu", "--top", 24, "--feature", 2,
                    "--feature", 5, "--format", "json", *more)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_sae_labels_from_features_dir_with_top_tokens_marked(made):
    model, sae, feats, data = made
    out = sae_json(model, sae, "--features-dir", feats)
    labels = {2: "cats and mats", 3: "warm things"}
    assert out["label_source"] == f"{feats / 'explanations.json'} (--features-dir)"
    for row in out["top_features"]:
        f = row["feature"]
        want = labels.get(f) or (f"top tokens: {top_tokens(data, f)}" if top_tokens(data, f) else None)
        assert row["label"] == want, f
    assert [s["label"] for s in out["features"]] == ["cats and mats", f"top tokens: {top_tokens(data, 5)}"]
    table = invoke("sae", PROMPT, "--sae", sae, "--model", model, "--device", "cpu", "--feature", 2,
                   "--features-dir", feats, "--format", "table")
    assert "cats and mats" in table.stdout and "(--features-dir)" in table.stdout


def test_sae_plot_hover_carries_the_labels_and_marked_top_tokens(made, tmp_path):
    from anatomy_cli.output.html import esc

    model, sae, feats, data = made
    page = tmp_path / "sae.html"
    result = invoke("sae", PROMPT, "--sae", sae, "--model", model, "--device", "cpu", "--feature", 2, "--feature", 5,
                    "--features-dir", feats, "--plot", page, "--format", "json")
    assert result.exit_code == 0, result.output
    html = re.sub(r"\\u([0-9a-f]{4})", lambda m: chr(int(m.group(1), 16)), page.read_text())  # plotly's escapes
    assert "feature 2<br>label: cats and mats<br>" in html
    assert f"feature 5<br>label: {esc(f'top tokens: {top_tokens(data, 5)}')}<br>" in html


def test_sae_reads_explanations_beside_the_dictionary_and_labels_wins(made, tmp_path):
    model, sae, _, _ = made
    beside = tmp_path / "sae"
    shutil.copytree(sae, beside)
    (beside / "explanations.json").write_text(json.dumps(export({2: "beside label"})))
    out = sae_json(model, beside)
    assert out["features"][0]["label"] == "beside label" and out["features"][1]["label"] is None
    assert out["label_source"] == f"{beside / 'explanations.json'} (beside the dictionary)"
    given = tmp_path / "given.json"
    given.write_text(json.dumps(export({2: "given label"})))
    out = sae_json(model, beside, "--labels", given)
    assert out["features"][0]["label"] == "given label" and out["label_source"] == f"--labels {given}"
    plain = sae_json(model, sae)  # nothing beside, nothing given: no label invented
    assert "label_source" not in plain and all(r["label"] is None for r in plain["features"])


def test_generate_names_the_steered_feature_by_its_label(made, tmp_path):
    model, sae, feats, _ = made
    base = ("generate", PROMPT, "--model", model, "--device", "cpu", "--max-new-tokens", 2, "--steer-feature", 2,
            "--sae", sae, "--coef", 2)
    result = invoke(*base, "--features-dir", feats, "--format", "json")
    assert result.exit_code == 0, result.output
    steer = json.loads(result.stdout)["steer"]
    assert steer["label"] == "cats and mats" and steer["label_source"].endswith("(--features-dir)")
    assert steer["link"] == (feats / "features.html").resolve().as_uri() + "#f-2"
    table = invoke(*base, "--features-dir", feats, "--format", "table")
    assert "SAE feature 2 (cats and mats)" in table.stdout
    given = tmp_path / "given.json"
    given.write_text(json.dumps(export({2: "given label"})))
    steer = json.loads(invoke(*base, "--labels", given, "--format", "json").stdout)["steer"]
    assert steer["label"] == "given label" and steer["label_source"] == f"--labels {given}"
    assert "label" not in json.loads(invoke(*base, "--format", "json").stdout)["steer"]


def test_a_features_dir_of_another_dictionary_is_refused(made, tmp_path):
    model, _, feats, _ = made
    other = write_sae(tmp_path / "other")
    cfg = json.loads((other / "cfg.json").read_text())
    cfg["metadata"]["hook_name"] = "blocks.1.hook_resid_post"
    (other / "cfg.json").write_text(json.dumps(cfg))
    result = invoke("sae", PROMPT, "--sae", other, "--model", model, "--features-dir", feats)
    assert result.exit_code == 2 and "describes a dictionary at blocks.0.hook_resid_post" in result.stderr
    result = invoke("sae", PROMPT, "--sae", other, "--model", model, "--features-dir", tmp_path)
    assert result.exit_code == 2 and ": no manifest.json (a folder that anatomy features --out wrote)" in result.stderr


def test_a_features_dir_of_another_dictionary_at_the_same_hook_point_is_refused(made, tmp_path):
    """Another dictionary at blocks.0.hook_resid_post (another seed: other features behind the same ids): the
    export's ids would name other features, so sae refuses it as circuit does; the export's own dictionary,
    named by another path to the same folder, is taken."""
    model, sae, feats, _ = made
    other = write_sae(tmp_path / "other", seed=1)
    assert json.loads((other / "cfg.json").read_text())["metadata"]["hook_name"] == "blocks.0.hook_resid_post"
    result = invoke("sae", PROMPT, "--sae", other, "--model", model, "--features-dir", feats)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (f"error: --features-dir {feats}: made from {sae.resolve()}, not from "
                                     f"{other.resolve()}: its feature ids name another dictionary's features; run "
                                     f"features on {other.resolve()}")
    (tmp_path / "link").symlink_to(sae)
    assert invoke("sae", PROMPT, "--sae", tmp_path / "link", "--model", model, "--features-dir", feats).exit_code == 0
    moved = tmp_path / "moved"  # an export whose dictionary is gone: judged by the path it recorded
    moved.mkdir()
    (moved / "manifest.json").write_text(json.dumps({"settings": {"sae": str(tmp_path / "gone")}}))
    result = invoke("sae", PROMPT, "--sae", sae, "--model", model, "--features-dir", moved)
    assert result.exit_code == 2 and f"made from {(tmp_path / 'gone').resolve()} (no longer there), not from " \
        f"{sae.resolve()}" in result.stderr, result.output



def test_a_file_there_but_corrupt_exits_1_as_a_corrupt_model_and_a_missing_one_2(made, tmp_path):
    """docs/output.md's rule, one for features, sae and explain: a file the user named that is there but cannot be
    read is a runtime error, exit 1, as a .gguf without its magic is (CheckpointError); a path that names nothing
    (or no such file in a folder) is a usage error, exit 2. A new user's trial found a truncated dictionary at 1
    and a corrupt --features-dir manifest at 2."""
    model, sae, feats, _ = made
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"not a gguf at all")
    truncated = tmp_path / "truncated"
    shutil.copytree(sae, truncated)
    weights = truncated / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    bad = tmp_path / "bad-feats"
    shutil.copytree(feats, bad)
    (bad / "manifest.json").write_text('{"settings": ')
    bare = tmp_path / "bare"
    bare.mkdir()
    codes = {
        "a corrupt model": (1, ["sae", PROMPT, "--sae", sae, "--model", gguf]),
        "a truncated dictionary (sae)": (1, ["sae", PROMPT, "--sae", truncated, "--model", model]),
        "a truncated dictionary (features)": (1, ["features", truncated, "--corpus", corpus, "--model", model]),
        "a corrupt --features-dir manifest": (1, ["sae", PROMPT, "--sae", sae, "--model", model,
                                                  "--features-dir", bad]),
        "a corrupt features manifest (explain)": (1, ["explain", bad, "--explainer", model]),
        "no dictionary there": (2, ["sae", PROMPT, "--sae", tmp_path / "none", "--model", model]),
        "no manifest in --features-dir": (2, ["sae", PROMPT, "--sae", sae, "--model", model, "--features-dir", bare]),
        "no features output there (explain)": (2, ["explain", tmp_path / "none", "--explainer", model]),
    }
    for what, (code, argv) in codes.items():
        result = invoke(*argv)
        lines = result.stderr.strip().splitlines()
        assert (result.exit_code, len(lines)) == (code, 1) and lines[0].startswith("error: "), (what, result.output)


def test_a_features_dir_that_is_not_there_is_said_so(made, tmp_path):
    """A new user's mistyped --features-dir read `no manifest.json`, as if the folder were there: a path that is
    not there, or a file, is said to be so (exit 2), and only a folder is asked for its manifest."""
    model, sae, _, _ = made
    missing, a_file = tmp_path / "nosuchdir", tmp_path / "a.txt"
    a_file.write_text("x")
    for path, said in ((missing, "no such folder"), (a_file, "not a folder")):
        assert path.is_dir() is False
        result = invoke("sae", PROMPT, "--sae", sae, "--model", model, "--features-dir", path)
        assert result.exit_code == 2 and f"--features-dir {path}: {said} (a folder that anatomy features --out " \
            "wrote)" in " ".join(result.stderr.split()), result.stderr
        assert "manifest.json" not in result.stderr
