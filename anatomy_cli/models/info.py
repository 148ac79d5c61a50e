"""One description of a model, decided once: :class:`ModelInfo`, built from a config (and a tokenizer).

Every fact about a model's shape that a command, the engine or a renderer needs (layers, widths, heads,
context length, vocabulary, the BOS convention) is read here from the config, once, and nowhere else: the
checks that run before the weights load (:func:`anatomy_cli.engine.open`), the loaded model
(:class:`~anatomy_cli.engine.model.LoadedModel` holds its ``info``), ``corpus`` and ``heads`` all read this
object. A multimodal config (Gemma 3's ``Gemma3ForConditionalGeneration``) keeps the decoder's sizes in its
``text_config``: they are read from there. The config may be transformers' own or
:class:`~anatomy_cli.models.json_config.JsonConfig` (config.json read as JSON, no torch). No torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Generic
from typing import Protocol
from typing import TypeAlias
from typing import TypeVar
from typing import cast
from typing import overload

from anatomy_cli.errors import UsageError
from anatomy_cli.models import adapters
from anatomy_cli.models.adapters import Adapter

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

    from anatomy_cli.models.json_config import JsonConfig

    # a transformers config, or a config.json read without transformers
    Config: TypeAlias = PreTrainedConfig | JsonConfig


class TokenizerFacts(Protocol):
    """What :class:`ModelInfo` reads from a tokenizer (:class:`anatomy_cli.text.tokenization.Tokenizer`)."""

    @property
    def add_bos(self) -> bool: ...

    @property
    def bos_id(self) -> int | None: ...

    def __len__(self) -> int: ...


# How each MoE family turns its router logits into the experts' weights (anatomy_cli/engine/moe.py applies the
# rule): ``renormalize`` softmax over every expert, top k, divided by their sum always, the weights kept in
# float32 (Mixtral); ``norm_topk_prob`` the same but divided only when the config's ``norm_topk_prob`` says so,
# the weights cast back to the router logits' dtype (Qwen2-MoE, Qwen3-MoE, OLMoE).
ROUTING = {"mixtral": "renormalize", "qwen2_moe": "norm_topk_prob", "qwen3_moe": "norm_topk_prob",
           "olmoe": "norm_topk_prob"}
SHARED_EXPERT = ("qwen2_moe",)  # families with a sigmoid-gated shared expert next to the routed ones


@dataclass(frozen=True)
class MoeInfo:
    """A mixture-of-experts model's routing facts, from its config.

    ``n_experts`` routed experts per MoE block, ``top_k`` chosen per token (``num_experts_per_tok``);
    ``rule`` (:data:`ROUTING`): how the block weights the chosen experts; ``norm_topk_prob``: whether the top-k
    probabilities are divided by their sum (always for Mixtral); ``shared_expert``: a sigmoid-gated shared
    expert is added (Qwen2-MoE); ``sparse_blocks``: the blocks whose MLP is an MoE block (Qwen2/3-MoE's
    ``mlp_only_layers`` and ``decoder_sparse_step`` leave plain MLPs in the others).
    """

    n_experts: int
    top_k: int
    rule: str
    norm_topk_prob: bool
    shared_expert: bool
    sparse_blocks: tuple[int, ...]

    @classmethod
    def from_config(cls, model_type: str, text: Config) -> MoeInfo | None:
        """None for a dense family. AttributeError when a JsonConfig leaves the expert count out."""
        rule = ROUTING.get(model_type)
        if rule is None:
            return None
        n_experts = getattr(text, "num_experts", None)
        if n_experts is None:
            n_experts = text.num_local_experts
        n_layers = int(text.num_hidden_layers)
        only = set(getattr(text, "mlp_only_layers", None) or ())
        step = int(getattr(text, "decoder_sparse_step", None) or 1)
        sparse = tuple(i for i in range(n_layers)
                       if i not in only and int(n_experts) > 0 and (i + 1) % step == 0)
        return cls(n_experts=int(n_experts), top_k=int(text.num_experts_per_tok), rule=rule,
                   norm_topk_prob=rule == "renormalize" or bool(getattr(text, "norm_topk_prob", False)),
                   shared_expert=model_type in SHARED_EXPERT, sparse_blocks=sparse)

    def to_dict(self) -> dict[str, object]:
        return {"n_experts": self.n_experts, "top_k": self.top_k, "rule": self.rule,
                "norm_topk_prob": self.norm_topk_prob, "shared_expert": self.shared_expert,
                "sparse_blocks": list(self.sparse_blocks)}


def text_config(config: Config) -> Config:
    """The decoder's own config: ``text_config`` of a multimodal config, else ``config``."""
    get = getattr(config, "get_text_config", None)
    text: Config = get() if callable(get) else config
    return text


