"""`patch`: activation patching from CLEAN into CORRUPT over one site's layer x position (or head) grid."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.declare.inputs import Arg
from anatomy_cli.declare.inputs import Inputs
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import _attribution
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._attribution import Extra
from anatomy_cli.tasks._attribution import Method
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks._attribution import check_option
from anatomy_cli.tasks._attribution import check_options
from anatomy_cli.tasks._attribution import method_option
from anatomy_cli.tasks.session import warn_cost

if TYPE_CHECKING:
    from anatomy_cli.analyses.patch import Patching
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "patch"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Activation patching: run CORRUPT, and at one site, layer and position replace the activation
with CLEAN's; one patched run per cell of the grid.

Each cell is (m - m_corrupt) / (m_clean - m_corrupt) at the last position, where m is
logit(target) - logit(foil), or the target's logit without --foil: 0 = the corrupt run,
1 = the clean run. The patched runs go in batches of --batch-size, each starting from the
corrupt run's activations at the patched layer. --method attribution estimates every cell
at once from one backward (attribution patching); --check N reruns the N largest exactly.

Examples:

\b
    anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
        --target " Paris" --foil " Rome" -m SmolLM2-135M-Instruct.Q4_1.gguf
    anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
        --target " Paris" --foil " Rome" --site head --format json
    anatomy patch CLEAN CORRUPT --target " Paris" --foil " Rome" --site head --method attribution --check 10
"""
API_HELP = """`anatomy patch`: activation patching from CLEAN into CORRUPT at every (layer, position) of ``site``
(``head``: every (layer, head)); value = (m - m_corrupt) / (m_clean - m_corrupt). ``result``: Patching;
rows: ``cells``."""

# Two prompts of one length, one result for the pair; no --truncate (it would cut them apart).
TAKES = Inputs((Arg("clean", "CLEAN", "The prompt whose activations are copied in."),
                Arg("corrupt", "CORRUPT", "The prompt that is run and patched; same token count as CLEAN.")),
               truncate=False, whole=True)


class PatchSite(str, Enum):
    """``--site``: the sites of :mod:`anatomy_cli.models.sites` one can patch (``interventions.SITES``)."""

    resid_pre = sites.Site.resid_pre.value
    attn_out = sites.Site.attn_out.value
    mlp_out = sites.Site.mlp_out.value
    head = sites.Site.head.value
    resid_post = sites.Site.resid_post.value


@dataclass(frozen=True)
class PatchOptions(Declared, TokenPair):
    """``site``: where CLEAN's activation replaces CORRUPT's; ``method``/``check``: exact runs, or attribution
    patching with the N largest estimates checked exactly."""

    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    foil: str | None = shared.foil()
    foil_id: int | None = shared.foil_id()
    first_token: bool = shared.first_token(foil=True)
    site: PatchSite = option(PatchSite.resid_pre, "--site", case_sensitive=False,
                             help="resid_pre: input of block l; attn_out / mlp_out: what block l's attention / MLP "
                             "adds; head: one head at all positions (layer x head grid); resid_post: output of "
                             "block l.")
    method: Method = method_option()
    check: int = check_option()
    batch_size: int = shared.batch_size(32, "Patched runs per forward pass (more: faster, more memory).")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "site", PatchSite(self.site))
        object.__setattr__(self, "method", Method(self.method))
        self.check_tokens()
        check_options(self.method, self.check)
        self.require_target("--target TEXT or --target-id N is required: the token whose logit patching moves, "
                            "e.g. --target ' Paris'")


@dataclass(frozen=True)
class PatchResult:
    patching: Patching
    extra: Extra | None
    ids: dict[str, int | None]


def texts(opts: PatchOptions, clean: str, corrupt: str) -> tuple[PatchOptions, list[str]]:
    """The two texts to tokenize, CLEAN then CORRUPT; UsageError for an empty one."""
    for name, text in (("CLEAN", clean), ("CORRUPT", corrupt)):
        if text == "":
            raise UsageError(f"{name} is empty: give some text")
    return opts, [clean, corrupt]


def check(opened: Opened, opts: PatchOptions, encoded: list[Encoded]) -> dict[str, int | None]:
    """Every refusal before the weights load (``encoded``: CLEAN, CORRUPT); returns the token ids."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    clean, corrupt = encoded
    if len(clean) != len(corrupt):
        raise UsageError(f"CLEAN and CORRUPT must have the same number of tokens: CLEAN is {len(clean)} "
                         f"({' '.join(clean.pieces)}), CORRUPT is {len(corrupt)} ({' '.join(corrupt.pieces)})")
    return opts.resolve(opened)


def run(lm: LoadedModel, encoded: list[Encoded], opts: PatchOptions, ids: dict[str, int | None]) -> PatchResult:
    """The grid of CLEAN patched into CORRUPT (``encoded``), exact or estimated."""
    from anatomy_cli.analyses import patch as analysis
    from anatomy_cli.engine import interventions

    clean, corrupt = encoded
    site = opts.site.value
    if opts.method is Method.exact:

        runs = lm.n_layers * (lm.n_heads if opts.site is PatchSite.head else len(corrupt))
        warn_cost(f"patch: {runs:,} patched runs of {len(corrupt):,} tokens", lm,
                  (runs + 1) * cost.forward_flops(lm.info, len(corrupt)))
    extra = None
    with notes.status("patch") as line:
        if opts.method is Method.attribution:
            result, extra = _attribution.patch(lm, clean.ids, corrupt.ids, site, ids, opts.check, opts.batch_size)
        else:
            grid = interventions.patch_grid(lm, clean.ids, corrupt.ids, site, batch_size=opts.batch_size,
                                           reduce=analysis.logit_metric(_target(ids), ids["foil"]),
                                           progress=line.counter("patch", "patched runs"))
            result = analysis.patching(site, "logit_diff" if ids["foil"] is not None else "logit", grid.layers,
                                       grid.columns, grid.grid, float(grid.clean), float(grid.corrupt))
    return PatchResult(result, extra, ids)


def carried(result: PatchResult) -> Patching:
    """What the API's Result carries: the grid."""
    return result.patching


OPTIONS = PatchOptions  # the options class the driver generates the CLI options and API keywords from


def _target(ids: dict[str, int | None]) -> int:
    target = ids["target"]
    assert target is not None  # resolve_pair always gives the target
    return target
