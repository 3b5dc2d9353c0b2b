"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1 (tests/llm_server.py):
retries on 429/500, error rows after retries, no retry on 400, timeouts, a down endpoint,
the concurrency limit, the key from the environment; and the cache key."""

from __future__ import annotations

import socket

import pytest

from llm_server import LLMServer
from xling.actors.llm import Sampling, cache_key, check_prompt
from xling.core.engines.openai import OpenAIEngine

# Its tests share module fixtures: one xdist worker runs them all (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_llm_http")


@pytest.fixture(scope="module")
def server():
    with LLMServer(delay_s=0.05) as s:
        yield s


def engine(server, model, **kw):
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("max_retries", 3)
    return OpenAIEngine(model, base_url=server.url, api_key_env=None, **kw)


def test_retries_429_then_500_then_succeeds(server):
    done = engine(server, "flaky").complete(["one", "two"], Sampling(max_tokens=8))
    assert [c.error for c in done] == [None, None]
    assert [c.text for c in done] == ["echo: one", "echo: two"]
    assert [c.attempts for c in done] == [3, 3]  # 429, 500, 200
    assert all(c.n_prompt_tokens == 1 and c.n_output_tokens == 2 for c in done)
    assert all(c.latency_s > 0 for c in done)


def test_persistent_500_and_400_become_error_rows(server):
    before = server.calls["bad400"]
    done = engine(server, "always500").complete(["a"], Sampling())
    assert done[0].text is None and done[0].attempts == 4
    assert "failed after 4 attempts: HTTP 500" in done[0].error
    done = engine(server, "bad400").complete(["a", ""], Sampling())
    assert "HTTP 400" in done[0].error and "prompt too long" in done[0].error
    assert done[0].attempts == 1 and server.calls["bad400"] == before + 1  # not retried
    assert done[1].error == "empty prompt"  # refused before any request


def test_timeout_and_down_endpoint(server):
    done = engine(server, "slow", timeout_s=0.3, max_retries=1).complete(["x"], Sampling())
    assert "timed out after 0.3s" in done[0].error and done[0].attempts == 2
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = OpenAIEngine("m", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=None,
                        max_retries=2, backoff_s=0.01)
    done = down.complete(["a", "b"], Sampling())
    for c in done:
        assert c.text is None and c.attempts == 3
        assert "failed after 3 attempts: ConnectError" in c.error


def test_concurrency_limit_and_order(server):
    import time

    deadline = time.time() + 10
    while server.in_flight and time.time() < deadline:  # requests abandoned by the timeout test
        time.sleep(0.05)
    server.max_in_flight = 0
    prompts = [f"p{i}" for i in range(24)]
    done = engine(server, "echo", concurrency=3).complete(prompts, Sampling())
    assert [c.text for c in done] == [f"echo: {p}" for p in prompts]
    assert server.max_in_flight == 3


def test_chat_messages_and_completions_endpoint(server):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert engine(server, "echo").complete([chat], Sampling())[0].text == "echo: hi"
    raw = engine(server, "echo", chat=False).complete(["raw text", chat], Sampling())
    assert raw[0].text == "echo: raw text"
    assert "chat messages given to an endpoint configured with chat: false" in raw[1].error


def test_key_comes_from_the_named_environment_variable(server, monkeypatch):
    monkeypatch.delenv("XLING_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="XLING_TEST_KEY"):
        OpenAIEngine("echo", base_url=server.url, api_key_env="XLING_TEST_KEY")
    monkeypatch.setenv("XLING_TEST_KEY", "sk-test")
    e = OpenAIEngine("echo", base_url=server.url, api_key_env="XLING_TEST_KEY")
    assert e._headers() == {"Authorization": "Bearer sk-test"}
    assert set(server.models) <= set(e.list_models())


def test_cache_key_and_prompt_checks():
    s = Sampling(max_tokens=8)
    k = cache_key("m", {"chat": True}, s, "hello")
    assert k == cache_key("m", {"chat": True}, Sampling(max_tokens=8), "hello")
    assert k != cache_key("m2", {"chat": True}, s, "hello")
    assert k != cache_key("m", {"chat": True}, Sampling(max_tokens=9), "hello")
    assert k != cache_key("m", {"chat": True}, Sampling(max_tokens=8, seed=1), "hello")
    assert k != cache_key("m", {"chat": False}, s, "hello")
    assert k != cache_key("m", {"chat": True}, s, "hello!")
    a = [{"role": "user", "content": "x"}]
    assert cache_key("m", {}, s, a) == cache_key("m", {}, s, [{"content": "x", "role": "user"}])
    assert check_prompt("  ") == "empty prompt" and check_prompt([]) == "empty prompt"
    assert check_prompt([{"role": "user"}]).startswith("chat message")
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1)
