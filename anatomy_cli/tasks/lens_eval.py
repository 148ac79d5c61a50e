"""`lens-eval ITEMS.json`: jlens' lens-quality evaluation (pass@1/5/10), several lenses side by side (the task).

ITEMS is jlens' evaluation file, ``{"items": [{"prompt": TEXT, "intermediates": [WORD, ...]}, ...]}`` (other
keys are ignored); the set's name is the file's stem. Each prompt is read at its last token (a set whose name
contains ``poetry``: at its last newline token, as jlens reads its couplets). Blocks read per lens: the logit
lens every block below the last (jlens' default source blocks; the last block's reading is the model's own
output under every lens); a Jacobian lens its fitted blocks (its ``J`` keys, the last block left out); a tuned
lens the blocks with a translator (every block below the last). ``embed`` is never read. The metric is in
:mod:`anatomy_cli.analyses.lens_eval`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli import engine
from anatomy_cli.declare import shared
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.fields import Declared
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import lens_choice
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.lens import check_unembed_hash
from anatomy_cli.tasks.lens import fitted_lens
from anatomy_cli.tasks.session import warn_cost
from anatomy_cli.text.targets import single_token_forms
from anatomy_cli.units import counted

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.lens_eval import LensEval
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "lens-eval"
INPUTS = {"items": None}  # ITEMS (positional): the API's items


@dataclass(frozen=True)
class Item:
    """One evaluation item: a prompt and the words it should evoke (possibly none: not scored)."""

    prompt: str
    intermediates: tuple[str, ...]


@dataclass(frozen=True)
class LensEvalOptions(Declared):
    """``lens``: the lenses to compare (``logit``, ``tuned:DIR``, ``jacobian:FILE``; a text or several), each once,
    in the order shown. ``items``: the evaluation set, the command's input: a path to jlens' JSON file, or the
    loaded ``{"items": [...]}`` (or its list of items), checked here (None: not given yet: the CLI and the API build
    the options alone, then add ITEMS with ``dataclasses.replace``). ``name``: the set's name (the file's stem; a
    dict's ``"name"``, else ``eval``)."""

    lens: tuple[str, ...] = shared.lenses(("logit",), "A lens to compare; repeat for several, shown in this order "
                                          "(default: logit alone): logit, a tuned-lens directory (tuned:DIR) or a "
                                          "Jacobian lens file (jacobian:FILE).")
    batch_size: int = shared.batch_size()
    items: Any = None
    name: str = field(default="eval", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        given = (self.lens,) if isinstance(self.lens, str) else tuple(self.lens or ("logit",))
        lenses = tuple(lens_choice.parse(t).text for t in given)  # UsageError for a bad --lens
        twice = next((t for i, t in enumerate(lenses) if t in lenses[:i]), None)
        if twice is not None:
            raise UsageError(f"--lens {twice} is given twice: give each lens once")
        object.__setattr__(self, "lens", lenses)
        if self.items is None:
            return  # the options alone
        name, items = read_items(self.items)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "items", items)
        if not any(i.intermediates for i in items):
            raise UsageError(f"{name}: no item has intermediates: nothing to evaluate")

    @property
    def prompts(self) -> list[str]:
        """The scored items' prompts, in order (an item without intermediates is not run)."""
        return [i.prompt for i in self.items if i.intermediates]


def read_items(source: object) -> tuple[str, tuple[Item, ...]]:
    """``(name, items)`` from jlens' evaluation file (a path), its loaded dict, or its list of items. Raises
    UsageError (one line) for a missing or unreadable file, bad JSON, no ``items``, no item, an item without a
    ``prompt`` (a non-empty text) or ``intermediates`` (a list of non-empty texts)."""
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        where = str(source)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"ITEMS: {where} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"ITEMS: cannot read {where} ({exc})") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            line = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise UsageError(f"ITEMS: {where} is not JSON ({msg}{line})") from None
        name = path.stem
    else:
        data, where = source, "items"
        name = str(source.get("name", "eval")) if isinstance(source, dict) else "eval"
    rows = data.get("items") if isinstance(data, dict) else data if isinstance(source, (list, tuple)) else None
    if not isinstance(rows, (list, tuple)):
        raise UsageError(f'{where}: expected {{"items": [{{"prompt": ..., "intermediates": [...]}}, ...]}} '
                         "(jlens' evaluation format)")
    if not rows:
        raise UsageError(f'{where}: "items" is empty: nothing to evaluate')
    return name, tuple(_item(row, i, where) for i, row in enumerate(rows, start=1))


def _item(row: object, i: int, where: str) -> Item:
    if isinstance(row, Item):
        return row
    if not isinstance(row, dict):
        raise UsageError(f"{where}: item {i} is a {type(row).__name__}, not an object with prompt and intermediates")
    for key in ("prompt", "intermediates"):
        if key not in row:
            raise UsageError(f'{where}: item {i} has no "{key}"')
    prompt, words = row["prompt"], row["intermediates"]
    if not isinstance(prompt, str) or not prompt:
        raise UsageError(f'{where}: item {i}: "prompt" must be a non-empty text')
    if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w for w in words):
        raise UsageError(f'{where}: item {i}: "intermediates" must be a list of non-empty texts')
    return Item(prompt, tuple(words))


@dataclass(frozen=True)
class LensEvalPlan:
    fitted: tuple[FittedLens | None, ...]  # per lens (None: the logit lens)
    blocks: tuple[tuple[int, ...], ...]  # per lens, the blocks it reads
    forms: dict[str, tuple[int, ...]]  # each intermediate's single-token forms


