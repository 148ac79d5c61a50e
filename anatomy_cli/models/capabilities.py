"""What a command needs of a model, asked once before any weight loads, with one wording (no torch).

:func:`require` reads the capability record of :class:`~anatomy_cli.models.info.ModelInfo` and raises the one
:class:`~anatomy_cli.errors.UsageError` sentence of :data:`WORDING` for the first need the model lacks, the
same from every command and from the Python API::

    require(opened.info, Need.decoder, Need.lm_head, command="next")
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError
from anatomy_cli.models.info import ROUTING

if TYPE_CHECKING:
    from anatomy_cli.models.info import ModelInfo


class Need(str, Enum):
    decoder = "decoder"              # decoder-only: predicts the next token
    lm_head = "lm_head"              # an LM head (unembedding) to read tokens from
    linear_logits = "linear_logits"  # logits linear in the final norm's output (DLA)
    separable_heads = "separable_heads"  # attention's output as a sum over heads
    encoder = "encoder"              # the opposite of decoder (masked-LM commands)
    moe = "moe"                      # a mixture-of-experts model: routers and experts to read


def _has(info: ModelInfo, need: Need) -> bool:
    if need is Need.decoder:
        return info.is_decoder
    if need is Need.lm_head:
        return info.has_lm_head
    if need is Need.linear_logits:
        return info.logits_linear
    if need is Need.separable_heads:
        return info.heads_separable
    if need is Need.moe:
        return info.is_moe
    return not info.is_decoder


WORDING = {
    Need.decoder: "{model} is an encoder ({family}), not a next-token predictor: `{command}` needs a decoder-only "
                  "model such as gpt2 (`trace`, `lens` and `attn` work with encoders)",
    Need.lm_head: "{model} has no LM head (unembedding): `{command}` reads tokens through one; load a checkpoint "
                  "with its head (a ...ForCausalLM or ...ForMaskedLM model)",
    Need.linear_logits: "{model}'s logits are not a linear map of the final residual stream ({why}): `{command}` "
                        "splits them into additive parts",
    Need.separable_heads: "{model}'s attention output does not split into heads: `{command}` needs each head's part",
    Need.encoder: "{model} is a decoder ({family}): `{command}` needs an encoder with a masked-LM head",
    Need.moe: "{model} is a dense model ({model_type}), not a mixture of experts: `{command}` reads the routers of "
              "an MoE model (" + ", ".join(ROUTING) + ")",
}


def refusal(info: ModelInfo, need: Need | str, command: str) -> str:
    """The one sentence that refuses ``command`` on a model lacking ``need``."""
    need = Need(need)
    why = ("soft-capped: c·tanh(z/c)" if info.logit_softcap is not None else
           "an encoder's masked-LM head is dense + activation + norm" if not info.is_decoder else "no LM head")
    return WORDING[need].format(model=info.display_name, family=info.adapter.name, command=command, why=why,
                               model_type=info.model_type)


def missing(info: ModelInfo, *needs: Need | str) -> Need | None:
    """The first of ``needs`` the model lacks (None: it has them all)."""
    for need in needs:
        if not _has(info, Need(need)):
            return Need(need)
    return None


def require(info: ModelInfo, *needs: Need | str, command: str) -> None:
    """Raise UsageError (:func:`refusal`'s sentence) for the first of ``needs`` the model lacks."""
    lacking = missing(info, *needs)
    if lacking is not None:
        raise UsageError(refusal(info, lacking, command))
