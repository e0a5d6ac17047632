"""Greedy decoding of given token ids with llama.cpp, for `bench/bench_cpu_grading.py` (bench only: never
imported by a2rl).

Two builds of llama.cpp, named by the request's `build`:

* `wheel`: the `_llama_cpp_cpu` cffi module of the prebuilt llama-cpp-cffi 0.4.42 wheel, installed outside the venv
  (`pip install --no-deps --target DIR llama-cpp-cffi==0.4.42`; its Python wrapper needs transformers < 5, the raw
  module nothing). The wheel was linked against GCC 14's libstdc++: on an older one (Debian 12) it loads with a
  one-symbol shim, `__cxa_call_terminate`, preloaded (`shim_library` builds it). Its library uses AVX2 (no AVX-512,
  no AMX).
* `native`: llama.cpp built on this machine (`-march=native`) from the llama-cpp-python sdist's vendored sources
  by `bench/build_llama_cpp_native.sh DIR`, driven through that sdist's low-level ctypes module (`llama_cpp.llama_cpp`,
  copied into DIR without the package's high-level wrapper).
* `native-noamx`: the same library with the model's "extra buffer types" off (`use_extra_bufts = false`), so the
  Q4_1 weights are not repacked for AMX and its AVX-512 kernels run: on the reference machine (2026-11-29) the AMX
  path ended every row after a few tokens (0 of 16 completions as the other builds', 397 tokens against ~1,300).

`_Api` holds the few calls whose Python spelling differs between the two (buffers, the KV cache's sequence calls);
the decoding itself is one function. The shared prefix is decoded once into sequence 0 and copied (in the KV cache)
to each row's sequence; rows are decoded one token per step all together in one batch (`--batch` rows at a time),
or one row at a time (`--batch 1`). Reads a JSON request on stdin, writes the new token ids per row and the CPU
seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SHIM = 'extern "C" void __cxa_call_terminate(void*) noexcept { std::terminate(); }\n'


def shim_library(folder: Path) -> Path:
    """The libstdc++ shim, built once with g++ into `folder`."""
    lib = folder / "libcxa_call_terminate.so"
    if not lib.exists():
        src = folder / "cxa_call_terminate.cpp"
        src.write_text("#include <exception>\n" + SHIM)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return lib


class _Api:
    """The llama.cpp calls whose Python spelling differs between the wheel's cffi module and the native ctypes one."""

    def __init__(self, build: str) -> None:
        import numpy as np

        self.build = build
        if build == "wheel":
            from llama._llama_cpp_cpu import ffi, lib

            self.lib = lib
            self.logits = lambda ptr, n: np.frombuffer(ffi.buffer(ptr, 4 * n), np.float32)
            self.system_info = lambda: ffi.string(lib.llama_print_system_info()).decode()

            def piece(vocab, token: int) -> bytes:
                buf = ffi.new("char[256]")
                n = lib.llama_token_to_piece(vocab, token, buf, 256, 0, False)
                return ffi.unpack(buf, max(n, 0))

            self.seq_rm = lambda ctx, s: lib.llama_kv_self_seq_rm(ctx, s, -1, -1)
            self.seq_cp = lambda ctx, src, dst: lib.llama_kv_self_seq_cp(ctx, src, dst, -1, -1)
        elif build in ("native", "native-noamx"):
            import ctypes

            from llama_cpp import llama_cpp as lib

            self.lib = lib
            self.logits = lambda ptr, n: np.ctypeslib.as_array(ptr, shape=(n,))
            self.system_info = lambda: lib.llama_print_system_info().decode()

            def piece(vocab, token: int) -> bytes:
                buf = ctypes.create_string_buffer(256)
                n = lib.llama_token_to_piece(vocab, token, buf, 256, 0, False)
                return buf.raw[: max(n, 0)]

            self.seq_rm = lambda ctx, s: lib.llama_memory_seq_rm(lib.llama_get_memory(ctx), s, -1, -1)
            self.seq_cp = lambda ctx, src, dst: lib.llama_memory_seq_cp(lib.llama_get_memory(ctx), src, dst, -1, -1)
        else:
            raise ValueError(f"unknown llama.cpp build {build!r} (wheel, native or native-noamx)")
        self.piece = piece


