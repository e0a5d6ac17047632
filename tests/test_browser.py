"""What a user sees in a browser, checked in a real one (issue #36): the Prefect UI of a server that `a2rl server
start` put on a non-default port shows a run's flow page with its subflows, and an analysis's report.html
loads every figure with no console error.

Headless Chromium is Debian's `chromium` (the Playwright CDN is not reachable), driven by Playwright; both are
installed by `make test` (the Makefile's `browser` target). Screenshots are kept as artifacts under
results/browser-screenshots/ (printed), for a person to look at what the test saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from live_server import free_port, keep_migrated_db, seed_migrated_db
import prefect_http

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("A2RL_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = REPO / "results" / "browser-screenshots"
SUBFLOWS = ("provision-workspace", "agent-session", "final-grading", "summarize-run")

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is installed by `make test` (make browser)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: `make browser` installs Debian's chromium", allow_module_level=True)


def a2rl_bench(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "a2rl_bench.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def served_run(tmp_path_factory, tiny_model_dir):
    """`a2rl server start` on a free (non-default) port, one real run against it, and its analysis."""
    tmp = tmp_path_factory.mktemp("browser")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "A2RL_DEBUG")}
    env |= {"PREFECT_HOME": str(tmp / "prefect"), "A2RL_HOME": str(tmp / "a2rl-home"),
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "A2RL_SFT_TRAIN_S": "4", "A2RL_SFT_MAX_STEPS": "4", "A2RL_SFT_BATCH_SIZE": "4",
            "A2RL_SFT_MAX_LENGTH": "512"}  # fmt: skip
    seed_migrated_db(tmp / "prefect")
    up = a2rl_bench(["server", "start", "--port", str(port), "--no-worker"], env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    keep_migrated_db(tmp / "prefect")
    try:
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
        results = tmp / "a.duckdb"
        # One submission is enough for the UI's subflows and the report's figures: the cap ends the session after
        # its grading instead of after the rounds that fill the rest of the 30 s.
        run = a2rl_bench(["run", "--base-model", str(tiny_model_dir), "--budget", "30", "--val-limit", "1",
                    "--test-limit", "1", "--sandbox", "off", "--results", str(results),
                    "--max-submissions", "1"], env)  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        analysis = a2rl_bench(["analyze", "--results", str(results), "--out", str(tmp / "analysis")], env)
        assert analysis.returncode == 0, analysis.stdout[-2000:] + analysis.stderr[-2000:]
        yield f"http://127.0.0.1:{port}", tmp / "analysis" / "report.html"
    finally:
        a2rl_bench(["server", "stop"], env, timeout=300)


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_the_prefect_ui_on_another_port_shows_the_runs_subflows(browser, served_run):
    base, _ = served_run
    api = f"{base}/api"
    runs = prefect_http.post(f"{api}/flow_runs/filter", json={"flows": {"name": {"any_": ["benchmark-run"]}}}).json()
    assert len(runs) == 1
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{base}/runs/flow-run/{runs[0]['id']}", wait_until="networkidle")
    page.get_by_text("Subflow Runs", exact=False).first.click()
    for name in SUBFLOWS:
        page.get_by_text(name, exact=False).first.wait_for(timeout=60_000)
    screenshot(page, "prefect-flow-run")
    text = page.inner_text("body")
    assert all(name in text for name in SUBFLOWS) and "4 Flow runs" in text, text[:3000]
    assert "Can't connect" not in text
    assert not [e for e in errors if "ERR_CONNECTION_REFUSED" in e or "Failed to fetch" in e], errors


def test_the_analysis_report_loads_every_figure_with_no_console_error(browser, served_run):
    _, report = served_run
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(report.as_uri(), wait_until="load")
    images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.src.slice(0, 40), i.complete && i.naturalWidth])")
    screenshot(page, "report-html")
    assert images, "report.html has no figures"
    broken = [src for src, width in images if not width]
    assert not broken, json.dumps(images)[:2000]
    assert not errors, errors


def test_the_benchmark_runs_own_artifacts_tab_shows_the_report_submissions_and_trajectory(browser, served_run):
    """The run the user started (not its summarize-run subflow) carries the report, the submissions table and the
    score trajectory: its Artifacts tab said "This run did not produce any artifacts"."""
    base, _ = served_run
    api = f"{base}/api"
    run = prefect_http.post(f"{api}/flow_runs/filter", json={"flows": {"name": {"any_": ["benchmark-run"]}}}).json()[0]
    mine = {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}}
    own = prefect_http.post(f"{api}/artifacts/filter", json=mine).json()
    keys = sorted(a["key"] for a in own if a.get("key"))
    assert [k for k in keys if k.endswith(("-submissions", "-trajectory"))] and len(keys) == 3, keys
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/runs/flow-run/{run['id']}", wait_until="networkidle")
    page.get_by_text("Artifacts", exact=True).first.click()
    page.get_by_text(keys[-1], exact=False).first.wait_for(timeout=60_000)
    screenshot(page, "prefect-flow-run-artifacts")
    text = page.inner_text("body")
    assert "did not produce any artifacts" not in text, text[:3000]
    assert all(key in text for key in keys), (keys, text[:3000])
