"""Files written for the user get the mode a plain ``open()`` gives under the umask (0644 under 022), not the 0600
that safetensors' writer and ``tempfile.mkstemp`` give (a new user found fit-sae's SAE, the features tables and the
corpus manifest readable by their owner only)."""

from __future__ import annotations

import os
import stat

import pytest


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield 0o644
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_table_and_a_fitted_sae_and_a_steering_vector_are_0644(tmp_path, umask_022):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from anatomy_cli.corpus.store import _atomic
    from anatomy_cli.engine.sae_fit import TopKCoder
    from anatomy_cli.engine.sae_fit import save_sparsify
    from anatomy_cli.engine.steering import SteeringVector
    from anatomy_cli.engine.steering import save

    table = tmp_path / "t.parquet"
    _atomic(table, lambda tmp: pq.write_table(pa.table({"a": [1]}), tmp))
    save_sparsify(TopKCoder(4, 8, 2), tmp_path / "sae")
    save(SteeringVector({0: torch.ones(4)}), tmp_path / "v.safetensors")
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert mode(plain) == umask_022  # what open() gives here
    for path in (table, tmp_path / "sae" / "sae.safetensors", tmp_path / "sae" / "cfg.json", tmp_path / "v.safetensors"):
        assert mode(path) == umask_022, path
