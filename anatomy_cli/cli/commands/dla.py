"""`anatomy dla PROMPT --target TOKEN`: direct logit attribution to the embedding, layers and heads."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, warn
from anatomy_cli.cli.commands._common import (
    AllowSpecialOpt,
    BatchSizeOpt,
    BosOpt,
    PromptArg,
    TruncateOpt,
    describe,
    emit_prompts,
    load_prompts,
    model_label,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.options import (
    Device,
    DeviceMapOpt,
    DeviceOpt,
    DType,
    DTypeOpt,
    FirstTokenFoilOpt,
    FoilIdOpt,
    FoilOpt,
    FormatOpt,
    Init,
    InitOpt,
    MaxMemoryOpt,
    ModelOpt,
    OffloadFolderOpt,
    PlotOpt,
    TargetIdOpt,
    TargetOpt,
    TrustRemoteCodeOpt,
)
from anatomy_cli.errors import AnatomyError, UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.positions import check_position
from anatomy_cli.text.records import token_record


class By(str, Enum):
    layer = "layer"
    head = "head"


class Sort(str, Enum):
    model = "model"
    abs = "abs"
    value = "value"


COLUMNS = (
    Column("component", "component"), Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("contribution", "contribution", "float", 4), Column("bar", "", "signed_bar"),
)
NOTE = ("contribution = unembedding direction · final_norm_frozen(component), the final norm's scale frozen at its "
        "value for the final residual{centred} (TransformerLens's apply_ln_to_stack); L3 = block 3 (blocks.3.*); "
        "bias = final norm's bias and LM head bias; the rows add up to the model's own {what}")


@app.command("dla")
def dla_command(
    prompt: PromptArg,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    foil: FoilOpt = None,
    foil_id: FoilIdOpt = None,
    first_token: FirstTokenFoilOpt = False,
    position: Annotated[Optional[int], typer.Option(
        "--position", "-p", metavar="N", show_default=False,
        help="The position whose logit is decomposed (0-based; negative counts from the end). "
        "Default: the last.")] = None,
    by: Annotated[By, typer.Option("--by", case_sensitive=False,
                                   help="'head': one row per attention head (plus the output projection's "
                                   "bias) instead of one per attention layer.")] = By.layer,
    top: Annotated[Optional[int], typer.Option(
        "--top", "-k", min=1, metavar="N", show_default=False,
        help="Keep the N rows of largest |contribution|; the rest are summed into one 'other' row, so the "
        "rows still add up to the logit. Default: every row.")] = None,
    sort: Annotated[Sort, typer.Option(
        "--sort", case_sensitive=False,
        help="Row order: 'model' (embedding, blocks in order, bias), 'abs' (largest |contribution| first) or "
        "'value' (most positive first).")] = Sort.model,
    model: ModelOpt = "gpt2",
    device: DeviceOpt = Device.auto,
    dtype: DTypeOpt = DType.fp32,
    init: InitOpt = Init.pretrained,
    trust_remote_code: TrustRemoteCodeOpt = False,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_folder: OffloadFolderOpt = None,
    bos: BosOpt = None,
    allow_special: AllowSpecialOpt = False,
    truncate: TruncateOpt = None,
    batch_size: BatchSizeOpt = 8,
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Direct logit attribution: how much each component wrote the target's logit at one position.

    One row per contribution: the embedding (and position embedding), each layer's attention and
    MLP output (--by head: each head, plus the attention output projection's bias), and a final
    'bias' row. With --foil the rows explain logit(target) - logit(foil). The final norm's scale is
    frozen at its value for the final residual; the rows add up to the model's own logit (JSON
    'total' and 'logit'). Soft-capped models (Gemma 2) are decomposed before the soft-capping.

    Examples:

    \b
        anatomy dla "The capital of Germany is" --target " Berlin"
        anatomy dla "The capital of Germany is" --target " Berlin" --foil " Paris" --by head
        anatomy dla "Thank you very" --target-id 881 --format json
        anatomy dla "The capital of Germany is" --target " Berlin" --by head --top 10 --sort abs
    """
    wanted = targets.choice(target, target_id, first_token=first_token)
    if wanted is None:
        raise UsageError("dla needs a token: give --target TEXT or --target-id N")
    foiled = targets.choice(foil, foil_id, option="--foil", first_token=first_token)
    targets.check_first_token(first_token, wanted, foiled, options="--target or --foil")
    ids: dict[str, int] = {}

    def check(pre) -> None:
        from anatomy_cli.models.adapters import for_config

        adapter = for_config(pre.config)
        if not adapter.causal or adapter.post_ln:
            raise UsageError(f"dla needs a linear path from the residual stream to the logits; {pre.name} "
                             f"({adapter.name}) has a non-linear masked-LM head (dense, GELU, LayerNorm) after "
                             "post-LN blocks, so its logits are not a sum of per-component terms")
        check_position(position, pre.encoded)
        vocab = getattr(pre.config, "vocab_size", None)
        for key, choice in (("target", wanted), ("foil", foiled)):
            if choice is not None:
                ids[key] = targets.resolve(pre.tokenizer, choice, model=pre.name, vocab_size=vocab)

    spec = ModelSpec(model, device, dtype, init, trust_remote_code, device_map, max_memory, offload_folder)
    lm, encoded = load_prompts(prompt, spec, PromptOptions(bos, allow_special, truncate), check=check)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli import engine
    if not lm.has_unembed:
        raise UsageError(f"{lm.name} has no LM head (unembedding): there is no logit to attribute")
    if ids.get("foil") is not None and ids["foil"] == ids["target"]:
        raise UsageError("--foil is the same token as --target: their logit difference is 0 by definition")
    names = _names(lm, by)
    pos = -1 if position is None else position
    caches = engine.run(lm, encoded, names, positions=[[pos]] * len(encoded), batch_size=batch_size)
    direction, head_bias = _unembedding(lm, ids["target"], ids.get("foil"))
    name_token = describe(lm)
    reports = []
    for enc, cache in zip(encoded, caches):
        result = _attribute(lm, cache, by, direction, head_bias, ids["target"], ids.get("foil"))
        reports.append(_report(lm, enc, cache.positions[0], result.select(top, sort.value), ids, name_token, by))
        if plot:
            from anatomy_cli.output import plots

            what = f"logit({name_token(ids['target'])[0]})" + (
                f" − logit({name_token(ids['foil'])[0]})" if ids.get("foil") is not None else "")
            cap = plots.Caption.of("dla", lm, enc.text, f"position {cache.positions[0]} = "
                                   f"{enc.pieces[cache.positions[0]]}")
            plots.draw("dla", plot, len(reports) if prompt == "-" else None, result, lm.n_layers, lm.n_heads, what, cap)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _names(lm, by: By) -> list[str]:
    from anatomy_cli import engine

    names = engine.residual_names(lm)[:1] + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
    names += engine.residual_names(lm)[-1:]
    if "hook_pos_embed" in lm.points:
        names.append("hook_pos_embed")
    if by is By.head:
        names += [f"blocks.{layer}.attn.hook_z" for layer in range(lm.n_layers)]
    return names