def labels(lenses: tuple[str, ...]) -> tuple[str, ...]:
    """The JSON keys and tsv columns naming the lenses: their kinds (``logit``, ``jacobian``, ``tuned``), a kind
    given again numbered from its second (``jacobian_2``)."""
    kinds = [t.partition(":")[0] for t in lenses]
    return tuple(k if kinds[:i].count(k) == 0 else f"{k}_{kinds[:i].count(k) + 1}" for i, k in enumerate(kinds))


def lens_blocks(fitted: FittedLens | None, n_layers: int) -> tuple[int, ...]:
    """The blocks a lens reads (see the module's docstring): rows the lens maps, less ``embed`` and the last."""
    if fitted is None:
        return tuple(range(n_layers - 1))
    return tuple(row - 1 for row in fitted.rows if row in fitted.weights and 1 <= row < n_layers)


def check(opened: Opened, opts: LensEvalOptions) -> LensEvalPlan:
    """``opened``: an OpenedModel or a LoadedModel. Refuses a model without an LM head or that is no decoder, one
    of a single block, a lens for another model, a lens reading no block below the last; says (not fatal) which
    intermediates have no single-token form and how many items have none."""

    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    n_layers = opened.info.n_layers
    if n_layers < 2:
        raise UsageError(f"{opened.name} has one block: {COMMAND} reads the blocks below the last, and it has none")
    fitted = tuple(fitted_lens(opened, text, command=COMMAND) for text in opts.lens)
    blocks = tuple(lens_blocks(f, n_layers) for f in fitted)
    for text, read in zip(opts.lens, blocks):
        if not read:
            raise UsageError(f"--lens {text} reads no block below the last ({n_layers - 1}): nothing to evaluate")
    forms = {w: single_token_forms(opened.tokenizer, w) for i in opts.items for w in i.intermediates}
    missing = [w for w, ids in forms.items() if not ids]
    if missing:
        shown = ", ".join(repr(w) for w in missing[:5]) + (", ..." if len(missing) > 5 else "")
        notes.warn(f"{len(missing)} of {len(forms)} intermediates have no single-token form for {opened.name} "
                   f"(as given, with a leading space, capitalised): {shown}; they count as misses, as in jlens")
    skipped = sum(not i.intermediates for i in opts.items)  # not all: the options refuse that
    if skipped:
        notes.warn(f"{skipped} of {len(opts.items)} items have no intermediates: not scored (as in jlens)")
    return LensEvalPlan(fitted, blocks, forms)


def readout(enc: Encoded, name: str) -> int:
    """The position read (0-based): the last token; for a ``poetry`` set the last token holding a newline.
    Raises UsageError for a poetry prompt without a newline."""
    if "poetry" not in name:
        return len(enc) - 1
    lines = [i for i, piece in enumerate(enc.token_bytes) if b"\n" in piece]
    if not lines:
        raise UsageError(f"{name}: a poetry prompt has no newline token to read at: {enc.text[:40]!r}")
    return lines[-1]


def run(lm: LoadedModel, encoded: list[Encoded], opts: LensEvalOptions, plan: LensEvalPlan) -> LensEval:
    """``encoded``: :attr:`LensEvalOptions.prompts`, encoded. Ranks every intermediate under every lens."""
    analysis = when_run("analyses.lens_eval")

    for fitted in plan.fitted:
        if fitted is not None:
            check_unembed_hash(lm, fitted)
    warn_cost(f"lens-eval on {counted(len(encoded), 'prompt')}", lm,
              sum(cost.forward_flops(lm.info, len(e)) for e in encoded))
    positions = [readout(enc, opts.name) for enc in encoded]
    with notes.status(f"running {lm.name} on {counted(len(encoded), 'prompt')}"):
        caches = engine.run(lm, encoded, engine.residual_names(lm), positions=[[p] for p in positions],
                            batch_size=opts.batch_size)
    scored = [i for i in opts.items if i.intermediates]
    items = []
    with notes.status("lens-eval") as line:
        count = line.counter("lens-eval", "items")
        for n, (item, cache, pos) in enumerate(zip(scored, caches, positions), start=1):
            resid = cache.residual_stream()  # [n_layers + 1, 1, d_model]
            logits = [_read(lm, resid, f, b) for f, b in zip(plan.fitted, plan.blocks)]
            words = []
            for word in item.intermediates:
                best = [analysis.best_rank(x, plan.forms[word], b) for x, b in zip(logits, plan.blocks)]
                words.append(analysis.WordScore(word, plan.forms[word], tuple(r for r, _ in best),
                                                tuple(b for _, b in best)))
            items.append(analysis.ItemScore(item.prompt, pos, tuple(words)))
            count(n, len(scored))
    return analysis.LensEval(opts.name, opts.lens, labels(opts.lens), plan.blocks, tuple(items),
                             skipped=len(opts.items) - len(scored))


def _read(lm: LoadedModel, resid: torch.Tensor, fitted: FittedLens | None, blocks: tuple[int, ...]) -> torch.Tensor:
    """``[len(blocks), vocab]`` float32 logits: each of ``blocks`` read at the kept position through the lens
    (``fitted`` None: the logit lens)."""
    if fitted is None:
        h = resid[[b + 1 for b in blocks]]
    else:
        mapped = fitted.transform(resid)  # [len(fitted.rows), 1, d_model]
        h = mapped[[fitted.rows.index(b + 1) for b in blocks]]
    return engine.unembed(lm, h)[:, 0].float()
