"""What `fit-lens`'s files hold beside the lens (the stored precision, the prompts' digests) and what every fit's
summary reports beside its figures (:class:`FitCosts`). Writing them and the checkpoints: engine/checkpoint.py."""

from __future__ import annotations

from dataclasses import Field
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import ClassVar
from typing import Protocol

if TYPE_CHECKING:
    from anatomy_cli.engine.estimate import EstimateRecord
    from anatomy_cli.engine.estimate import TimingsRecord

DTYPES = {"fp16": "float16", "fp32": "float32"}  # --dtype: the stored matrices' precision (torch names)
# A Jacobian lens file's key beside jlens' own: the digest of each fitted prompt's token ids, so that fit-lens merge
# can refuse fits that share a prompt
HASHES = "prompt_hashes"


@dataclass(frozen=True, kw_only=True)
class FitCosts:
    """A fit's summary beside its figures (``fit-lens jacobian``, ``fit-lens tuned``): the ``estimate`` printed
    before the fit, the ``timings`` measured, the held-out ``check`` (None: not run). Keywords, after the
    summary's own fields."""

    estimate: EstimateRecord | None = None
    timings: TimingsRecord | None = None
    check: dict[str, object] | None = None

    def costs(self) -> dict[str, object]:
        """The JSON form's last keys."""
        return {"estimate": self.estimate, "timings": self.timings, "held_out_check": self.check}


class FitLensSettings(Protocol):
    """What the fits read of tasks/fit_lens.py's ``FitLensOptions`` (that module imports the fits' modules, so
    they name its fields here rather than import it); a dataclass, whose defaults tell what was given."""

    __dataclass_fields__: ClassVar[dict[str, Field[object]]]

    @property
    def kind(self) -> str | None: ...
    @property
    def out(self) -> Path | None: ...
    @property
    def overwrite(self) -> bool: ...
    @property
    def prompt(self) -> tuple[str, ...]: ...
    @property
    def corpus(self) -> str | None: ...
    @property
    def column(self) -> str: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def ctx(self) -> int | None: ...
    @property
    def steps(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def dim_batch(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def skip_first(self) -> int: ...
    @property
    def shard(self) -> tuple[int, int] | None: ...
    @property
    def checkpoint(self) -> Path | None: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def ray(self) -> bool: ...
    @property
    def ray_address(self) -> str | None: ...
    @property
    def workers(self) -> int: ...
    @property
    def gpus_per_worker(self) -> float: ...


class JacobianBlocks(Protocol):
    """What the Jacobian fit reads of tasks/fit_lens.py's ``FitLensPlan``: the source blocks and the target."""

    @property
    def source_layers(self) -> tuple[int, ...]: ...
    @property
    def target_layer(self) -> int: ...
