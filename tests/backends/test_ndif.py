"""remote=True: a local stand-in of NDIF's HTTP interface (no network is touched); a remote model fails at
once offline, unauthorised or not hosted, and passes the preflight when it runs."""

from __future__ import annotations

import time

import pytest

from probes.backends import get_backend


@pytest.fixture
def ndif(monkeypatch: pytest.MonkeyPatch):
    """Replace nnsight's one HTTP getter; ``answers`` maps a path to a dict or an exception."""
    import httpx
    from nnsight import CONFIG, ndif as ndif_mod

    answers: dict[str, object] = {}
    calls: list[str] = []

    def fake_get(path: str, timeout=None, headers=None) -> dict:
        calls.append(path)
        answer = answers.get(path, httpx.ConnectError("[Errno -3] Temporary failure in name resolution"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ndif_mod, "_get", fake_get)
    monkeypatch.setattr(CONFIG.API, "APIKEY", "test-key")
    return answers, calls, CONFIG


def _remote(repo: str = "Qwen/Qwen3-8B"):
    return get_backend("nnsight", repo, remote=True)


def test_remote_fails_at_once_offline_unauthorised_or_not_hosted(ndif, monkeypatch):
    from probes.backends.nnsight import NDIFUnavailableError

    answers, calls, config = ndif
    t0 = time.perf_counter()
    with pytest.raises(NDIFUnavailableError, match="cannot reach NDIF"):
        _remote()
    assert time.perf_counter() - t0 < 1.0 and calls == ["/whoami"]

    answers["/whoami"] = {"email": None, "tags": []}
    answers["/status"] = {"deployments": {}}
    with pytest.raises(NDIFUnavailableError, match="does not recognise the configured API key"):
        _remote()

    answers["/whoami"] = {"email": "a@b.c", "tags": []}
    answers["/status"] = {"deployments": {"x": {"repo_id": "meta-llama/Llama-3.1-8B", "application_state": "RUNNING"},
                                          "y": {"repo_id": "Qwen/Qwen3-8B", "application_state": "DEPLOYING"}}}
    with pytest.raises(NDIFUnavailableError, match=r"not running 'Qwen/Qwen3-8B' now \(running: meta-llama/Llama-3.1-8B\)"):
        _remote()

    monkeypatch.setattr(config.API, "APIKEY", None)
    with pytest.raises(NDIFUnavailableError, match="needs an NDIF API key"):
        _remote()


def test_remote_preflight_passes_when_the_model_runs(ndif):
    from probes.backends.nnsight import ndif_preflight

    answers, calls, _ = ndif
    answers["/whoami"] = {"email": "a@b.c", "tags": []}
    answers["/status"] = {"deployments": {"y": {"repo_id": "Qwen/Qwen3-8B", "application_state": "RUNNING"}}}
    ndif_preflight("Qwen/Qwen3-8B")
    assert calls == ["/whoami", "/status"]