def decode(request: dict) -> dict:
    import numpy as np

    api = _Api(request.get("build", "wheel"))
    lib = api.lib

    started = time.process_time()
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = 0
    if api.build == "native-noamx":  # no AMX repacking of the weights: AVX-512 (VNNI) kernels
        mparams.use_extra_bufts = False
    model = lib.llama_model_load_from_file(request["gguf"].encode(), mparams)
    vocab = lib.llama_model_get_vocab(model)
    n_vocab = lib.llama_vocab_n_tokens(vocab)
    prefix, rows, slots = request["prefix"], request["rows"], request["batch"]
    longest = len(prefix) + max(len(r) for r in rows) + request["max_new_tokens"] + 8
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = longest * (slots + 1)
    # One decode call holds the prefix, or a whole group's rows: their logits indices are the batch's.
    cparams.n_batch = cparams.n_ubatch = max(512, len(prefix), slots * max(len(r) for r in rows))
    cparams.n_seq_max = slots + 1
    cparams.n_threads = cparams.n_threads_batch = request["threads"]
    ctx = lib.llama_init_from_model(model, cparams)
    loaded = time.process_time()
    batch = lib.llama_batch_init(cparams.n_batch, 0, slots + 1)

    def run(tokens: list[tuple[int, int, int, bool]]) -> None:
        """(token, position, sequence, wants logits) in chunks of n_batch."""
        for start in range(0, len(tokens), cparams.n_batch):
            chunk = tokens[start : start + cparams.n_batch]
            batch.n_tokens = len(chunk)
            for i, (token, pos, seq, logits) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
                batch.seq_id[i][0] = seq
            if lib.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

    def argmax(i: int) -> int:
        return int(api.logits(lib.llama_get_logits_ith(ctx, i), n_vocab).argmax())

    eos, stop = set(request["eos"]), request["stop"]
    pieces: dict[int, str] = {}

    def piece(token: int) -> str:
        if token not in pieces:
            pieces[token] = api.piece(vocab, token).decode("utf-8", errors="replace")
        return pieces[token]

    p = len(prefix)
    run([(t, i, 0, False) for i, t in enumerate(prefix)])
    out: list[list[int]] = [[] for _ in rows]
    for start in range(0, len(rows), slots):
        group = list(range(start, min(start + slots, len(rows))))
        texts = {r: "" for r in group}
        for s, r in enumerate(group, 1):
            api.seq_rm(ctx, s)
            api.seq_cp(ctx, 0, s)
        tokens = [(t, p + i, s, i == len(rows[r]) - 1) for s, r in enumerate(group, 1) for i, t in enumerate(rows[r])]
        run(tokens)
        ends = list(np.cumsum([len(rows[r]) for r in group]) - 1)
        live = {r: (s, ends[k]) for k, (s, r) in enumerate(zip(range(1, len(group) + 1), group))}
        while live:
            step = []
            for r, (s, at) in list(live.items()):
                token = argmax(at)
                out[r].append(token)
                texts[r] += piece(token)
                if token in eos or len(out[r]) >= request["max_new_tokens"] or any(x in texts[r] for x in stop):
                    del live[r]
                else:
                    step.append((r, token, p + len(rows[r]) + len(out[r]) - 1, s))
            if not step:
                break
            run([(t, pos, s, True) for _, t, pos, s in step])
            live = {r: (s, i) for i, (r, _, _, s) in enumerate(step)}
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    cpu_s = time.process_time() - loaded
    return {"new_tokens": out, "load_cpu_s": loaded - started, "cpu_s": cpu_s, "system_info": api.system_info()}


if __name__ == "__main__":
    print(json.dumps(decode(json.loads(sys.stdin.read()))))
