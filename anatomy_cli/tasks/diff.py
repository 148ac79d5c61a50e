"""`diff`: two models of one shape side by side, weights tensor by tensor or activations layer by layer (the task).

:class:`DiffOptions` holds every option but the models, the prompt options, ``--format`` and ``--plot``.
Weights: :func:`run_weights`. Activations: :func:`check` (before either model's weights: a decoder, the position,
the target, the same tokens and the same residual shape) then :func:`run_activations` (A runs and is freed
before B loads). Residual rows are named ``embed``, then 0..L−1 (block N's output; docs/engine.md#layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import load_weights
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import open_model
from anatomy_cli.tasks.session import open_texts
from anatomy_cli.text import chat
from anatomy_cli.text import targets
from anatomy_cli.text.positions import check_position

if TYPE_CHECKING:
    from anatomy_cli.analyses.diff import ActivationDiff
    from anatomy_cli.analyses.diff import WeightsDiff
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine import OpenedModel
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.text.options import PromptOptions

COMMAND = "diff"


@dataclass(frozen=True)
class DiffOptions(Declared):
    """``weights``: compare the files (the default without a prompt); ``position``: the token position whose
    lens and residual are compared; ``k``: next tokens listed per model; ``target``/``target_id``: a token whose
    rank and probability in both are reported."""

    weights: bool = option(False, "--weights", help="Compare the weights (the default without a PROMPT).")
    position: int = option(-1, "--position", "-p", metavar="N", help="Token position whose lens and residual are "
                           "compared (negative counts from the end).")
    k: int = option(5, "--top", "-k", "--k", min=1, metavar="N", help="How many next tokens of each model to list.")
    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    batch_size: int = shared.batch_size()

    @property
    def wanted(self) -> targets.TokenChoice | None:
        return targets.choice(self.target, self.target_id)

    def check_mode(self, has_prompt: bool) -> None:
        """The refusals of the mode (before anything opens): ``--weights`` with a prompt, ``--target`` without."""
        if has_prompt and self.weights:
            raise UsageError("--weights compares the files and takes no PROMPT; drop one of them")
        if not has_prompt and (self.target is not None or self.target_id is not None):
            raise UsageError("--target needs a PROMPT (it compares next-token probabilities)")


def run_weights(a: str, b: str, trust_remote_code: bool = False) -> WeightsDiff:
    """Both files' headers checked against each other, then every tensor pair compared, one at a time."""
    from anatomy_cli.analyses import diff as analysis

    with notes.status(f"reading the headers of {a} and {b}"):
        header_a = analysis.read_header(a, trust_remote_code=trust_remote_code)
        header_b = analysis.read_header(b, trust_remote_code=trust_remote_code)
        analysis.check_headers(header_a, header_b)  # two families or shapes: said before any tensor is listed
    with notes.status(f"reading {a}"):
        reader_a = analysis.open_weights(a, header=header_a)
    with notes.status(f"reading {b}"):
        reader_b = analysis.open_weights(b, header=header_b)
    with reader_a, reader_b, notes.status("comparing weights") as line:
        return analysis.diff_weights(reader_a, reader_b, progress=line.counter("comparing weights", "tensor pairs"))


@dataclass(frozen=True)
class DiffPlan:
    target_id: int | None


def check(opened_a: OpenedModel, opened_b: OpenedModel, encoded: list[Encoded], encoded_b: list[Encoded],
          opts: DiffOptions) -> DiffPlan:
    """Every refusal before either model's weights: A a decoder, the position within every prompt, the target a
    token of A, B's tokens the same as A's, the two residual streams of one shape."""

    require(opened_a.info, Need.decoder, command=COMMAND)
    check_position(opts.position, encoded)
    wanted = opts.wanted
    target_id = None if wanted is None else targets.resolve(opened_a.tokenizer, wanted, model=opened_a.name,
                                                             vocab_size=opened_a.info.lm_head_rows)
    check_same_tokens(encoded, encoded_b, opened_a.name, opened_b.name)
    check_same_shape(opened_a.info, opened_b.info, opened_a.name, opened_b.name)
    return DiffPlan(target_id)


def run_activations(opened_a: OpenedModel, opened_b: OpenedModel, encoded: list[Encoded], opts: DiffOptions,
                    plan: DiffPlan) -> tuple[str, LoadedModel, list[ActivationDiff]]:
    """``(label_a, lm_b, results)``: A loaded, run and freed, then B; one ActivationDiff per prompt.
    ``label_a``: A's display label (its weights are gone); ``lm_b``: B's LoadedModel."""
    from anatomy_cli.analyses import diff as analysis
    release_memory = when_run("engine.loader").release_memory

    lm = load_weights(opened_a)
    with notes.status(f"running {opened_a.name}"):
        kept_a = analysis.keep(lm, encoded, opts.position, batch_size=opts.batch_size)
    label_a = model_label(lm)
    if opened_b is not opened_a:
        del lm  # A's weights go before B's load: the two models are never in memory together
        release_memory()  # and its pages go back to the system, so B does not load on top of them
        lm = load_weights(opened_b)
    with notes.status(f"running {opened_b.name}"):
        kept_b = analysis.keep(lm, encoded, opts.position, batch_size=opts.batch_size)
    name_token = describe(lm)
    results = [analysis.compare(ka, kb, name_token, k=opts.k, target_id=plan.target_id)
               for ka, kb in zip(kept_a, kept_b)]
    return label_a, lm, results


def open_pair(spec_a: ModelSpec, spec_b: ModelSpec, texts: list[str], prompts: PromptOptions
              ) -> tuple[OpenedModel, OpenedModel, list[Encoded], list[Encoded]]:
    """Both models opened (no weights; B is A when the specs are equal) and the texts tokenized by each."""
    opened_a, encoded = open_texts(texts, spec_a, prompts)
    opened_b = open_model(spec_b) if spec_b != spec_a else opened_a
    encoded_b = encoded if opened_b is opened_a else chat.encode(opened_b.tokenizer, texts, prompts, opened_b.name)
    return opened_a, opened_b, encoded, encoded_b


def check_same_tokens(a: list[Encoded], b: list[Encoded], name_a: str, name_b: str) -> None:
    """Raise UsageError (one line, both tokenizations) when B's ids differ from A's for any prompt."""
    for i, (ea, eb) in enumerate(zip(a, b), start=1):
        ids_b = eb.ids[-len(ea):] if ea.dropped else eb.ids
        if list(ea.ids) != list(ids_b):
            which = f"prompt {i}" if len(a) > 1 else "the prompt"
            show = lambda e: " ".join(f"{p}({t})" for p, t in zip(e.pieces, e.ids))
            raise UsageError(f"the two tokenizers split {which} differently: {name_a}: {show(ea)}; "
                             f"{name_b}: {show(eb)}")


def check_same_shape(a: ModelInfo, b: ModelInfo, name_a: str, name_b: str) -> None:
    """Raise UsageError when B's residual stream (layers, d_model) differs from A's."""
    if (a.n_layers, a.d_model) != (b.n_layers, b.d_model):
        raise UsageError(f"the residual streams differ in shape: {name_a} has {a.n_layers} layers of width "
                         f"{a.d_model}, {name_b} {b.n_layers} of width {b.d_model}")
