"""What `fit-lens`'s files hold beside the lens (the stored precision, the prompts' digests) and what every fit's
summary reports beside its figures (:class:`FitCosts`). Writing them and the checkpoints: engine/checkpoint.py."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = {"fp16": "float16", "fp32": "float32"}  # --dtype: the stored matrices' precision (torch names)
# A Jacobian lens file's key beside jlens' own: the digest of each fitted prompt's token ids, so that fit-lens merge
# can refuse fits that share a prompt
HASHES = "prompt_hashes"


@dataclass(frozen=True, kw_only=True)
class FitCosts:
    """A fit's summary beside its figures (``fit-lens jacobian``, ``fit-lens tuned``): the ``estimate`` printed
    before the fit, the ``timings`` measured, the held-out ``check`` (None: not run). Keywords, after the
    summary's own fields."""

    estimate: dict[str, object] | None = None
    timings: dict[str, object] | None = None
    check: dict[str, object] | None = None

    def costs(self) -> dict[str, object]:
        """The JSON form's last keys."""
        return {"estimate": self.estimate, "timings": self.timings, "held_out_check": self.check}
