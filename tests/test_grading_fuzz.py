"""A short schema-fuzzing run (schemathesis) against a live grader: no 5xx, no status the OpenAPI document
does not list. The two-minute run is `bench/fuzz_grader.py` (result in BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra: pip install -e '.[dev]'")


def _fuzz_module():
    path = Path(__file__).resolve().parents[1] / "bench" / "fuzz_grader.py"
    spec = importlib.util.spec_from_file_location("fuzz_grader", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_grader"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_schema_fuzzer_finds_no_server_error_and_no_undocumented_status(tmp_path):
    result = _fuzz_module().run_fuzz(seconds=20, max_examples=15, workdir=tmp_path)
    assert result.requests > 100, result.schemathesis_tail
    assert result.server_errors == 0, (result.statuses, result.schemathesis_tail)
    assert result.undocumented == [], result.undocumented
    assert result.schemathesis_rc == 0, result.schemathesis_tail
