"""A generation worker for another Python environment (e.g. one with vLLM): JSON lines on stdin/stdout.

Run by `a2rl_bench.inference.remote_generation` as `<python> generation_worker.py --backend vllm|transformers --model
DIR`. It imports only the standard library at start (the vLLM environment need not have a2rl's dependencies);
the `transformers` backend imports `a2rl_bench.inference.generation` (a second engine for the loopback test and for
users without vLLM), the `vllm` backend imports vllm.

Protocol (one JSON object per line; the worker's stdout carries nothing else: library output goes to stderr):
  worker → {"ready": true, "backend": "vllm", "engine": "vllm 0.32.0", "model": DIR}
  client → {"id": 1, "prompts": [str], "prompt_token_ids": [[int]], "max_new_tokens": 192,
            "temperature": 0.0, "top_p": 1.0, "stop": ["Question:"], "seed": null}
  worker → {"id": 1, "completions": [str], "completion_tokens": [int], "seconds": 1.2}
        or {"id": 1, "error": "one line"}
Prompts arrive rendered (the harness applies the chat template) and tokenized (`prompt_token_ids`, no special
tokens added), so both ends decode exactly the same tokens. Completions are cut before the first stop string,
special tokens removed; `completion_tokens` counts tokens through EOS or the token that completed a stop.
EOF on stdin ends the worker.

`--serve PORT` instead offers the same backends behind an OpenAI-compatible `/v1/models` + `/v1/completions`
subset on 127.0.0.1 (what `vllm serve` offers), for testing the endpoint client without vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


class VLLMBackend:
    def __init__(self, model: str):
        import vllm
        from vllm import LLM

        # Extra engine arguments (dtype, gpu_memory_utilization, max_model_len, ...) from the environment.
        extra = json.loads(os.environ.get("A2RL_VLLM_ARGS") or "{}")
        self.llm = LLM(model=model, seed=0, **extra)
        self.engine = f"vllm {vllm.__version__}"

    def generate(self, req: dict) -> dict:
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=req["temperature"], top_p=req.get("top_p", 1.0), max_tokens=req["max_new_tokens"],
            stop=req.get("stop") or None, seed=req.get("seed"), skip_special_tokens=True,
        )  # fmt: skip
        prompts = [{"prompt_token_ids": ids} for ids in req["prompt_token_ids"]]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return {"completions": [o.outputs[0].text for o in outputs],
                "completion_tokens": [len(o.outputs[0].token_ids) for o in outputs]}  # fmt: skip


class TransformersBackend:
    """a2rl's own `generate` (plain transformers, engine off): the loopback second engine."""

    def __init__(self, model: str):
        import transformers

        from a2rl_bench.inference.generation import load_model

        self.loaded = load_model(model)
        self.engine = f"transformers {transformers.__version__} generate"

    def generate(self, req: dict) -> dict:
        from a2rl_bench.inference.generation import generate

        out = generate(self.loaded, req["prompts"], max_new_tokens=req["max_new_tokens"],
                       temperature=req["temperature"], top_p=req.get("top_p", 1.0), stop=req.get("stop") or (),
                       seed=req.get("seed"), batch_size=int(os.environ.get("A2RL_WORKER_BATCH", "16")),
                       engine="generate")  # fmt: skip
        return {"completions": out.completions, "completion_tokens": out.completion_tokens}


BACKENDS = {"vllm": VLLMBackend, "transformers": TransformersBackend}


def answer(backend, req: dict) -> dict:
    started = time.perf_counter()
    try:
        out = backend.generate(req)
    except Exception as e:  # noqa: BLE001 - one request's failure is reported, the worker goes on
        return {"id": req.get("id"), "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    return {"id": req.get("id"), **out, "seconds": time.perf_counter() - started}


def serve_lines(backend, model: str, protocol) -> None:
    def send(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    send({"ready": True, "backend": type(backend).__name__, "engine": backend.engine, "model": model})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            send({"id": None, "error": f"bad request line: {e}"})
            continue
        send(answer(backend, req))


def serve_http(backend, model: str, port: int) -> None:
    """OpenAI-compatible subset: GET /v1/models, POST /v1/completions with token-id prompts."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": model, "object": "model", "root": model}]})
            else:
                self._reply(404, {"error": {"message": "not found"}})

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") != "/v1/completions":
                return self._reply(404, {"error": {"message": "not found"}})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompts = body["prompt"]
            req = {"id": 0, "prompt_token_ids": prompts, "max_new_tokens": body.get("max_tokens", 16),
                   "prompts": [backend.loaded.tokenizer.decode(p) for p in prompts] if hasattr(backend, "loaded")
                   else None, "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
                   "stop": body.get("stop"), "seed": body.get("seed")}  # fmt: skip
            out = answer(backend, req)
            if "error" in out:
                return self._reply(500, {"error": {"message": out["error"]}})
            choices = [{"index": i, "text": text, "finish_reason": None, "token_count": n}
                       for i, (text, n) in enumerate(zip(out["completions"], out["completion_tokens"]))]
            self._reply(200, {"object": "text_completion", "model": model, "choices": choices})

        def log_message(self, *args):  # keep stderr for errors
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(json.dumps({"listening": server.server_address[1]}), file=sys.stderr, flush=True)
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--serve", type=int, default=None, help="OpenAI-compatible HTTP on this port instead")
    args = parser.parse_args()
    # The protocol owns the real stdout; everything else printed (vLLM logs, progress bars) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    backend = BACKENDS[args.backend](args.model)
    if args.serve is not None:
        serve_http(backend, args.model, args.serve)
    else:
        serve_lines(backend, args.model, protocol)


if __name__ == "__main__":
    main()
