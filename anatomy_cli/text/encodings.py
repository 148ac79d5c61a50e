"""tiktoken encodings without network: gpt2 from the files inside the package, the others from tiktoken's cache.

``gpt2`` (the default of ``anatomy tokens``) never needs a download: it is built from
``anatomy_cli/data/gpt2`` (GPT-2's ``encoder.json``), and the ``r50k_base`` file it equals is
written into tiktoken's cache on first use, so later runs read that in a few milliseconds.
Any other encoding (``cl100k_base``, ``o200k_base``, ...) is tiktoken's own business: its
file comes from tiktoken's cache or a download, and when neither works the error names the
file and where it goes (docs/commands/tokens.md#offline). No torch, no transformers.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.data import GPT2_SPECIAL
from anatomy_cli.data import gpt2_ranks
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import OfflineError
from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    import tiktoken

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
DOCS = "docs/commands/tokens.md#offline"


def encoding_names() -> list[str]:
    """Names of the tiktoken encodings installed (``gpt2``, ``cl100k_base``, ...)."""
    import tiktoken

    return tiktoken.list_encoding_names()


def cache_dir() -> Path | None:
    """tiktoken's cache directory (TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR, ``<tmp>/data-gym-cache``);
    None when an empty TIKTOKEN_CACHE_DIR switches the cache off."""
    env = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if env is None:
        return Path(tempfile.gettempdir()) / "data-gym-cache"
    return Path(env) if env else None


def cache_name(url: str) -> str:
    """The file name tiktoken caches ``url`` under: its SHA-1."""
    return hashlib.sha1(url.encode()).hexdigest()


def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken ``Encoding`` called ``name``.

    Raises UsageError for an unknown name (listing the available ones); OfflineError when a
    non-gpt2 encoding's file is neither cached nor downloadable (naming the file and its
    cache name); AnatomyError when a downloaded file fails tiktoken's hash check.
    """
    import tiktoken

    names = encoding_names()
    if name not in names:
        raise UsageError(f"unknown tiktoken encoding '{name}'; available: {', '.join(names)}")
    if name == "gpt2":
        return gpt2_encoding()
    try:
        return tiktoken.get_encoding(name)
    except OSError as exc:  # requests' ConnectionError/HTTPError are OSErrors; so are cache-dir errors
        raise OfflineError(_offline_message(name, exc)) from exc
    except ValueError as exc:  # tiktoken's hash check on a downloaded file
        raise AnatomyError(f"tiktoken encoding '{name}' could not be loaded: {str(exc).splitlines()[0]}") from exc


def _offline_message(name: str, exc: OSError) -> str:
    url = getattr(getattr(exc, "request", None), "url", None)  # requests names the file it tried
    cache = cache_dir()
    where = f"TIKTOKEN_CACHE_DIR (now: {os.environ.get('TIKTOKEN_CACHE_DIR') or cache or 'off'})"
    wants = (f"tiktoken reads {url}; save that file once as {where}/{cache_name(url)}" if url else
             f"put its file in {where}")
    return (f"tiktoken encoding '{name}' is not cached and could not be downloaded ({type(exc).__name__}): "
            f"{wants} (see {DOCS}); gpt2 works offline")


def gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's gpt2 encoding (ids, pattern and ``<|endoftext|>`` = 50256), never downloaded.

    gpt2 and r50k_base are the same encoding. A valid r50k_base file in tiktoken's cache is
    read (fast); otherwise the encoding is built from the bundled encoder.json and that file
    is written to the cache, byte for byte the published one (its sha256 is checked), when
    the cache is writable.
    """
    import tiktoken

    cache = cache_dir()
    target = cache / cache_name(R50K_URL) if cache is not None else None
    try:
        if target is not None and target.is_file() and _sha256(target.read_bytes()) == R50K_SHA256:
            return tiktoken.get_encoding("r50k_base")
    except (OSError, ValueError):
        pass
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = gpt2_ranks()
    if target is not None:
        _write_r50k(ranks, target)
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens=dict(GPT2_SPECIAL), explicit_n_vocab=50257)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_r50k(ranks: dict[bytes, int], target: Path) -> None:
    data = b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                    for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
    if _sha256(data) != R50K_SHA256:
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        os.replace(partial, target)
    except OSError:  # a read-only cache only costs speed
        pass
