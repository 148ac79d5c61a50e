"""Whether the Hugging Face Hub may and can be contacted. No torch here.

huggingface_hub retries a failed request five times with back-off (about 25 s)
before giving up, even when the failure is a DNS "name not known" that no retry
can fix. On a machine without network that turns every "not cached" answer into
a long wait, so commands ask :func:`offline` first and fail at once.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from urllib.parse import urlparse

_TRUE = ("1", "true", "yes", "on")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def offline_by_setting() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode()) or any(
        os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def offline() -> bool:
    """True when the Hub must not be contacted (``HF_HUB_OFFLINE``) or cannot be.

    "Cannot" means: no proxy is configured and the Hub endpoint's host name does
    not resolve within 3 s. Behind a proxy the name may resolve only at the proxy,
    so then only the setting counts.
    """
    if offline_by_setting():
        return True
    if any(os.environ.get(var) for var in _PROXY_VARS):
        return False
    return not _resolves(_endpoint_host())


def _endpoint_host() -> str:
    from huggingface_hub import constants

    return urlparse(constants.ENDPOINT).hostname or "huggingface.co"


@functools.lru_cache(maxsize=8)
def _resolves(host: str, timeout: float = 3.0) -> bool:
    answer: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, 443)
            answer.append(True)
        except OSError:
            answer.append(False)

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answer and answer[0])
