"""A scripted loopback LLM endpoint for the real agent CLIs: one server speaking the wire formats the CLIs
use, each chosen by the request's path, all streamed as server-sent events (or one JSON body where the
request asks for no stream):

- Anthropic Messages: `POST /v1/messages` (Claude Code);
- OpenAI Responses: `POST .../responses` (Codex CLI);
- OpenAI Chat Completions: `POST .../chat/completions` (OpenCode, OpenHands, any OpenAI-compatible client);
- Gemini: `POST .../models/M:streamGenerateContent?alt=sse` and `:generateContent` (Gemini CLI).

The script is a list of steps, one per main-loop model call (the last repeats): `{"tool": NAME, "id": ID,
"input": {...}}` asks for one tool call, `{"text": "..."}` answers in words. Requests that offer no tools (a
CLI's side calls: titles, summaries, routing) get a short text answer and do not advance the script. Every
request is recorded with its path, headers and body. Usage is fixed per call so that tests can check the
proxy's accounting: `USAGE` (input incl. cached, cached, output).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

USAGE = {"input": 100, "cached": 40, "output": 12}


class ScriptedLLM:
    def __init__(self, script: list[dict], side_text: str = "ok"):
        self.script, self.side_text = script, side_text
        self.requests: list[dict[str, Any]] = []
        self.pos = 0
        self._lock = threading.Lock()  # the script position and the request list, across handler threads
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ScriptedLLM:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def main_calls(self) -> list[dict]:
        """The requests that offered tools (the agent's main loop)."""
        return [r for r in self.requests if r["main"]]

    def next_step(self, main: bool) -> dict:
        if not main:
            return {"text": self.side_text}
        with self._lock:
            step = self.script[min(self.pos, len(self.script) - 1)]
            self.pos += 1
        return step

    # -- one answer per wire format: a list of SSE data objects (streamed) ---------------------------------
    def anthropic(self, body: dict, step: dict, n: int) -> list[dict]:
        usage = {"input_tokens": USAGE["input"] - USAGE["cached"], "output_tokens": 1,
                 "cache_read_input_tokens": USAGE["cached"], "cache_creation_input_tokens": 0}  # fmt: skip
        start = {"type": "message_start", "message": {"id": f"msg_{n}", "type": "message", "role": "assistant",
                                                      "model": body.get("model"), "content": [], "stop_reason": None,
                                                      "stop_sequence": None, "usage": usage}}  # fmt: skip
        if "tool" in step:
            block = {"type": "tool_use", "id": step["id"], "name": step["tool"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(step["input"])}
        else:
            block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": step["text"]}
        stop = "tool_use" if "tool" in step else "end_turn"
        return [start, {"type": "content_block_start", "index": 0, "content_block": block},
                {"type": "content_block_delta", "index": 0, "delta": delta},
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                 "usage": {"output_tokens": USAGE["output"]}},
                {"type": "message_stop"}]  # fmt: skip

    def responses(self, body: dict, step: dict, n: int) -> list[dict]:
        if "tool" in step:
            item = {"type": "function_call", "id": f"fc_{n}", "call_id": step["id"], "name": step["tool"],
                    "arguments": json.dumps(step["input"]), "status": "completed"}  # fmt: skip
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": step["text"], "annotations": []}]}  # fmt: skip
        response = {"id": f"resp_{n}", "object": "response", "model": body.get("model"), "status": "in_progress",
                    "output": []}  # fmt: skip
        usage = {"input_tokens": USAGE["input"], "input_tokens_details": {"cached_tokens": USAGE["cached"]},
                 "output_tokens": USAGE["output"], "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": USAGE["input"] + USAGE["output"]}  # fmt: skip
        return [{"type": "response.created", "response": response},
                {"type": "response.output_item.added", "output_index": 0, "item": item},
                {"type": "response.output_item.done", "output_index": 0, "item": item},
                {"type": "response.completed", "response": {**response, "status": "completed", "output": [item],
                                                            "usage": usage}}]  # fmt: skip

    def chat(self, body: dict, step: dict, n: int) -> list[dict]:
        head = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0, "model": body.get("model")}
        if "tool" in step:
            call = {"index": 0, "id": step["id"], "type": "function",
                    "function": {"name": step["tool"], "arguments": json.dumps(step["input"])}}  # fmt: skip
            delta, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        else:
            delta, finish = {"role": "assistant", "content": step["text"]}, "stop"
        usage = {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"],
                 "total_tokens": USAGE["input"] + USAGE["output"],
                 "prompt_tokens_details": {"cached_tokens": USAGE["cached"]}}  # fmt: skip
        return [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}], "usage": None},
                {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": None},
                {**head, "choices": [], "usage": usage}]

    def chat_body(self, body: dict, step: dict, n: int) -> dict:
        """A non-streamed Chat Completions answer."""
        if "tool" in step:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": step["id"], "type": "function",
                 "function": {"name": step["tool"], "arguments": json.dumps(step["input"])}}]}  # fmt: skip
        else:
            message = {"role": "assistant", "content": step["text"]}
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model"),
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if "tool" in step else "stop"}],
                "usage": {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"],
                          "total_tokens": USAGE["input"] + USAGE["output"],
                          "prompt_tokens_details": {"cached_tokens": USAGE["cached"]}}}  # fmt: skip

    def gemini(self, body: dict, step: dict, n: int) -> list[dict]:
        part = {"functionCall": {"name": step["tool"], "args": step["input"]}} if "tool" in step else \
            {"text": step["text"]}  # fmt: skip
        usage = {"promptTokenCount": USAGE["input"], "cachedContentTokenCount": USAGE["cached"],
                 "candidatesTokenCount": USAGE["output"], "totalTokenCount": USAGE["input"] + USAGE["output"]}
        return [{"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                 "usageMetadata": usage, "modelVersion": "gemini-test", "responseId": f"r{n}"}]

    def _handler(self):
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):  # OpenAI-compatible clients list models
                    self.json(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})
                else:
                    self.json(404, {"error": {"message": "not found", "code": 404}})

            def json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                path = self.path.split("?")[0]
                main = bool(body.get("tools"))
                with llm._lock:
                    n = len(llm.requests)
                    llm.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                         "body": body, "main": main})  # fmt: skip
                step = llm.next_step(main)
                if path.endswith(":generateContent"):
                    return self.json(200, llm.gemini(body, step, n)[0])
                if path.endswith(":streamGenerateContent"):
                    events = llm.gemini(body, step, n)
                elif path.endswith("/messages"):
                    events = llm.anthropic(body, step, n)
                elif path.endswith("/responses"):
                    events = llm.responses(body, step, n)
                elif path.endswith("/chat/completions"):
                    if not body.get("stream"):
                        return self.json(200, llm.chat_body(body, step, n))
                    events = [*llm.chat(body, step, n), "[DONE]"]
                else:
                    return self.json(404, {"error": {"message": f"no route {path}", "code": 404}})
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in events:
                    data = event if isinstance(event, str) else json.dumps(event)
                    name = f"event: {event['type']}\n" if isinstance(event, dict) and "type" in event else ""
                    chunk = f"{name}data: {data}\n\n".encode()
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

        return Handler
