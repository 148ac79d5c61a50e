"""circuit-tracer 0.5.0 as the reference for ``anatomy circuit``: run with circuit-tracer's own Python (its venv pins
transformers 4.57.3 and nnsight), never imported by the test suite. tests/test_circuit_reference.py runs it as a
subprocess.

``write``: (``--kind plt``, the default) seeded random per-layer transcoders in circuit-tracer's ``transcoder_set``
layout (``config.yaml`` + ``layer_{i}.safetensors`` with ``W_enc [F, d]``, ``W_dec [F, d]``, ``b_enc``, ``b_dec``;
JumpReLU's ``activation_function.threshold`` on even layers, plain ReLU on odd ones), for the model directory MODEL
(``anatomy convert`` of the SmolLM2 GGUF); ``--kind clt``: a seeded random cross-layer transcoder in circuit-tracer's
``load_clt`` layout (JumpReLU on every layer, decoders ``W_dec_{l} [F, L - l, d]``). The model directory is read
through a copy of its config that transformers 4.57 reads (``rope_theta`` from transformers 5's ``rope_parameters``).

``attribute``: (``write`` first where OUT has no transcoders) circuit-tracer's ``attribute(...)`` on the prompt, then its ``prune_graph``, ``compute_graph_scores`` and
``create_graph_files``; writes ``ct-graph.pt`` (``Graph.to_pt``), ``ct.json`` (the graph JSON), and ``reference.pt``:
every result as plain tensors, ints and strings, which torch.load reads without circuit-tracer (the test's side).

``check GRAPH.pt``: ``Graph.from_pt`` on a graph another tool wrote, then the same pruning, scores and JSON, into
``check.pt`` / ``check.json``: what circuit-tracer itself makes of anatomy's file.

    python circuit_tracer_ref.py write --model DIR --out OUT [--features 64 --seed 0 --kind plt|clt]
    python circuit_tracer_ref.py attribute --model DIR --out OUT --prompt TEXT [--max-feature-nodes 64 ...]
        [--check GRAPH.pt]
    python circuit_tracer_ref.py check --model DIR --out OUT GRAPH.pt
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

FEATURE_INPUT_HOOK = "mlp.hook_in"
FEATURE_OUTPUT_HOOK = "mlp.hook_out"


def v4_model_dir(model: Path, out: Path) -> Path:
    """A directory transformers 4.57 loads as MODEL: its files linked; config.json with ``rope_theta`` and
    tokenizer_config.json with a tokenizer class 4.57 knows (both as transformers 5 wrote them otherwise)."""
    target = out / "model-v4"
    if target.is_dir():
        return target
    target.mkdir(parents=True)
    for f in model.iterdir():
        if f.name not in ("config.json", "tokenizer_config.json", "model.safetensors"):
            (target / f.name).symlink_to(f.resolve())
    link_weights(model / "model.safetensors", target)
    tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    for key in ("backend", "is_local", "local_files_only"):  # transformers 5's own entries
        tokenizer.pop(key, None)
    tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"  # v5's "TokenizersBackend" is unknown to 4.57
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    config = json.loads((model / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def link_weights(weights: Path, target: Path) -> None:
    """``weights`` as shard 1 of 2 (a link); shard 2 holds the tied tensors that safetensors stored once under another
    name (the file's ``__metadata__`` maps them), which transformers 4.57 does not re-tie by itself."""
    from safetensors import safe_open

    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (target / first).symlink_to(weights.resolve())
    with safe_open(str(weights), "pt") as f:
        keys, aliases = list(f.keys()), {k: v for k, v in (f.metadata() or {}).items() if v in f.keys()}
        save_file({name: f.get_tensor(source).contiguous() for name, source in aliases.items()}, str(target / second))
    weight_map = {k: first for k in keys} | {k: second for k in aliases}
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_transcoders(model: Path, out: Path, n_features: int, seed: int, decoder_scale: float = 0.05) -> Path:
    """Seeded random transcoders, one per block: ``out/transcoders/{config.yaml, layer_i.safetensors}``."""
    config = json.loads((model / "config.json").read_text())
    d, n_layers = config["hidden_size"], config["num_hidden_layers"]
    folder = out / "transcoders"
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    paths = []
    for layer in range(n_layers):
        tensors = {
            "W_enc": torch.randn(n_features, d, generator=gen) / 3,  # pre-activations ~ N(0, 1): mlp_in norms are ~3
            "W_dec": torch.randn(n_features, d, generator=gen) * decoder_scale,
            "b_enc": -1.5 - 0.5 * torch.rand(n_features, generator=gen),
            "b_dec": torch.randn(d, generator=gen) * 0.01,
        }
        if layer % 2 == 0:  # JumpReLU on even layers: x * (x > threshold)
            tensors["activation_function.threshold"] = 0.2 * torch.rand(n_features, generator=gen)
        path = folder / f"layer_{layer}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        paths.append(str(path.resolve()))
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "model_name": str(model), "model_kind": "transcoder_set", "feature_input_hook": FEATURE_INPUT_HOOK,
        "feature_output_hook": FEATURE_OUTPUT_HOOK, "scan": f"random-plt-seed{seed}", "transcoders": paths}))
    return folder


