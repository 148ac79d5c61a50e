"""`explain`'s whole run (:func:`measure`): the features directory read and the models opened before any weights
load; then per feature the explanation (delphi's explainer prompt, anatomy's generation), and once every feature
has one, per feature delphi's detection and fuzzing scores of its own explanation and of another feature's (the
control). The export is rewritten after every step, so an interrupted run keeps what it wrote and a rerun of the
same settings continues. The cost is printed once the first generation has read its prompt and written a few
tokens, from its measured rates, before any explanation is written."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from anatomy_cli.analyses.explain_prompts import cut_loop
from anatomy_cli.analyses.explain_prompts import explainer_messages
from anatomy_cli.analyses.explain_prompts import parse_explanation
from anatomy_cli.analyses.explain_score import SCORERS
from anatomy_cli.analyses.explain_score import score
from anatomy_cli.errors import OfflineError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.resolve import offline_error
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._explain_cost import SCORER_TOKENS
from anatomy_cli.tasks._explain_cost import estimate
from anatomy_cli.tasks._explain_cost import line
from anatomy_cli.tasks.explain import EXPORT
from anatomy_cli.tasks.explain import RUN
from anatomy_cli.tasks.explain import ExplainOptions
from anatomy_cli.tasks.explain import FeatureExamples
from anatomy_cli.tasks.explain import FeaturesDir
from anatomy_cli.tasks.explain import read_dir
from anatomy_cli.tasks.session import busy_threads
from anatomy_cli.tasks.session import load_weights
from anatomy_cli.tasks.session import open_model

RATE_STEPS = 4  # new tokens timed after the first before the cost is printed
TYPE_NAME = "anatomy-explain (delphi default explainer; detection and fuzzing scorers)"


@dataclass(frozen=True)
class ExplainRun:
    """What :func:`measure` returns: ``records``: the export's records in feature order (``scores`` and
    ``control`` once scored); ``cost``: the measured rates and the estimate; ``resumed``: features whose
    explanation was read back from an earlier run."""

    model: str
    layer: str
    hook: str
    explainer: str
    scorer: str
    records: tuple[dict[str, Any], ...]
    skipped: tuple[int, ...]
    cost: dict[str, Any] = field(default_factory=dict)
    resumed: int = 0
    file: str = ""


@dataclass
class Chat:
    """A loaded chat model answering messages with anatomy's generation engine (greedy, or sampled with a seed):
    ``ask(messages, max_new_tokens, temperature, seed) -> text``. Keeps the first generation's rates."""

    lm: Any
    name: str
    rates: dict[str, float] = field(default_factory=dict)
    too_long: bool = False
    on_rates: Callable[[], None] | None = None  # called once, as soon as the rates are measured

    def ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The messages as the chat template renders them (``add_generation_prompt=True``), tokenized as
        ``apply_chat_template(..., tokenize=True)`` tokenizes them."""
        hf = self.lm.tokenizer.hf
        try:
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # a jinja error in the model's own template
            if isinstance(exc, (KeyboardInterrupt, MemoryError)):
                raise
            raise UsageError(f"{self.name}'s chat template fails on delphi's prompt: {exc}") from None
        return list(hf(text, add_special_tokens=False)["input_ids"])

    def ask(self, messages: list[dict[str, str]], max_new_tokens: int, temperature: float = 0.0,
            seed: int = 0) -> str:
        from anatomy_cli.analyses.generate import sampler
        from anatomy_cli.engine.generate import generate
        from anatomy_cli.engine.generate import greedy
        from anatomy_cli.engine.generate import stop_ids

        ids = self.ids(messages)
        n_ctx = self.lm.info.n_ctx
        if n_ctx is not None and len(ids) >= n_ctx:
            if not self.too_long:
                notes.warn(f"delphi's prompt is {len(ids):,} tokens, more than {self.name}'s context of {n_ctx:,}: "
                           f"no answer (an explanation that could not be parsed, an unanswered batch)")
            self.too_long = True
            return ""
        stamps: list[float] = []
        choose = greedy if temperature == 0 else sampler(temperature=temperature, seed=seed)
        start = time.perf_counter()

        def step(done: int, total: int) -> None:
            stamps.append(time.perf_counter())
            if not self.rates and len(stamps) == RATE_STEPS + 1:  # the prompt and a few new tokens: the cost now
                self._measured(start, stamps, len(ids))

        out = generate(self.lm, ids, max_new_tokens=max_new_tokens, choose=choose, stop=stop_ids(self.lm),
                       progress=step)
        if not self.rates and stamps:  # fewer new tokens: what there is
            self._measured(start, stamps, len(ids))
        return str(self.lm.tokenizer.hf.decode(list(out.tokens), skip_special_tokens=True))

    def _measured(self, start: float, stamps: list[float], prompt_tokens: int) -> None:
        """The rates of the first generation: the prompt up to the first new token, then each new token (one new
        token only: its whole step as the decode rate, an upper bound); :attr:`on_rates` told."""
        decode = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else stamps[0] - start
        self.rates = {"prompt_tokens": prompt_tokens, "prefill_s_per_token": (stamps[0] - start) / prompt_tokens,
                      "decode_s_per_token": decode}
        if self.on_rates is not None:
            self.on_rates()


def measure(spec: ModelSpec, opts: ExplainOptions) -> ExplainRun:
    """The whole run; see the module docstring."""
    fdir = read_dir(opts)
    if not fdir.features:
        raise UsageError(f"{fdir.path}: no feature fires in it (every followed feature is dead): nothing to explain")
    state = _state(opts, fdir)
    opened = _open(spec, opts.explainer, "--explainer")
    opened_scorer = _open(spec, opts.scorer, "--scorer") if opts.scorer not in (None, opts.explainer) else None
    for o in (opened, opened_scorer):  # a light open's tokenizer carries no template: checked once loaded
        if o is not None and not getattr(o, "light", False):
            _require_template(o.tokenizer.hf, o.name)
    explainer = Chat(load_weights(opened), opened.name)
    scorer = Chat(load_weights(opened_scorer), opened_scorer.name) if opened_scorer is not None else explainer
    for chat in (explainer, scorer):
        _require_template(chat.lm.tokenizer.hf, chat.name)
    resumed = sum(1 for r in state.values() if "description" in r)
    if resumed:
        notes.info(f"explain: resumed: {resumed} of {len(fdir.features)} features were explained by an earlier run")
    run = _Run(opts, fdir, explainer, scorer, state)
    with busy_threads("explain"):
        run.explain_all()
        run.score_all()
    records = tuple(state[f.feature] for f in fdir.features)
    return ExplainRun(fdir.model, fdir.layer, fdir.hook, explainer.name, scorer.name, records, fdir.skipped,
                      run.cost, resumed, str(opts.target / EXPORT))


def _open(spec: ModelSpec, model: str, option: str) -> Any:
    """``model`` opened (no weights); a model that is not cached while offline is refused naming ``option``, the
    option that named it (models/resolve.py ``offline_message``), not ``--model``."""
    try:
        return open_model(spec.replace(model=model))
    except OfflineError as exc:
        if exc.spec is None or exc.need is None:
            raise
        raise offline_error(exc.spec, exc.need, option) from None


def _require_template(hf: Any, name: str) -> None:
    if not getattr(hf, "chat_template", None):
        raise UsageError(f"{name} has no chat template (its tokenizer carries none): explain needs a chat model for "
                         f"--explainer and --scorer")


def _state(opts: ExplainOptions, fdir: FeaturesDir) -> dict[int, dict[str, Any]]:
    """The records an earlier run of the same settings wrote (``{}`` for none); UsageError for an export of other
    settings without ``--overwrite``."""
    target = opts.target
    target.mkdir(parents=True, exist_ok=True)
    export, run = target / EXPORT, target / RUN
    want = {"settings": opts.settings(), "features": [f.feature for f in fdir.features]}
    if not export.exists() or opts.overwrite:
        return {}
    try:
        same = json.loads(run.read_text()) == want
        records = json.loads(export.read_text())
    except (OSError, ValueError):
        same, records = False, []
    if not same:
        raise UsageError(f"{export} was written with other settings (or by another tool): --overwrite replaces it, "
                         f"or --out DIR writes elsewhere")
    return {int(r["index"]): r for r in records if isinstance(r, dict) and "index" in r}


class _Run:
    def __init__(self, opts: ExplainOptions, fdir: FeaturesDir, explainer: Chat, scorer: Chat,
                 state: dict[int, dict[str, Any]]) -> None:
        self.opts, self.fdir, self.explainer, self.scorer, self.state = opts, fdir, explainer, scorer, state
        self.cost: dict[str, Any] = {}
        self._save_settings()

    def _save_settings(self) -> None:
        from anatomy_cli.corpus.store import _atomic

        run = {"settings": self.opts.settings(), "features": [f.feature for f in self.fdir.features]}
        _atomic(self.opts.target / RUN, lambda tmp: Path(tmp).write_text(json.dumps(run, indent=1)))

    def save(self) -> None:
        from anatomy_cli.corpus.store import _atomic

        records = [self.state[f.feature] for f in self.fdir.features if f.feature in self.state]
        text = json.dumps(records, indent=1, ensure_ascii=False)
        _atomic(self.opts.target / EXPORT, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def explain_all(self) -> None:
        todo = [f for f in self.fdir.features if "description" not in self.state.get(f.feature, {})]
        with notes.status("explain: writing the explanations") as line:
            for n, ex in enumerate(todo):
                line.update(f"explain: feature {ex.feature} ({n + 1}/{len(todo)}): writing its explanation")
                messages = explainer_messages(ex.train, ex.max_activation)
                self.explainer.on_rates = lambda ex=ex: self._estimate(ex)
                text = self.explainer.ask(messages, self.opts.max_new_tokens, self.opts.temperature,
                                          self.opts.seed + ex.feature)
                description, loop = cut_loop(parse_explanation(text))
                self.state[ex.feature] = self._record(ex, description)
                if loop is not None:
                    self.state[ex.feature]["loop"] = loop
                    notes.warn(f"explain: feature {ex.feature}'s explanation says {loop['repeated']!r} "
                               f"{loop['times']} times in a row (the explainer looped): cut after the first")
                self.save()
                self._estimate(ex)
                notes.info(f"explain: feature {ex.feature} ({n + 1}/{len(todo)}): "
                           f"{self.state[ex.feature]['description'][:100]!r}")

    def _record(self, ex: FeatureExamples, description: str) -> dict[str, Any]:
        return {"modelId": self.fdir.model, "layer": self.fdir.layer, "index": str(ex.feature),
                "description": description, "explanationModelName": self.explainer.name, "typeName": TYPE_NAME,
                "scorerModelName": self.scorer.name, "hook": self.fdir.hook,
                "examples": {"explainer": len(ex.train), "test": len(ex.test), "non_activating": len(ex.not_active)}}

    def _estimate(self, ex: FeatureExamples) -> None:
        """Once, as soon as the first generation's rates are measured (its prompt and :data:`RATE_STEPS` new
        tokens, before any explanation is written): the cost (stderr, and the JSON's ``cost``)."""

        chat = self.explainer if self.explainer.rates else self.scorer
        if self.cost or not chat.rates:
            return
        self.cost = estimate(chat, ex, self.opts, len(self.fdir.features))
        notes.info(line(self.cost, self.scorer is not self.explainer))

    def controls(self) -> dict[int, int]:
        """Each feature's control: the feature whose explanation it is scored with, a seeded cyclic shift of the
        explained features (never itself); none with fewer than two."""
        ids = [f.feature for f in self.fdir.features]
        if len(ids) < 2:
            return {}
        shift = 1 + random.Random(self.opts.seed).randrange(len(ids) - 1)
        return {f: ids[(i + shift) % len(ids)] for i, f in enumerate(ids)}

    def score_all(self) -> None:
        controls = self.controls()
        todo = [f for f in self.fdir.features if "scores" not in self.state[f.feature]]
        with notes.status("explain: scoring") as status_line:
            for n, ex in enumerate(todo):
                record = self.state[ex.feature]
                self.scorer.on_rates = lambda ex=ex: self._estimate(ex)
                step = f"explain: scoring feature {ex.feature} ({n + 1}/{len(todo)})"
                record["scores"] = self._scores(ex, record["description"], status_line, step)
                other = controls.get(ex.feature)
                record["control"] = None if other is None else {
                    "explanation_of": other,
                    **self._scores(ex, self.state[other]["description"], status_line, step + ", control")}
                self.save()
                self._estimate(ex)

    def _scores(self, ex: FeatureExamples, explanation: str, status_line: Any, step: str) -> dict[str, Any]:
        if not ex.test or not ex.not_active:
            return {kind: None for kind in SCORERS}
        out: dict[str, Any] = {}
        for kind in SCORERS:
            status_line.update(f"{step}: {kind}")
            ask: Callable[[list[dict[str, str]]], str] = lambda m: self.scorer.ask(m, SCORER_TOKENS)
            out[kind] = score(kind, explanation, ex.test, ex.not_active, self.opts.shown, ask, self.opts.seed)
        return out