def _unembedding(lm, target: int, foil: int | None):
    """The LM head as ``direction . x + bias`` on the final norm's output, for target (minus foil).

    The head (with OPT's project_out before it) is linear, so its row for a token is the gradient of
    that token's logit with respect to its input, and its bias is its output at 0. Returns
    (float64 [d_model], float). Raises AnatomyError when the head is not linear (soft-capping aside).
    """
    import torch

    head = lm.points["logits"][0]
    proj_path = getattr(lm.adapter, "unembed_proj", None)
    proj = None
    if proj_path:
        try:
            proj = lm.model.base_model.get_submodule(proj_path)
        except AttributeError:
            proj = None
    param = next(head.parameters())
    x = torch.zeros(2, lm.d_model, dtype=param.dtype, device=param.device if param.device.type != "meta" else lm.device)
    x[1].normal_(generator=torch.Generator(device=x.device).manual_seed(0))
    x.requires_grad_(True)
    with torch.enable_grad():
        out = head(proj(x) if proj is not None else x)
        out = out[0] if isinstance(out, tuple) else out
        score = out[:, target] - (out[:, foil] if foil is not None else 0)
        (grad,) = torch.autograd.grad(score[1], x)
    direction = grad[1].detach().to("cpu", torch.float64)
    bias = float(score[0].detach())
    linear = float(direction @ x[1].detach().to("cpu", torch.float64)) + bias
    if abs(linear - float(score[1].detach())) > 1e-3 * max(1.0, abs(linear)):
        raise AnatomyError(f"{lm.name}'s LM head is not linear: its logits are not a sum of per-component terms")
    return direction, bias