def write_clt(model: Path, out: Path, n_features: int, seed: int, decoder_scale: float = 0.05) -> Path:
    """A seeded random cross-layer transcoder in circuit-tracer's ``load_clt`` layout
    (``CrossLayerTranscoder.to_safetensors``): ``out/transcoders/W_enc_{l}.safetensors`` (``W_enc_l [F, d]``,
    ``b_enc_l``, ``b_dec_l``, JumpReLU ``threshold_l``), ``W_dec_{l}.safetensors`` (``W_dec_l [F, L - l, d]``) and a
    config.yaml with ``model_kind: cross_layer_transcoder``."""
    config = json.loads((model / "config.json").read_text())
    d, n_layers = config["hidden_size"], config["num_hidden_layers"]
    folder = out / "transcoders"
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(n_layers):
        save_file({f"W_enc_{layer}": torch.randn(n_features, d, generator=gen) / 3,
                   f"b_enc_{layer}": -1.5 - 0.5 * torch.rand(n_features, generator=gen),
                   f"b_dec_{layer}": torch.randn(d, generator=gen) * 0.01,
                   f"threshold_{layer}": 0.2 * torch.rand(n_features, generator=gen)},
                  str(folder / f"W_enc_{layer}.safetensors"))
        w_dec = torch.randn(n_features, n_layers - layer, d, generator=gen) * decoder_scale / (n_layers - layer) ** .5
        save_file({f"W_dec_{layer}": w_dec.contiguous()}, str(folder / f"W_dec_{layer}.safetensors"))
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "model_name": str(model), "model_kind": "cross_layer_transcoder", "feature_input_hook": FEATURE_INPUT_HOOK,
        "feature_output_hook": FEATURE_OUTPUT_HOOK, "scan": f"random-clt-seed{seed}"}))
    return folder


def load_reference_transcoders(folder: Path):
    """circuit-tracer's own loader: ``load_transcoders`` for a transcoder_set; ``load_clt`` (lazy decoders, its
    default) for a local cross-layer folder (``load_transcoders`` fetches CLTs from the Hub only)."""
    from circuit_tracer.utils.hf_utils import load_transcoders

    config = yaml.safe_load((folder / "config.yaml").read_text())
    if config["model_kind"] == "cross_layer_transcoder":
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        return load_clt(str(folder), feature_input_hook=config["feature_input_hook"],
                        feature_output_hook=config["feature_output_hook"], scan=config["scan"],
                        device=torch.device("cpu"), dtype=torch.float32)
    return load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32)


def replacement_model(model: Path, out: Path):
    from circuit_tracer import ReplacementModel

    transcoders = load_reference_transcoders(out / "transcoders")
    return ReplacementModel.from_pretrained_and_transcoders(
        str(v4_model_dir(model, out)), transcoders, backend="nnsight", device=torch.device("cpu"),
        dtype=torch.float32)


def plain(graph, node_threshold: float, edge_threshold: float) -> dict:
    """The graph, its pruning and its scores as tensors and builtins only (readable without circuit-tracer)."""
    from circuit_tracer.graph import compute_graph_scores
    from circuit_tracer.graph import prune_graph

    pruned = prune_graph(graph, node_threshold=node_threshold, edge_threshold=edge_threshold)
    replacement, completeness = compute_graph_scores(graph)
    return {
        "input_string": graph.input_string, "input_tokens": graph.input_tokens.cpu(),
        "adjacency_matrix": graph.adjacency_matrix.cpu(), "active_features": graph.active_features.cpu(),
        "selected_features": graph.selected_features.cpu(), "activation_values": graph.activation_values.cpu(),
        "logit_ids": [int(t.vocab_idx) for t in graph.logit_targets],
        "logit_strings": [t.token_str for t in graph.logit_targets],
        "logit_probabilities": graph.logit_probabilities.cpu(), "vocab_size": int(graph.vocab_size),
        "n_layers": int(graph.cfg.n_layers), "scan": graph.scan,
        "node_mask": pruned.node_mask.cpu(), "edge_mask": pruned.edge_mask.cpu(),
        "cumulative_scores": pruned.cumulative_scores.cpu(),
        "replacement_score": float(replacement), "completeness_score": float(completeness),
        "node_threshold": node_threshold, "edge_threshold": edge_threshold,
    }