def default_window(default: int, n_ctx: int | None) -> int:
    """A windowed command's tokens per window without ``--ctx``: ``default`` cut to the model's context ``n_ctx``
    (``default`` where no limit is known)."""
    return min(default, n_ctx) if n_ctx else default


def check_ctx(ctx: int, n_ctx: int | None, name: str) -> None:
    """UsageError for a ``--ctx`` past the model's context ``n_ctx`` (None: no limit known; ``name``: the model as
    the user named it): :meth:`ModelInfo.window`'s refusal, also said from a GGUF header's context before the model
    opens (tasks/session.py ``check_early``)."""
    if n_ctx and ctx > n_ctx:
        raise UsageError(f"--ctx {ctx} is more than {name}'s context of {n_ctx} tokens")


@dataclass(frozen=True)
class ModelInfo:
    """A model's shape and conventions.

    ``n_ctx``: the longest prompt the model takes, in tokens (None: no limit known): its position table minus
    ``position_offset`` (RoBERTa numbers positions from ``pad_token_id + 1``, so its 514 rows take 512 tokens).
    ``lm_head_rows``: the LM head's rows, the width of the logits (a padded head has more rows than the
    tokenizer has tokens); ``tokenizer_vocab``: the tokenizer's tokens, special ones included.
    ``add_bos``: the model's own BOS convention (its tokenizer's ``add_bos_token``; GGUF:
    ``tokenizer.ggml.add_bos_token``); ``bos_id`` the BOS token (None: the tokenizer has none).
    ``n_kv_heads``: key/value heads (grouped-query attention; ``n_heads`` without it).
    ``logit_softcap``: Gemma 2's final soft-capping (None: none).

    The capability record (what commands ask before any weight loads; :func:`anatomy_cli.models.capabilities.require`
    words every refusal): ``has_lm_head`` (the model built has an LM head: a decoder's, or an encoder checkpoint's
    masked-LM head), ``logits_linear`` (the logits are a linear map of the final norm's output: a decoder's LM
    head without soft-capping), ``heads_separable`` (attention's output is a sum over heads of their slices of
    the output projection: every adapter here). ``label``: the model's one display name; ``source``: the file
    or directory behind the spec (the ``.gguf`` behind ``ollama:``/``lmstudio:``/packaged names); ``quantization``:
    a GGUF file's quantization label (``Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)``). The three are set by
    :func:`anatomy_cli.engine.open` (None before). ``moe``: a mixture-of-experts model's routing facts
    (:class:`MoeInfo`; None for a dense model).
    """

    model_type: str
    adapter: Adapter
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_ctx: int | None
    position_offset: int
    lm_head_rows: int
    tokenizer_vocab: int
    is_causal: bool
    has_resid_mid: bool
    add_bos: bool
    bos_id: int | None
    logit_softcap: float | None
    has_lm_head: bool = True
    heads_separable: bool = True
    label: str | None = None
    source: str | None = None
    quantization: str | None = None
    moe: MoeInfo | None = None

    @property
    def display_name(self) -> str:
        """The model's name in messages and written configs: its ``label``, else its ``model_type``."""
        return self.label or self.model_type

    def window(self, ctx: int | None, default: int, name: str) -> int:
        """Tokens per window of a command that reads a corpus in windows (corpus, features, fit-sae, fit-lens
        tuned): ``ctx`` as given, else ``default`` cut to :attr:`n_ctx` (``default`` where no limit is known).
        UsageError for a ``ctx`` past the model's context (``name``: the model as the user named it)."""
        if ctx is None:
            return default_window(default, self.n_ctx)
        check_ctx(ctx, self.n_ctx, name)
        return ctx

    @property
    def is_moe(self) -> bool:
        """A mixture-of-experts model (:class:`MoeInfo` in ``moe``)."""
        return self.moe is not None

    @property
    def is_decoder(self) -> bool:
        """Decoder-only (causal): predicts the next token."""
        return self.is_causal

    @property
    def logits_linear(self) -> bool:
        """The logits are a linear map of the final norm's output (DLA's premise)."""
        return self.is_causal and self.has_lm_head and self.logit_softcap is None

    @classmethod
    def from_config(cls, config: Config, tokenizer: TokenizerFacts | None = None, *, random: bool = False) -> ModelInfo:
        """Read the facts from ``config`` (transformers' or :class:`JsonConfig`) and ``tokenizer``.

        Raises UnsupportedArchitecture (no adapter), AttributeError when the config lacks a size it must
        have (a JsonConfig that leaves a class default out: the caller reads transformers' config instead).
        ``random``: the model is built from its shape (``--init random``), with the head of its kind.
        """
        adapter = adapters.for_config(config)
        text = text_config(config)
        d_model = int(text.hidden_size)
        n_heads = int(getattr(text, "num_attention_heads", None) or text.n_head)
        offset = int(text.pad_token_id) + 1 if adapter.positions_after_pad else 0
        positions = getattr(text, "max_position_embeddings", None)
        rows = int(text.vocab_size)
        return cls(
            model_type=str(config.model_type), adapter=adapter,
            n_layers=int(text.num_hidden_layers), d_model=d_model, n_heads=n_heads,
            n_kv_heads=int(getattr(text, "num_key_value_heads", None) or n_heads),
            d_head=int(getattr(text, "head_dim", None) or d_model // n_heads),
            n_ctx=int(positions) - offset if positions else None, position_offset=offset,
            lm_head_rows=rows, tokenizer_vocab=len(tokenizer) if tokenizer is not None else rows,
            is_causal=adapter.causal, has_resid_mid=adapters.has_resid_mid(adapter, text),
            add_bos=bool(tokenizer.add_bos) if tokenizer is not None else False,
            bos_id=tokenizer.bos_id if tokenizer is not None else None,
            logit_softcap=float(getattr(text, "final_logit_softcapping", None) or 0) or None,
            has_lm_head=has_lm_head(adapter, config, random),
            moe=MoeInfo.from_config(str(config.model_type), text),
        )

    def to_dict(self) -> dict[str, object]:
        """The JSON form (the adapter by its name)."""
        return {"model_type": self.model_type, "family": self.adapter.name, "n_layers": self.n_layers,
                "d_model": self.d_model, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "d_head": self.d_head, "n_ctx": self.n_ctx, "position_offset": self.position_offset,
                "lm_head_rows": self.lm_head_rows, "tokenizer_vocab": self.tokenizer_vocab,
                "is_causal": self.is_causal, "has_resid_mid": self.has_resid_mid, "add_bos": self.add_bos,
                "bos_id": self.bos_id, "logit_softcap": self.logit_softcap, "has_lm_head": self.has_lm_head,
                "logits_linear": self.logits_linear, "heads_separable": self.heads_separable,
                "moe": None if self.moe is None else self.moe.to_dict()}


def has_lm_head(adapter: Adapter, config: Config, random: bool = False) -> bool:
    """Whether the model anatomy builds for ``config`` has an LM head: a decoder always (its CausalLM class);
    an encoder when its checkpoint names a masked-LM head (``...ForMaskedLM``, ``...ForPreTraining``) or it is
    built at random (the engine's loader picks the class by the same rule)."""
    if adapter.unembed is None:
        return False
    if adapter.causal:
        return True
    archs = getattr(config, "architectures", None) or []
    return random or any(str(a).endswith(("ForMaskedLM", "ForPreTraining")) for a in archs)


class HasInfo(Protocol):
    """What holds a :class:`ModelInfo` (the opened and the loaded model)."""

    @property
    def info(self) -> ModelInfo: ...


T = TypeVar("T")


class FromInfo(Generic[T]):
    """A read-only attribute that is a field of the holder's ``info``, not a fact worked out again:
    ``n_layers = FromInfo[int]()``; ``vocab_size = FromInfo[int]("lm_head_rows")`` where the names differ."""

    def __init__(self, field: str | None = None) -> None:
        self.field = field or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name
        if self.field not in ModelInfo.__dataclass_fields__:
            raise TypeError(f"{owner.__name__}.{name}: ModelInfo has no field {self.field}")

    @overload
    def __get__(self, holder: None, owner: type) -> FromInfo[T]: ...

    @overload
    def __get__(self, holder: HasInfo, owner: type) -> T: ...

    def __get__(self, holder: HasInfo | None, owner: type) -> FromInfo[T] | T:
        if holder is None:
            return self
        return cast("T", getattr(holder.info, self.field))

    def __set__(self, holder: HasInfo, value: T) -> None:
        raise AttributeError(f"{self.field} is read from info, a ModelInfo, and not set here")