def _attribute(lm, cache, by: By, direction, head_bias: float, target: int, foil: int | None):
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses import dla as analysis

    comps, names = [], []
    embed = cache["resid_pre", 0][0]
    if "hook_pos_embed" in cache:
        pos_embed = cache["hook_pos_embed"][0]
        comps += [embed - pos_embed, pos_embed]
        names += [analysis.Component("embed"), analysis.Component("pos_embed")]
    else:
        comps.append(embed)
        names.append(analysis.Component("embed"))
    for layer in range(lm.n_layers):
        attn = cache["attn_out", layer][0]
        if by is By.head:
            o_proj = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer].get_submodule(lm.adapter.attn_o)
            heads, bias = analysis.head_outputs(cache[f"blocks.{layer}.attn.hook_z"][0], o_proj, lm.n_heads)
            has_bias = getattr(o_proj, "bias", None) is not None
            parts = torch.cat([heads, bias[None]]) if has_bias else heads
            analysis.check_sum(parts, attn, f"{lm.name}'s attention output in block {layer} is not the sum of "
                               "its heads through the output projection (a norm after attention?)")
            comps += list(parts)
            names += [analysis.Component(f"L{layer}.H{h}", layer, h) for h in range(lm.n_heads)]
            if has_bias:
                names.append(analysis.Component(f"L{layer}.attn_bias", layer))
        else:
            comps.append(attn)
            names.append(analysis.Component(f"L{layer}.attn", layer))
        comps.append(cache["mlp_out", layer][0])
        names.append(analysis.Component(f"L{layer}.mlp", layer))
    final = cache["resid_post", -1][0]
    stack = torch.stack([c.to("cpu", torch.float64) for c in comps])
    analysis.check_sum(stack, final, f"{lm.name}'s final residual is not the sum of the embedding and the "
                       "attention and MLP outputs (a norm after each sub-layer?)")
    norm = analysis.freeze_norm(lambda h: engine.final_norm(lm, h), final)
    logit = engine.unembed(lm, final[None], softcap=False)[0]
    own = float(logit[target]) - (float(logit[foil]) if foil is not None else 0.0)
    result = analysis.attribute(stack, names, norm=norm, direction=direction, head_bias=head_bias, logit=own)
    if abs(result.total - result.logit) > 1e-4 * max(abs(result.logit), 1.0):
        warn(f"the rows add up to {result.total:.6g}, the model's logit is {result.logit:.6g}: more than 1e-4 apart")
    return result


def _report(lm, enc, pos: int, result, ids: dict[str, int], name_token, by: By) -> Report:
    def token(i: int | None) -> dict[str, Any] | None:
        return None if i is None else token_record(i, *name_token(i))

    target, foil = token(ids["target"]), token(ids.get("foil"))
    data = {**prompt_record(lm, enc), "position": pos, "position_token": enc.pieces[pos], "target": target,
            "foil": foil, "by": by.value, **result.to_dict()}
    what = (f"logit({target['token']}) − logit({foil['token']})" if foil else f"logit({target['token']})")
    heading = [f"dla · {model_label(lm)} · {lm.n_layers} layers",
               f"{prompt_line(enc)} · position {pos} = {enc.pieces[pos]} · {what}"]
    biggest = max((abs(r["contribution"]) for r in data["rows"]), default=0.0) or 1.0
    rows = [{**r, "bar": r["contribution"] / biggest} for r in data["rows"]]
    notes = [NOTE.format(centred=", each contribution centred (LayerNorm)" if result.centred else "",
                         what="logit difference" if foil else "logit"),
             f"sum of rows {result.total:.6f} · model's {what} {result.logit:.6f}"]
    if result.other_rows:
        notes.insert(1, f"other = the sum of the {result.other_rows} rows outside the --top {len(rows) - 1}")
    return Report(data=data, sections=[Section(COLUMNS, rows, title="direct logit attribution")],
                  heading=heading, notes=notes)
