"""A small OpenAI-compatible HTTP server for tests, on 127.0.0.1 in a background thread.

It answers /v1/models, /v1/chat/completions and /v1/completions. The model name picks a
behaviour, so one server covers every case:

  echo          answers at once: "echo: <last user message>" (or a scripted reply, see below)
  flaky         429 (with Retry-After: 0), then 500, then 200, per distinct prompt
  always500     500 every time
  bad400        400 every time ("prompt too long")
  slow          sleeps 2 s before answering (for timeouts)

`replies` maps a substring of the prompt to the text to answer, for scripted judges. The
server counts requests per model and the most requests it saw in flight at once.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter


class LLMServer:
    def __init__(self, models=("echo", "flaky", "always500", "bad400", "slow"), delay_s=0.0):
        self.models = list(models)
        self.delay_s = delay_s
        self.calls: Counter = Counter()
        self.seen: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.replies: dict[str, str] = {}
        self.reply_fn = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10), "test LLM server did not start"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        asyncio.set_event_loop(self._loop)
        self._runner = runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list",
                                  "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _complete(self, request):
        from aiohttp import web

        body = await request.json()
        model = body.get("model")
        self.calls[model] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            if model not in self.models:
                return web.json_response({"error": {"message": f"model {model} does not exist"}},
                                         status=404)
            prompt = (body["messages"][-1]["content"] if "messages" in body else body["prompt"])
            self.seen[(model, prompt)] += 1
            n = self.seen[(model, prompt)]
            if model == "flaky" and n == 1:
                return web.json_response({"error": "slow down"}, status=429,
                                         headers={"Retry-After": "0"})
            if model == "flaky" and n == 2 or model == "always500":
                return web.json_response({"error": "internal"}, status=500)
            if model == "bad400":
                return web.json_response({"error": {"message": "prompt too long"}}, status=400)
            if model == "slow":
                await asyncio.sleep(2)
            text = self._reply(prompt, model)
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
            choice = ({"message": {"role": "assistant", "content": text}} if "messages" in body
                      else {"text": text})
            return web.json_response({"id": "x", "model": model, "usage": usage,
                                      "choices": [{"index": 0, "finish_reason": "stop", **choice}]})
        finally:
            self.in_flight -= 1

    def _reply(self, prompt: str, model: str) -> str:
        if self.reply_fn is not None:
            import inspect

            if len(inspect.signature(self.reply_fn).parameters) == 2:  # (prompt, model)
                return self.reply_fn(prompt, model)
            return self.reply_fn(prompt)
        for needle, text in self.replies.items():
            if needle in prompt:
                return text
        return f"echo: {prompt}"
