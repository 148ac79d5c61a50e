"""Offline detection: answer at once instead of waiting through huggingface_hub's retries."""

from __future__ import annotations

import pytest

from anatomy_cli.models import hub


@pytest.fixture
def online_env(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub._PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub._resolves.cache_clear()
    return monkeypatch


def test_setting_wins(online_env):
    online_env.setenv("HF_HUB_OFFLINE", "1")
    online_env.setattr(hub, "_resolves", lambda host: pytest.fail("no lookup when the setting says offline"))
    assert hub.offline() is True


def test_unresolvable_host_means_offline(online_env):
    online_env.setattr(hub, "_endpoint_host", lambda: "no-such-host.invalid")
    assert hub.offline() is True


def test_resolvable_host_means_online(online_env):
    online_env.setattr(hub, "_endpoint_host", lambda: "localhost")
    assert hub.offline() is False


def test_a_proxy_skips_the_lookup(online_env):
    online_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    online_env.setattr(hub, "_resolves", lambda host: pytest.fail("no lookup behind a proxy"))
    assert hub.offline() is False


def test_unknown_model_without_the_setting_fails_fast(online_env):
    """No HF_HUB_OFFLINE, Hub unresolvable: one-line OfflineError, no retries."""
    from anatomy_cli import engine
    from anatomy_cli.errors import OfflineError

    online_env.setattr(hub, "_endpoint_host", lambda: "no-such-host.invalid")
    online_env.setenv("HF_HUB_CACHE", "/nonexistent-anatomy-cache")
    with pytest.raises(OfflineError, match="cannot be reached"):
        engine.load("someone/some-model")