def write_json(graph, out: Path, slug: str, node_threshold: float, edge_threshold: float) -> None:
    from circuit_tracer.utils.create_graph_files import create_graph_files

    create_graph_files(graph, slug=slug, output_path=str(out), node_threshold=node_threshold,
                       edge_threshold=edge_threshold)


def attribute_command(args) -> None:
    from circuit_tracer import attribute
    from circuit_tracer.graph import Graph

    if not (args.out / "transcoders" / "config.yaml").is_file():  # `write` folded in: one process start less
        WRITERS[args.kind](args.model, args.out, args.features, args.seed, args.decoder_scale)
    start = time.perf_counter()
    model = replacement_model(args.model, args.out)
    loaded = time.perf_counter()
    graph = attribute(args.prompt, model, max_n_logits=args.max_n_logits, desired_logit_prob=args.desired_logit_prob,
                      batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes,
                      update_interval=args.update_interval)
    done = time.perf_counter()
    graph.to_pt(str(args.out / "ct-graph.pt"))
    record = plain(graph, args.node_threshold, args.edge_threshold)
    again = plain(Graph.from_pt(str(args.out / "ct-graph.pt")), args.node_threshold, args.edge_threshold)
    record["roundtrip_equal"] = all(torch.equal(again[k], record[k]) if isinstance(record[k], torch.Tensor)
                                    else again[k] == record[k] for k in record)
    record.update(load_s=loaded - start, attribute_s=done - loaded,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    torch.save(record, args.out / "reference.pt")
    write_json(graph, args.out, "ct", args.node_threshold, args.edge_threshold)
    print(json.dumps({k: record[k] for k in ("load_s", "attribute_s", "peak_rss_mb", "replacement_score",
                                             "completeness_score")}))
    if args.check is not None:  # `check` folded in too: another tool's graph of the same run
        args.graph = args.check
        check_command(args)


def check_command(args) -> None:
    from circuit_tracer.graph import Graph

    graph = Graph.from_pt(str(args.graph))
    # create_graph_files loads the tokenizer by cfg.tokenizer_name: another tool may name the model its own way
    graph.cfg.tokenizer_name = str(v4_model_dir(args.model, args.out))
    torch.save(plain(graph, args.node_threshold, args.edge_threshold), args.out / "check.pt")
    write_json(graph, args.out, "check", args.node_threshold, args.edge_threshold)


WRITERS = {"plt": write_transcoders, "clt": write_clt}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("write", "attribute", "check"):
        p = sub.add_parser(name)
        p.add_argument("--model", type=Path, required=True)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--node-threshold", type=float, default=0.8)
        p.add_argument("--edge-threshold", type=float, default=0.98)
        if name in ("write", "attribute"):
            p.add_argument("--features", type=int, default=64)
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--decoder-scale", type=float, default=0.05)
            p.add_argument("--kind", choices=sorted(WRITERS), default="plt")
        if name == "attribute":
            p.add_argument("--prompt", required=True)
            p.add_argument("--max-n-logits", type=int, default=10)
            p.add_argument("--desired-logit-prob", type=float, default=0.95)
            p.add_argument("--batch-size", type=int, default=8)
            p.add_argument("--max-feature-nodes", type=int, default=64)
            p.add_argument("--update-interval", type=int, default=4)
            p.add_argument("--check", type=Path, metavar="GRAPH.pt", help="then `check GRAPH.pt` in the same process")
        if name == "check":
            p.add_argument("graph", type=Path)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "write":
        print(WRITERS[args.kind](args.model, args.out, args.features, args.seed, args.decoder_scale))
    elif args.command == "attribute":
        attribute_command(args)
    else:
        check_command(args)


if __name__ == "__main__":
    main(sys.argv[1:])
