"""Test support: a FastAPI app in a thread (:class:`ThreadedUvicorn`) and a scripted vLLM stand-in
(:class:`OpenAICompatibleServer`), for CPU tests. Not shipped in the wheel (tests/ is on pytest's path, as for
``smoke_runs``); the tiny offline models live in :mod:`verl_evidence.local.tiny_models`.
"""

from __future__ import annotations


class ThreadedUvicorn:
    """A FastAPI app served by uvicorn in a daemon thread on 127.0.0.1, for tests and stand-ins.

    The listening socket is bound here, before the thread starts, and handed to
    uvicorn: there is no window between choosing a port and binding it in which
    another server can take it (``free_port()`` then ``bind`` had one). Start-up
    waits at most ``start_timeout`` seconds and raises if uvicorn never serves
    (its thread dies on an error, e.g. a bad app).
    """

    def __init__(self, app, host: str = "127.0.0.1", start_timeout: float = 30.0) -> None:
        import socket
        import threading
        import time

        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if not self.thread.is_alive():
                self.socket.close()
                raise RuntimeError(f"uvicorn on {self.url} exited during start-up (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"uvicorn on {self.url} did not start within {start_timeout:.0f} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()

    def __enter__(self) -> ThreadedUvicorn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OpenAICompatibleServer:
    """A scripted stand-in for a vLLM server, for CPU tests.

    Speaks vLLM's OpenAI protocol on 127.0.0.1 (uvicorn, a background thread):
    ``/v1/completions`` with token-id prompts and vLLM's ``token_ids`` in each
    choice, and ``/v1/chat/completions``. The "model" always writes
    ``completion_text`` / ``chat_reply``, cut at the first requested stop
    string as vLLM does. Every request body is kept in ``requests``.
    """

    def __init__(
        self,
        tokenizer,
        completion_text: str = "<answer> Nile </answer> after",
        chat_reply: str = "<reason> r </reason><extract> The Nile is the longest river. </extract> more",
        return_token_ids: bool = True,
    ) -> None:
        from fastapi import FastAPI

        app = FastAPI()
        self.requests: list[dict] = []
        self.completion_text = completion_text
        self.chat_reply = chat_reply

        def cut(text: str, body: dict) -> tuple[str, str | None]:
            for stop in body.get("stop") or []:
                if stop in text:
                    keep = text.index(stop) + (len(stop) if body.get("include_stop_str_in_output") else 0)
                    return text[:keep], stop
            return text, None

        @app.post("/v1/completions")
        async def completions(body: dict):
            self.requests.append(body)
            text, stop = cut(self.completion_text, body)
            choice = {"index": 0, "text": text, "finish_reason": "stop", "stop_reason": stop, "logprobs": None}
            if return_token_ids:
                choice["token_ids"] = tokenizer.encode(text, add_special_tokens=False)
            return {"id": "c", "object": "text_completion", "created": 0, "model": body["model"], "choices": [choice]}

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            self.requests.append(body)
            text, _ = cut(self.chat_reply, body)
            message = {"role": "assistant", "content": text}
            return {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }

        self._http = ThreadedUvicorn(app)
        self.url = self._http.url

    def stop(self) -> None:
        self._http.stop()
