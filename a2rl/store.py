"""The results store: runs, submissions, evaluations and events in one DuckDB file, safe for many processes.

DuckDB lets only one process open a file read-write, and while it does no other process can open it even
read-only. So every open (read or write) takes an exclusive `flock` on `<db>.lock`, the connection lives for
one short transaction, and nothing stays open between calls. Every write is an upsert on a primary key, so a
retried run replaces its rows instead of duplicating them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import duckdb

from a2rl.locks import exclusive_lock
from a2rl.records import EvalResult, LedgerEntry, RunConfig, RunSummary, utcnow

if TYPE_CHECKING:  # pandas is only needed by readers; writers (the grading service) skip its import time
    import pandas as pd

EvalKind = Literal["baseline", "submission", "final"]

# Ordered migrations: entry i takes the schema from version i to i + 1. Append only; never edit a shipped one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        config_hash VARCHAR,
        task VARCHAR,
        variant VARCHAR,
        variant_label VARCHAR,
        agent VARCHAR,
        driver VARCHAR,
        mode VARCHAR,
        base_model VARCHAR,
        seed BIGINT,
        budget_s DOUBLE,
        protocol VARCHAR,
        status VARCHAR,
        started_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ,
        baseline_val DOUBLE,
        baseline_test DOUBLE,
        best_val DOUBLE,
        best_submission_id BIGINT,
        final_submission_id BIGINT,
        final_test DOUBLE,
        delta_test DOUBLE,
        n_submissions BIGINT,
        n_scored BIGINT,
        agent_seconds DOUBLE,
        grading_seconds DOUBLE,
        wall_seconds DOUBLE,
        phase_seconds_json JSON,
        error VARCHAR,
        config_json JSON,
        harness_dir VARCHAR,
        updated_at TIMESTAMPTZ
    );
    CREATE TABLE submissions (
        run_id VARCHAR,
        submission_id BIGINT,
        created_at TIMESTAMPTZ,
        model_path VARCHAR,
        weights_hash VARCHAR,
        size_bytes BIGINT,
        status VARCHAR,
        split VARCHAR,
        score DOUBLE,
        cached BOOLEAN,
        eval_seconds DOUBLE,
        agent_elapsed_s DOUBLE,
        error VARCHAR,
        PRIMARY KEY (run_id, submission_id)
    );
    CREATE TABLE evaluations (
        run_id VARCHAR,
        eval_key VARCHAR,
        kind VARCHAR CHECK (kind IN ('baseline', 'submission', 'final')),
        submission_id BIGINT,
        split VARCHAR,
        score DOUBLE,
        n BIGINT,
        n_correct BIGINT,
        evaluator_id VARCHAR,
        weights_hash VARCHAR,
        generated_tokens BIGINT,
        duration_s DOUBLE,
        cached BOOLEAN,
        created_at TIMESTAMPTZ,
        PRIMARY KEY (run_id, eval_key)
    );
    CREATE TABLE events (
        run_id VARCHAR,
        seq BIGINT,
        created_at TIMESTAMPTZ,  -- not `at`: AT is reserved in DuckDB SQL and would need quoting everywhere
        kind VARCHAR,
        detail_json JSON,
        PRIMARY KEY (run_id, seq)
    );
    -- Sums are cast to BIGINT: DuckDB's sum(BIGINT) is HUGEINT, which pandas receives as float64.
    CREATE VIEW leaderboard AS
    SELECT task, variant, protocol, agent, driver, mode,
           count(*)::BIGINT AS n_runs,
           count(delta_test)::BIGINT AS n_with_delta,
           avg(delta_test) AS mean_delta_test,
           stddev_samp(delta_test) AS sd_delta_test,
           avg(final_test) AS mean_final_test,
           avg(baseline_test) AS mean_baseline_test,
           sum(n_submissions)::BIGINT AS total_submissions
    FROM runs
    WHERE status = 'completed'
    GROUP BY task, variant, protocol, agent, driver, mode
    ORDER BY task, mean_delta_test DESC NULLS LAST;
    CREATE VIEW latest_runs AS
    SELECT * FROM runs ORDER BY started_at DESC NULLS LAST, run_id;
    """,
    # 2: post-hoc facts (process metrics, failure class, route labels), LLM calls, resource samples, and the
    # views the analysis flow reads. Only completed runs count in the aggregate views.
    """
    ALTER TABLE runs ADD COLUMN failure_class VARCHAR;
    ALTER TABLE submissions ADD COLUMN route VARCHAR;
    ALTER TABLE submissions ADD COLUMN code_sha VARCHAR;
    CREATE TABLE metrics (
        run_id VARCHAR,
        name VARCHAR,
        value DOUBLE,       -- numbers and booleans (1/0)
        text VARCHAR,       -- labels, and lists/dicts as JSON
        PRIMARY KEY (run_id, name)
    );
    CREATE TABLE llm_calls (
        run_id VARCHAR,
        seq BIGINT,
        created_at TIMESTAMPTZ,
        agent_elapsed_s DOUBLE,
        model VARCHAR,
        input_tokens BIGINT,
        output_tokens BIGINT,
        cache_read_tokens BIGINT,
        cache_write_tokens BIGINT,
        cost_usd DOUBLE,
        latency_s DOUBLE,
        error VARCHAR,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE resources (
        run_id VARCHAR,
        seq BIGINT,
        created_at TIMESTAMPTZ,
        elapsed_s DOUBLE,
        n_procs BIGINT,
        cpu_percent DOUBLE,
        rss_bytes BIGINT,
        workspace_bytes BIGINT,
        gpu_util_percent DOUBLE,
        gpu_mem_bytes BIGINT,
        PRIMARY KEY (run_id, seq)
    );
    -- Mean, spread and the Δ values themselves per setting, so a caller can bootstrap its own CI;
    -- the normal-approximation interval is only a quick look (it is too narrow for a handful of seeds).
    CREATE VIEW leaderboard_ci AS
    SELECT task, variant, any_value(variant_label) AS variant_label, protocol, agent, driver, mode, base_model,
           count(delta_test)::BIGINT AS n,
           avg(delta_test) AS mean_delta,
           stddev_samp(delta_test) AS sd_delta,
           stddev_samp(delta_test) / sqrt(count(delta_test)) AS se_delta,
           avg(delta_test) - 1.96 * stddev_samp(delta_test) / sqrt(count(delta_test)) AS ci95_normal_low,
           avg(delta_test) + 1.96 * stddev_samp(delta_test) / sqrt(count(delta_test)) AS ci95_normal_high,
           avg((delta_test > 0)::DOUBLE) AS improve_rate,
           list(delta_test ORDER BY seed, run_id) FILTER (WHERE delta_test IS NOT NULL) AS deltas
    FROM runs
    WHERE status = 'completed'
    GROUP BY task, variant, protocol, agent, driver, mode, base_model;
    -- One cell per (setting, mode): best and worst mode per task among the modes an agent setting ran.
    CREATE VIEW mode_task_matrix AS
    WITH cells AS (
        SELECT task, variant, any_value(variant_label) AS variant_label, protocol, agent, driver, base_model, mode,
               count(*)::BIGINT AS n, avg(delta_test) AS mean_delta, median(delta_test) AS median_delta,
               max(delta_test) AS max_delta
        FROM runs
        WHERE status = 'completed' AND delta_test IS NOT NULL
        GROUP BY task, variant, protocol, agent, driver, base_model, mode
    )
    SELECT *,
           count(*) OVER setting > 1 AND mean_delta = max(mean_delta) OVER setting AS is_best,
           count(*) OVER setting > 1 AND mean_delta = min(mean_delta) OVER setting AS is_worst
    FROM cells
    WINDOW setting AS (PARTITION BY task, variant, protocol, agent, driver, base_model);
    -- Tokens = input + output + cache read + cache write, cumulated in call order.
    CREATE VIEW llm_usage_cumulative AS
    SELECT run_id, seq, created_at,
           sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0) + coalesce(cache_read_tokens, 0)
               + coalesce(cache_write_tokens, 0)) OVER w::BIGINT AS cum_tokens,
           sum(coalesce(cost_usd, 0)) OVER w AS cum_cost_usd
    FROM llm_calls
    WINDOW w AS (PARTITION BY run_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);
    -- Best-so-far after each submission against the feedback split's baseline. Before the first scored
    -- submission the base model stands, so the improvement is 0 there.
    CREATE VIEW scaling_curve AS
    WITH s AS (
        SELECT s.run_id, s.submission_id, s.created_at, s.agent_elapsed_s, s.split, s.score, s.status,
               max(s.score) OVER (PARTITION BY s.run_id ORDER BY s.submission_id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS best_so_far
        FROM submissions s
    )
    SELECT s.run_id, r.task, r.variant, r.variant_label, r.protocol, r.agent, r.driver, r.mode, r.base_model,
           r.seed, r.budget_s, s.submission_id, s.agent_elapsed_s, s.split, s.status, s.score, s.best_so_far,
           CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END AS baseline,
           coalesce(s.best_so_far - CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END, 0.0)
               AS improvement_so_far,
           coalesce(u.cum_tokens, 0)::BIGINT AS cum_tokens,
           coalesce(u.cum_cost_usd, 0.0) AS cum_cost_usd
    FROM s
    JOIN runs r USING (run_id)
    ASOF LEFT JOIN llm_usage_cumulative u ON s.run_id = u.run_id AND s.created_at >= u.created_at
    WHERE r.status = 'completed';
    -- Baseline evaluations of the same base model on the same evaluator across runs. Cached rows repeat a
    -- stored score and say nothing about noise, so only fresh evaluations count as re-evaluations. With
    -- fewer than two, the floor falls back to two binomial standard errors of the score (labelled so).
    CREATE VIEW noise_floor AS
    WITH b AS (
        SELECT r.task, r.variant, r.base_model, e.split, e.evaluator_id, e.score, e.n, e.cached
        FROM evaluations e JOIN runs r USING (run_id)
        WHERE e.kind = 'baseline' AND e.score IS NOT NULL
    ), g AS (
        SELECT task, variant, base_model, split, evaluator_id,
               count(*) FILTER (WHERE NOT coalesce(cached, false))::BIGINT AS k_reevaluations,
               count(*)::BIGINT AS n_rows,
               avg(score) AS mean_baseline,
               stddev_samp(score) FILTER (WHERE NOT coalesce(cached, false)) AS sd_reevaluations,
               max(score) - min(score) AS range_baseline,
               max(n) AS n_items
        FROM b
        GROUP BY task, variant, base_model, split, evaluator_id
    )
    SELECT *,
           100.0 * sqrt(greatest(mean_baseline / 100.0 * (1 - mean_baseline / 100.0), 0) / greatest(n_items, 1))
               AS binomial_se,
           CASE WHEN k_reevaluations >= 2 THEN 2 * sd_reevaluations
                ELSE 2 * 100.0 * sqrt(greatest(mean_baseline / 100.0 * (1 - mean_baseline / 100.0), 0)
                                      / greatest(n_items, 1)) END AS noise_floor,
           CASE WHEN k_reevaluations >= 2 THEN 're-evaluations (2 sd)'
                ELSE 'binomial approximation (2 se)' END AS noise_floor_source
    FROM g;
    -- heldout runs: how much of the validation gain of the best submission survives on the hidden test set.
    CREATE VIEW selection_gap AS
    SELECT run_id, task, variant, variant_label, agent, driver, mode, base_model, seed,
           best_val - baseline_val AS val_gain, delta_test AS test_gain,
           (best_val - baseline_val) - delta_test AS selection_gap,
           final_submission_id = best_submission_id AS final_is_val_best
    FROM runs
    WHERE status = 'completed' AND protocol = 'heldout' AND best_val IS NOT NULL AND baseline_val IS NOT NULL
          AND delta_test IS NOT NULL;
    CREATE VIEW route_distribution AS
    SELECT r.task, r.variant, r.agent, r.driver, r.mode, coalesce(s.route, 'unlabelled') AS route,
           count(*)::BIGINT AS n_submissions, count(DISTINCT s.run_id)::BIGINT AS n_runs
    FROM submissions s JOIN runs r USING (run_id)
    GROUP BY ALL;
    -- Submissions whose route label breaks the run's mode (README, "Tasks, agents, modes": modes are checked, not only prompted).
    CREATE VIEW mode_violations AS
    SELECT s.run_id, r.task, r.agent, r.mode, s.submission_id, s.route
    FROM submissions s JOIN runs r USING (run_id)
    WHERE (r.mode = 'sft-only' AND s.route IN ('GRPO', 'PPO', 'SFT+RL'))
       OR (r.mode = 'rl-only' AND s.route IN ('SFT', 'DPO'));
    CREATE VIEW failure_classes AS
    SELECT task, variant, agent, driver, mode, coalesce(failure_class, 'unclassified') AS failure_class,
           count(*)::BIGINT AS n_runs
    FROM runs
    WHERE status IN ('completed', 'failed')
    GROUP BY ALL;
    """,
    # 3: mode violations follow `a2rl.routes.check_mode` (its label set: RLOO and RL count as RL; DPO is
    # neither SFT nor RL; under rl-only, no training method at all is a violation too).
    """
    CREATE OR REPLACE VIEW mode_violations AS
    SELECT s.run_id, r.task, r.agent, r.mode, s.submission_id, s.route
    FROM submissions s JOIN runs r USING (run_id)
    WHERE s.route IS NOT NULL
      AND ((r.mode = 'sft-only' AND s.route NOT IN ('SFT', 'copy', 'none'))
           OR (r.mode = 'rl-only' AND s.route NOT IN ('GRPO', 'PPO', 'RLOO', 'RL', 'SFT+RL')));
    -- The agents' LLM-call records (agents/base.py LLMCallEvent) carry these too; tool calls get a table.
    ALTER TABLE llm_calls ADD COLUMN call BIGINT;
    ALTER TABLE llm_calls ADD COLUMN attempt BIGINT;
    ALTER TABLE llm_calls ADD COLUMN status BIGINT;
    ALTER TABLE llm_calls ADD COLUMN stop_reason VARCHAR;
    ALTER TABLE llm_calls ADD COLUMN source VARCHAR;
    CREATE TABLE tool_calls (
        run_id VARCHAR,
        seq BIGINT,
        created_at TIMESTAMPTZ,
        call BIGINT,
        tool VARCHAR,
        ok BOOLEAN,
        exit_code BIGINT,
        duration_s DOUBLE,
        output_chars BIGINT,
        error VARCHAR,
        source VARCHAR,
        input_json JSON,
        PRIMARY KEY (run_id, seq)
    );
    """,
    # 4: per-item results; settings keyed by everything but the seed (a2rl.setting.SETTING_KEY); runs the analysis
    # must not count (not completed, infrastructure failures) set apart with the reason; t-intervals over seeds
    # and the baseline's item-level sampling error beside every Δ; the paper's tables.
    """
    CREATE TABLE item_results (
        run_id VARCHAR,
        eval_key VARCHAR,
        split VARCHAR,
        item_id VARCHAR,
        score DOUBLE,       -- the item's graded value: 1/0 for right/wrong, else the task's value (a judge's 0.5)
        correct BOOLEAN,
        tokens BIGINT,      -- generated tokens of this item, where the evaluator counted them
        PRIMARY KEY (run_id, eval_key, item_id)
    );
    -- Two-sided 95% Student t quantile (df 1..30 tabulated, then 1.96 + 2.4/df, within 0.003 of exact).
    CREATE OR REPLACE MACRO t975(df) AS CASE WHEN df IS NULL OR df < 1 THEN NULL
        WHEN df <= 30 THEN [12.706::DOUBLE, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.16, 2.145, 2.131, 2.12, 2.11, 2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056, 2.052, 2.048, 2.045, 2.042][df::BIGINT] ELSE 1.96 + 2.4 / df END;
    -- Agresti-Coull standard error of a 0-100 score on n items: never 0, not even at a score of 0 or 100.
    CREATE OR REPLACE MACRO binomial_se(score, n) AS 100.0 * sqrt(
        ((score / 100.0 * n + 2) / (n + 4)) * (1 - (score / 100.0 * n + 2) / (n + 4)) / (n + 4));
    CREATE OR REPLACE VIEW run_settings AS
    WITH ev AS (
        SELECT run_id,
               coalesce(min(evaluator_id) FILTER (WHERE kind = 'baseline' AND split = 'test'),
                        min(evaluator_id) FILTER (WHERE split = 'test')) AS evaluator_id
        FROM evaluations GROUP BY run_id
    ), breaches AS (
        SELECT run_id, count(*)::BIGINT AS n_mode_breaches FROM mode_violations GROUP BY run_id
    ), usage AS (
        SELECT run_id, sum(coalesce(cost_usd, 0)) AS cost_usd,
               sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0) + coalesce(cache_read_tokens, 0)
                   + coalesce(cache_write_tokens, 0))::BIGINT AS llm_tokens
        FROM llm_calls GROUP BY run_id
    ), keyed AS (
        SELECT r.*,
               CASE WHEN r.config_json IS NULL THEN 'unknown'
                    ELSE 'val:' || coalesce(json_extract_string(r.config_json, '$.val_limit'), 'all')
                         || ' test:' || coalesce(json_extract_string(r.config_json, '$.test_limit'), 'all')
               END AS item_selection,
               coalesce(ev.evaluator_id, 'unknown') AS evaluator_id,
               coalesce(b.n_mode_breaches, 0)::BIGINT AS n_mode_breaches,
               coalesce(u.cost_usd, 0.0) AS cost_usd, coalesce(u.llm_tokens, 0)::BIGINT AS llm_tokens,
               CASE WHEN r.status IS DISTINCT FROM 'completed' THEN 'run ' || coalesce(r.status, 'without a status')
                    WHEN r.failure_class = 'infrastructure failure' THEN 'infrastructure failure'
                    WHEN r.delta_test IS NULL THEN 'no final test score'
               END AS excluded_because
        FROM runs r LEFT JOIN ev USING (run_id) LEFT JOIN breaches b USING (run_id) LEFT JOIN usage u USING (run_id)
    )
    SELECT *, substr(md5(concat_ws('|', coalesce(task, 'unknown'), coalesce(variant, 'unknown'), item_selection,
                  coalesce(base_model, 'unknown'), coalesce(agent, 'unknown'), coalesce(driver, 'unknown'),
                  coalesce(mode, 'unknown'), coalesce(protocol, 'unknown'), coalesce(budget_s::VARCHAR, 'unknown'),
                  evaluator_id)), 1, 12) AS setting_id
    FROM keyed;
    -- The runs every aggregate counts; `excluded_runs` says how many others there are and why.
    CREATE OR REPLACE VIEW analysed_runs AS SELECT * FROM run_settings WHERE excluded_because IS NULL;
    CREATE OR REPLACE VIEW excluded_runs AS
    SELECT excluded_because AS reason, count(*)::BIGINT AS n_runs
    FROM run_settings WHERE excluded_because IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1;
    -- The base model's item-level sampling error on one item selection and evaluator: the binomial (Agresti-Coull)
    -- standard error for right/wrong items, sd/sqrt(n) of the item scores (the bootstrap SE) otherwise. A Δ within
    -- 2 SE of 0 cannot be told from drawing other items. Re-evaluations of a greedy evaluator repeat themselves
    -- and say nothing about this, so they are only counted.
    CREATE OR REPLACE VIEW noise_floor AS
    WITH items AS (
        SELECT run_id, eval_key, count(*)::BIGINT AS n_items, stddev_pop(score) AS sd_item,
               bool_and(score IN (0, 1)) AS is_binary
        FROM item_results GROUP BY run_id, eval_key
    ), b AS (
        SELECT rs.task, rs.variant, rs.item_selection, rs.base_model, e.evaluator_id, e.split, e.score, e.cached,
               coalesce(i.n_items, e.n) AS n_items, i.sd_item, coalesce(i.is_binary, true) AS is_binary
        FROM evaluations e JOIN run_settings rs USING (run_id) LEFT JOIN items i USING (run_id, eval_key)
        WHERE e.kind = 'baseline' AND e.score IS NOT NULL
    ), g AS (
        SELECT task, variant, item_selection, base_model, evaluator_id, split,
               count(*)::BIGINT AS n_rows,
               count(*) FILTER (WHERE NOT coalesce(cached, false))::BIGINT AS k_reevaluations,
               avg(score) AS mean_baseline, max(score) - min(score) AS range_baseline,
               max(n_items)::BIGINT AS n_items, bool_and(is_binary) AS is_binary, avg(sd_item) AS sd_item
        FROM b GROUP BY task, variant, item_selection, base_model, evaluator_id, split
    )
    SELECT *,
           CASE WHEN is_binary THEN binomial_se(mean_baseline, n_items)
                ELSE 100.0 * sd_item / sqrt(greatest(n_items, 1)) END AS noise_se,
           2 * CASE WHEN is_binary THEN binomial_se(mean_baseline, n_items)
                    ELSE 100.0 * sd_item / sqrt(greatest(n_items, 1)) END AS noise_floor,
           CASE WHEN is_binary THEN 'binomial SE of the baseline (Agresti-Coull), x2'
                ELSE 'bootstrap SE of the baseline item scores, x2' END AS noise_floor_source
    FROM g;
    -- One row per setting (everything but the seed): n seeds, mean Δ with a t-interval over seeds (none for n < 2),
    -- the noise floor of its task and item selection beside it, and its mode breaches.
    CREATE OR REPLACE VIEW leaderboard_ci AS
    WITH s AS (
        SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id, any_value(variant_label) AS variant_label,
               count(*)::BIGINT AS n, avg(delta_test) AS mean_delta, stddev_samp(delta_test) AS sd_delta,
               avg(final_test) AS mean_final_test, avg(baseline_test) AS mean_baseline_test,
               avg((delta_test > 0)::DOUBLE) AS improve_rate,
               sum(n_mode_breaches)::BIGINT AS n_mode_breaches,
               count(*) FILTER (WHERE n_mode_breaches > 0)::BIGINT AS runs_with_mode_breaches,
               list(seed ORDER BY seed, run_id) AS seeds,
               list(delta_test ORDER BY seed, run_id) AS deltas
        FROM analysed_runs GROUP BY setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id
    )
    SELECT s.*, sd_delta / sqrt(n) AS se_delta,
           mean_delta - t975(n - 1) * sd_delta / sqrt(n) AS ci_low,
           mean_delta + t975(n - 1) * sd_delta / sqrt(n) AS ci_high,
           CASE WHEN n < 2 THEN 'n = 1: no interval' ELSE 't-interval over seeds' END AS interval,
           nf.noise_se, nf.noise_floor, nf.noise_floor_source
    FROM s LEFT JOIN noise_floor nf
      ON nf.split = 'test' AND (nf.task, nf.variant, nf.item_selection, nf.base_model, nf.evaluator_id)
         = (s.task, s.variant, s.item_selection, s.base_model, s.evaluator_id);
    CREATE OR REPLACE VIEW leaderboard AS SELECT * FROM leaderboard_ci ORDER BY task, mean_delta DESC NULLS LAST;
    -- One cell per (setting, mode); best and worst mode per task among the modes one agent setting ran.
    CREATE OR REPLACE VIEW mode_task_matrix AS
    SELECT *,
           count(*) OVER agent_setting > 1 AND mean_delta = max(mean_delta) OVER agent_setting AS is_best,
           count(*) OVER agent_setting > 1 AND mean_delta = min(mean_delta) OVER agent_setting AS is_worst
    FROM leaderboard_ci
    WINDOW agent_setting AS (PARTITION BY task, variant, item_selection, base_model, agent, driver, protocol, budget_s,
                                          evaluator_id);
    -- Best-so-far after each submission against the feedback split's baseline. The base model is always a
    -- candidate (it stands when nothing better was submitted), so the curve starts at 0 and never goes below it.
    CREATE OR REPLACE VIEW scaling_curve AS
    WITH s AS (
        SELECT s.run_id, s.submission_id, s.created_at, s.agent_elapsed_s, s.split, s.score, s.status,
               max(s.score) OVER (PARTITION BY s.run_id ORDER BY s.submission_id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS best_so_far
        FROM submissions s
    )
    SELECT s.run_id, r.setting_id, r.task, r.variant, r.variant_label, r.item_selection, r.protocol, r.agent, r.driver,
           r.mode, r.base_model, r.evaluator_id, r.seed, r.budget_s, s.submission_id, s.agent_elapsed_s, s.split,
           s.status, s.score, s.best_so_far,
           CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END AS baseline,
           greatest(coalesce(s.best_so_far - CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END,
                             0.0), 0.0) AS improvement_so_far,
           coalesce(u.cum_tokens, 0)::BIGINT AS cum_tokens,
           coalesce(u.cum_cost_usd, 0.0) AS cum_cost_usd
    FROM s
    JOIN analysed_runs r USING (run_id)
    ASOF LEFT JOIN llm_usage_cumulative u ON s.run_id = u.run_id AND s.created_at >= u.created_at;
    CREATE OR REPLACE VIEW selection_gap AS
    SELECT run_id, setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id, variant_label, seed,
           best_val - baseline_val AS val_gain, delta_test AS test_gain,
           (best_val - baseline_val) - delta_test AS selection_gap,
           final_submission_id = best_submission_id AS final_is_val_best
    FROM analysed_runs
    WHERE protocol = 'heldout' AND best_val IS NOT NULL AND baseline_val IS NOT NULL;
    CREATE OR REPLACE VIEW route_distribution AS
    SELECT r.task, r.variant, r.agent, r.driver, r.mode, coalesce(s.route, 'unlabelled') AS route,
           count(*)::BIGINT AS n_submissions, count(DISTINCT s.run_id)::BIGINT AS n_runs
    FROM submissions s JOIN analysed_runs r USING (run_id)
    GROUP BY ALL;
    -- Every run, infrastructure failures and unfinished runs included (they are counted here, nowhere else).
    CREATE OR REPLACE VIEW failure_classes AS
    SELECT task, variant, agent, driver, mode, status, coalesce(failure_class, 'unclassified') AS failure_class,
           count(*)::BIGINT AS n_runs
    FROM runs GROUP BY ALL;
    -- Paper table: system x task absolute test scores, with the base model's row (its interval: 1.96 x the
    -- item-level SE, since the baseline does not vary by seed).
    CREATE OR REPLACE VIEW system_task_scores AS
    SELECT 'system' AS row_kind, agent, driver, mode, protocol, budget_s, task, variant, item_selection, base_model,
           evaluator_id, count(*)::BIGINT AS n, avg(final_test) AS mean_score,
           avg(final_test) - t975(count(*) - 1) * stddev_samp(final_test) / sqrt(count(*)) AS ci_low,
           avg(final_test) + t975(count(*) - 1) * stddev_samp(final_test) / sqrt(count(*)) AS ci_high,
           't-interval over seeds' AS interval
    FROM analysed_runs GROUP BY ALL
    UNION ALL
    SELECT 'baseline', 'Baseline', NULL, NULL, NULL, NULL, r.task, r.variant, r.item_selection, r.base_model,
           r.evaluator_id, any_value(nf.n_items)::BIGINT, avg(r.baseline_test),
           avg(r.baseline_test) - 1.96 * any_value(nf.noise_se), avg(r.baseline_test) + 1.96 * any_value(nf.noise_se),
           'item-level (binomial or bootstrap SE); n = items'
    FROM analysed_runs r LEFT JOIN noise_floor nf
      ON nf.split = 'test' AND (nf.task, nf.variant, nf.item_selection, nf.base_model, nf.evaluator_id)
         = (r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id)
    GROUP BY r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id;
    -- Paper table: the best feedback-split gain reached within 25%, 50% and 100% of the agent-time budget, from
    -- the submission timeline (the base model stands until something beats it, so it is never below 0).
    CREATE OR REPLACE VIEW budget_deltas AS
    WITH per_run AS (
        SELECT r.run_id, r.setting_id, f.budget_fraction,
               greatest(coalesce(max(s.score - CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END)
                                 FILTER (WHERE s.status = 'scored'
                                         AND s.agent_elapsed_s <= f.budget_fraction * r.budget_s), 0.0), 0.0)
                   AS delta_feedback
        FROM analysed_runs r CROSS JOIN (SELECT unnest([0.25, 0.5, 1.0]) AS budget_fraction) f
        LEFT JOIN submissions s ON s.run_id = r.run_id
        GROUP BY r.run_id, r.setting_id, f.budget_fraction
    )
    SELECT l.setting_id, l.task, l.variant, l.item_selection, l.base_model, l.agent, l.driver, l.mode, l.protocol,
           l.budget_s, l.evaluator_id, p.budget_fraction, count(*)::BIGINT AS n,
           avg(p.delta_feedback) AS mean_delta,
           avg(p.delta_feedback) - t975(count(*) - 1) * stddev_samp(p.delta_feedback) / sqrt(count(*)) AS ci_low,
           avg(p.delta_feedback) + t975(count(*) - 1) * stddev_samp(p.delta_feedback) / sqrt(count(*)) AS ci_high
    FROM per_run p JOIN leaderboard_ci l USING (setting_id)
    GROUP BY ALL;
    -- Paper table: what a run cost (driver LLM calls) and Δ per dollar, per setting.
    CREATE OR REPLACE VIEW run_costs AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id, count(*)::BIGINT AS n,
           avg(cost_usd) AS mean_cost_usd, sum(cost_usd) AS total_cost_usd, avg(llm_tokens) AS mean_llm_tokens,
           avg(delta_test) AS mean_delta,
           CASE WHEN avg(cost_usd) > 0 THEN avg(delta_test) / avg(cost_usd) END AS delta_per_usd
    FROM analysed_runs GROUP BY ALL;
    -- Paper table: which route produced the final pick, per mode.
    CREATE OR REPLACE VIEW final_routes AS
    SELECT r.mode, coalesce(s.route, CASE WHEN r.final_submission_id IS NULL THEN 'base model (no pick)'
                                          ELSE 'unlabelled' END) AS final_route,
           count(*)::BIGINT AS n_runs, avg(r.delta_test) AS mean_delta
    FROM analysed_runs r LEFT JOIN submissions s ON s.run_id = r.run_id AND s.submission_id = r.final_submission_id
    GROUP BY ALL;
    -- Submissions whose route broke the run's mode, per mode and agent (completed runs, infrastructure included).
    CREATE OR REPLACE VIEW mode_breaches AS
    SELECT mode, agent, driver, count(*)::BIGINT AS n_runs,
           count(*) FILTER (WHERE n_mode_breaches > 0)::BIGINT AS runs_with_breaches,
           sum(n_mode_breaches)::BIGINT AS n_breaches
    FROM run_settings WHERE status = 'completed' GROUP BY ALL;
    -- Final pick against the base model on the same hidden-test items (the final evaluation, or under `paper` the
    -- picked submission's test evaluation): the input of the paired item-level interval of one run's Δ.
    CREATE OR REPLACE VIEW item_pairs AS
    WITH final_eval AS (
        SELECT e.run_id, e.eval_key FROM evaluations e JOIN runs r USING (run_id)
        WHERE e.split = 'test' AND (e.kind = 'final' OR (e.kind = 'submission' AND r.protocol = 'paper'
                                                          AND e.submission_id = r.final_submission_id))
        QUALIFY row_number() OVER (PARTITION BY e.run_id ORDER BY e.kind = 'final' DESC, e.eval_key) = 1
    ), base_eval AS (
        SELECT run_id, min(eval_key) AS eval_key FROM evaluations
        WHERE kind = 'baseline' AND split = 'test' GROUP BY run_id
    )
    SELECT f.run_id, fi.item_id, bi.score AS base_score, fi.score AS final_score
    FROM final_eval f JOIN base_eval b USING (run_id)
    JOIN item_results fi ON fi.run_id = f.run_id AND fi.eval_key = f.eval_key
    JOIN item_results bi ON bi.run_id = b.run_id AND bi.eval_key = b.eval_key AND bi.item_id = fi.item_id;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


# Block size of new store files (DuckDB's default is 256 KB; every write rewrites a few blocks per table it touches).
STORE_BLOCK_SIZE = 16 * 1024

# Metrics written by a step of their own (the leak audit), which a later `record_metrics` must not delete.
KEPT_METRICS = ("leaked_items",)

# Primary keys of the tables `bulk_write` may write.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "submissions": ("run_id", "submission_id"),
    "evaluations": ("run_id", "eval_key"),
    "events": ("run_id", "seq"),
    "metrics": ("run_id", "name"),
    "llm_calls": ("run_id", "seq"),
    "resources": ("run_id", "seq"),
    "tool_calls": ("run_id", "seq"),
    "item_results": ("run_id", "eval_key", "item_id"),
}


class StoreError(RuntimeError):
    """The results store file cannot be used (not a DuckDB file, written by a newer a2rl, ...)."""


class StoreLockTimeout(StoreError, TimeoutError):
    """Another process kept the results store busy for longer than the timeout."""


class ResultsStore:
    """One DuckDB results file; each method is a short, locked transaction."""

    def __init__(self, path: Path | str, lock_timeout_s: float = 120.0) -> None:
        self.path = Path(path).expanduser().resolve()
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.lock_timeout_s = lock_timeout_s
        self._batch: duckdb.DuckDBPyConnection | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(time.monotonic() + lock_timeout_s):
            if not self.path.exists() or self.path.stat().st_size == 0:
                _create(self.path)
        with self._transaction() as con:
            _migrate(con, self.path)

    # ---- writes -------------------------------------------------------------------------------------

    def start_run(
        self, run_id: str, config: RunConfig, harness_dir: Path | str | None, variant_label: str
    ) -> None:
        """Insert or reset a run as 'running'. A retry keeps the first `started_at`."""
        row = _config_columns(config) | {
            "run_id": run_id,
            "variant_label": variant_label,
            "harness_dir": None if harness_dir is None else str(harness_dir),
            "status": "running",
            "started_at": utcnow(),
            "finished_at": None,
            "error": None,
            "updated_at": utcnow(),
        }
        with self._transaction() as con:
            _upsert(con, "runs", ("run_id",), row, keep_existing={"started_at"})

    def finish_run(self, summary: RunSummary) -> None:
        """Write a run's headline numbers and final status (inserts the run if `start_run` never ran)."""
        row = _config_columns(summary.config) | {
            "run_id": summary.run_id,
            "variant_label": summary.variant_label,
            "protocol": summary.protocol,
            "status": summary.status,
            "finished_at": None if summary.status == "running" else utcnow(),
            "baseline_val": summary.baseline_val,
            "baseline_test": summary.baseline_test,
            "best_val": summary.best_val,
            "best_submission_id": summary.best_submission_id,
            "final_submission_id": summary.final_submission_id,
            "final_test": summary.final_test,
            "delta_test": summary.delta_test,
            "n_submissions": summary.n_submissions,
            "n_scored": summary.n_scored,
            "agent_seconds": summary.agent_seconds,
            "grading_seconds": summary.grading_seconds,
            "wall_seconds": summary.wall_seconds,
            "phase_seconds_json": json.dumps(summary.phase_seconds),
            "error": summary.error,
            "updated_at": utcnow(),
        }
        with self._transaction() as con:
            _upsert(con, "runs", ("run_id",), row)

    def record_submission(self, run_id: str, entry: LedgerEntry) -> None:
        """Upsert one submission from a ledger line.

        The outcome (status, score, cached, eval_seconds, error) always takes the latest line's values; the
        description (path, hash, size, split, arrival) keeps an earlier value when a later line leaves it
        empty, since a "scored" ledger line need not repeat what the "queued" line said.
        """
        if entry.submission_id is None:
            raise ValueError(f"ledger entry seq={entry.seq} ({entry.kind}) has no submission_id")
        if entry.run_id != run_id:
            raise ValueError(f"ledger entry belongs to run {entry.run_id!r}, not {run_id!r}")
        row = {
            "run_id": run_id,
            "submission_id": entry.submission_id,
            "created_at": entry.at,
            "model_path": entry.model_path,
            "weights_hash": entry.weights_hash,
            "size_bytes": entry.size_bytes,
            "split": entry.split,
            "agent_elapsed_s": entry.agent_elapsed_s,
            "status": entry.status,
            "score": entry.score,
            "cached": entry.cached,
            "eval_seconds": entry.eval_seconds,
            "error": entry.error,
        }
        described = {"model_path", "weights_hash", "size_bytes", "split", "agent_elapsed_s"}
        with self._transaction() as con:
            _upsert(
                con, "submissions", ("run_id", "submission_id"), row,
                keep_existing={"created_at"}, fill_missing=described,
            )

    def record_evaluation(
        self,
        run_id: str,
        eval_key: str,
        kind: EvalKind,
        result: EvalResult,
        submission_id: int | None = None,
    ) -> None:
        """Upsert one evaluation and replace its per-item results (`item_results`), in one transaction: recording
        the same evaluation again leaves the same rows."""
        row = {
            "run_id": run_id,
            "eval_key": eval_key,
            "kind": kind,
            "submission_id": submission_id,
            "split": result.split,
            "score": result.score,
            "n": result.n,
            "n_correct": result.n_correct,
            "evaluator_id": result.evaluator_id,
            "weights_hash": result.weights_hash,
            "generated_tokens": result.generated_tokens,
            "duration_s": result.duration_s,
            "cached": result.cached,
            "created_at": utcnow(),
        }
        items = item_rows(run_id, eval_key, result)
        with self._transaction() as con:
            _upsert(con, "evaluations", ("run_id", "eval_key"), row)
            con.execute("DELETE FROM item_results WHERE run_id = ? AND eval_key = ?", [run_id, eval_key])
            if items:
                con.executemany(f"INSERT INTO item_results ({', '.join(ITEM_COLUMNS)}) VALUES "
                                f"({', '.join('?' for _ in ITEM_COLUMNS)})", [tuple(r.values()) for r in items])

    def record_event(
        self, run_id: str, seq: int, kind: str, detail: Mapping[str, Any], at: datetime | None = None
    ) -> None:
        """Upsert one event; `seq` is the caller's position in its append-only log."""
        row = {
            "run_id": run_id,
            "seq": seq,
            "created_at": at or utcnow(),
            "kind": kind,
            "detail_json": json.dumps(dict(detail), sort_keys=True, default=str),
        }
        with self._transaction() as con:
            _upsert(con, "events", ("run_id", "seq"), row)

    # -- ledger anchors: the head of each run's ledger after every append (a2rl.grading.ledger) --------------
    # Created on first use, not by a migration: an addition that stays out of the schema-version sequence.
    _LEDGER_HEADS = """CREATE TABLE IF NOT EXISTS ledger_heads (
        run_id VARCHAR, seq BIGINT, line_hash VARCHAR, recorded_at TIMESTAMPTZ, PRIMARY KEY (run_id, seq))"""

    def record_ledger_head(self, run_id: str, seq: int, line_hash: str) -> None:
        """Anchor: the ledger's entry `seq` hashes to `line_hash`. Append-only: a row once written is kept
        (a different hash for the same entry later means the ledger was rewritten, which `ledger_head` shows)."""
        with self._transaction() as con:
            con.execute(self._LEDGER_HEADS)
            con.execute("INSERT INTO ledger_heads VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        [run_id, seq, line_hash, utcnow()])  # fmt: skip

    def ledger_head(self, run_id: str) -> Any:
        """The last anchored head of a run's ledger (an `a2rl.grading.ledger.LedgerHead`), or None."""
        from a2rl.grading.ledger import LedgerHead

        with self._transaction() as con:
            con.execute(self._LEDGER_HEADS)
            row = con.execute("SELECT seq, line_hash FROM ledger_heads WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                              [run_id]).fetchone()  # fmt: skip
        return LedgerHead(row[0] + 1, row[1]) if row else None

    def ledger_anchor(self, run_id: str):
        """A `Ledger(anchor=...)` callback that records every new head here."""
        return lambda entry, line_hash: self.record_ledger_head(run_id, entry.seq, line_hash)

    def delete_run_children(self, run_id: str) -> None:
        """Drop a run's submissions, evaluations (and their items) and events (the run row stays), before a clean re-ingest."""
        with self._transaction() as con:
            for table in ("submissions", "evaluations", "item_results", "events"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    def record_metrics(self, run_id: str, metrics: Mapping[str, Any]) -> None:
        """Replace a run's process metrics. Numbers and booleans go to `value`, anything else to `text`
        (lists and dicts as JSON); a `failure_class` entry is also copied to the run's row. Metrics other steps
        write (`KEPT_METRICS`, e.g. the leak audit's count) survive unless `metrics` names them."""
        rows = [(run_id, name, *metric_cells(v)) for name, v in metrics.items()]
        kept = [k for k in KEPT_METRICS if k not in metrics]
        with self._transaction() as con:
            keep = f" AND name NOT IN ({', '.join('?' for _ in kept)})" if kept else ""
            con.execute(f"DELETE FROM metrics WHERE run_id = ?{keep}", [run_id, *kept])
            if rows:
                con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)", rows)
            if "failure_class" in metrics:
                con.execute(
                    "UPDATE runs SET failure_class = ? WHERE run_id = ?", [metrics["failure_class"], run_id]
                )

    def record_routes(
        self, run_id: str, routes: Mapping[int, str], code_shas: Mapping[int, str | None] | None = None
    ) -> None:
        """Set the route label (and code snapshot) of existing submission rows."""
        shas = code_shas or {}
        rows = [(label, shas.get(sid), run_id, sid) for sid, label in routes.items()]
        with self._transaction() as con:
            if rows:
                con.executemany(
                    "UPDATE submissions SET route = ?, code_sha = coalesce(?, code_sha) "
                    "WHERE run_id = ? AND submission_id = ?",
                    rows,
                )

    def replace_run_rows(self, table: str, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Replace all of one run's rows in `llm_calls`, `tool_calls` or `resources` (each with a unique `seq`)."""
        if table not in ("llm_calls", "tool_calls", "resources"):
            raise ValueError(f"replace_run_rows writes llm_calls, tool_calls or resources, not {table!r}")
        import pandas as pd

        frame = pd.DataFrame([{**r, "run_id": run_id} for r in rows])
        with self._transaction() as con:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
            if len(frame):
                _insert_frame(con, table, frame)

    def bulk_write(self, table: str, frame: Any) -> int:
        """Upsert a pandas DataFrame or Arrow table into `table` in one statement (no row loop).

        A row whose primary key is already stored has the frame's columns overwritten and its other columns
        kept; a new row gets NULL in the columns the frame lacks. Writing the same frame twice is harmless.
        The frame must not repeat a key. Returns the number of rows written.
        """
        if table not in TABLE_KEYS:
            raise ValueError(f"unknown table {table!r}; one of {sorted(TABLE_KEYS)}")
        with self._transaction() as con:
            con.register("frame", frame)
            try:
                # INSERT OR REPLACE goes through the key index: ~10x faster than DELETE ... USING + INSERT.
                con.execute(f"INSERT OR REPLACE INTO {table} BY NAME SELECT * FROM frame")
                ((n,),) = con.execute("SELECT count(*) FROM frame").fetchall()
            finally:
                con.unregister("frame")
        return int(n)

    def replace_run(self, run_id: str, frames: Mapping[str, Any]) -> None:
        """Replace everything stored for one run in the given tables, in one transaction.

        `frames` maps table names (see `TABLE_KEYS`) to DataFrames holding only this run's rows; tables not
        named are left alone. Re-ingesting the same run directory therefore leaves the store unchanged.
        """
        unknown = set(frames) - set(TABLE_KEYS)
        if unknown:
            raise ValueError(f"unknown tables {sorted(unknown)}; known: {sorted(TABLE_KEYS)}")
        with self._transaction() as con:
            for table, frame in frames.items():
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                if len(frame):
                    _insert_frame(con, table, frame)

    # ---- reads --------------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        if self._batch is not None:
            cur = self._batch.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row))
        with self._connect(read_only=True) as con:
            cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row))

    def runs_df(self) -> pd.DataFrame:
        return self.query("SELECT * FROM latest_runs")

    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pd.DataFrame:
        """Run SQL on a read-only connection and return a DataFrame."""
        if self._batch is not None:
            return self._batch.execute(sql, params).df()
        with self._connect(read_only=True) as con:
            return con.execute(sql, params).df()

    # ---- connections --------------------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[ResultsStore]:
        """Every write inside the block goes through one connection and one transaction (all or nothing), so a
        run's summary rows cost one open, one commit and one lock instead of one each. Reads inside the block see
        the batch's writes. Keep the block short: other processes wait for the lock meanwhile."""
        if self._batch is not None:  # nested: the outer batch already holds the connection
            yield self
            return
        with self._connect(read_only=False) as con:
            con.execute("BEGIN TRANSACTION")
            self._batch = con
            try:
                yield self
                con.execute("COMMIT")
            finally:
                self._batch = None

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._batch is not None:
            yield self._batch
            return
        # Closing without COMMIT (on an exception) rolls the transaction back.
        with self._connect(read_only=False) as con:
            con.execute("BEGIN TRANSACTION")
            yield con
            con.execute("COMMIT")

    def _locked(self, deadline: float):
        """The store's inter-process lock (`<db>.lock`), waited for until `deadline` (monotonic)."""
        busy = f"timed out waiting for {self.lock_path}: another process kept the results store {self.path} busy"
        return exclusive_lock(self.lock_path, deadline, lambda: StoreLockTimeout(busy))

    @contextmanager
    def _connect(self, read_only: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        deadline = time.monotonic() + self.lock_timeout_s
        with self._locked(deadline):
            con = self._open(read_only, deadline)
            try:
                yield con
            finally:
                con.close()

    def _open(self, read_only: bool, deadline: float) -> duckdb.DuckDBPyConnection:
        if not read_only and self.path.exists() and self.path.stat().st_size == 0:
            # An empty file (e.g. from mkstemp or `touch`) holds no data; DuckDB refuses it, so start fresh.
            self.path.unlink()
        while True:
            try:
                # DuckDB checkpoints on every close, rewriting the blocks of each table a write touched: new stores
                # have small blocks (`_create`) and `batch()` groups a run's summary rows. Leaving writes in the WAL
                # instead was measured and rejected: every open replays the log, and opens grew to seconds.
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.IOException as e:
                # A process that bypasses our lock (a notebook, the CLI) still holds DuckDB's own file lock.
                if "Could not set lock" not in str(e):
                    raise StoreError(f"cannot open results store {self.path}: {e}") from None
                if time.monotonic() >= deadline:
                    raise StoreLockTimeout(
                        f"results store {self.path} is held open by another process that does not use "
                        f"ResultsStore (close it, e.g. a notebook connection): {e}"
                    ) from None
                time.sleep(0.05)
            except duckdb.Error as e:
                raise StoreError(f"cannot open results store {self.path}: {e}") from None


def _create(path: Path) -> None:
    """A new, empty store file with small blocks. DuckDB checkpoints on every close and rewrites whole blocks of
    each table a write touched: ~0.8 MB per small write with its default 256 KB blocks, ~54 KB with 16 KB blocks
    (BENCHMARKS.md, "Results store writes"). The block size is stored in the file; older stores keep theirs."""
    path.unlink(missing_ok=True)  # an empty file (mkstemp, `touch`) holds no data and DuckDB refuses it
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{_sql_literal(str(path))}' AS store (BLOCK_SIZE {STORE_BLOCK_SIZE})")
        con.execute("DETACH store")
    finally:
        con.close()


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ)"
    )
    (current,) = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone() or (0,)
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"results store {path} has schema version {current}, newer than this a2rl ({SCHEMA_VERSION}); "
            "upgrade a2rl"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        con.execute(MIGRATIONS[version - 1])
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [version, utcnow()])


def _config_columns(config: RunConfig) -> dict[str, Any]:
    """The `runs` columns that come from a RunConfig."""
    return {
        "config_hash": config.config_hash(),
        "task": config.task,
        "variant": config.variant,
        "agent": config.agent,
        "driver": config.driver,
        "mode": config.mode,
        "base_model": config.base_model,
        "seed": config.seed,
        "budget_s": config.budget_s,
        "protocol": config.protocol,
        "config_json": config.model_dump_json(),
    }


def _upsert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    key: tuple[str, ...],
    row: Mapping[str, Any],
    keep_existing: set[str] | frozenset[str] = frozenset(),
    fill_missing: set[str] | frozenset[str] = frozenset(),
) -> None:
    """INSERT ... ON CONFLICT DO UPDATE for the columns in `row`; columns not in `row` are left alone.

    `keep_existing`: a stored non-NULL value wins (first-seen facts). `fill_missing`: the new value wins
    unless it is NULL. Every other column takes the new value. Names come from this module, never users.
    """
    cols = list(row)

    def assign(col: str) -> str:
        if col in keep_existing:
            return f"{col} = coalesce({table}.{col}, excluded.{col})"
        if col in fill_missing:
            return f"{col} = coalesce(excluded.{col}, {table}.{col})"
        return f"{col} = excluded.{col}"

    updates = ", ".join(assign(c) for c in cols if c not in key)
    sql = (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )
    con.execute(sql, list(row.values()))


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, frame: Any) -> None:
    """INSERT ... BY NAME from a DataFrame or Arrow table (columns matched by name)."""
    con.register("_rows", frame)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
    finally:
        con.unregister("_rows")


ITEM_COLUMNS = ("run_id", "eval_key", "split", "item_id", "score", "correct", "tokens")


def item_rows(run_id: str, eval_key: str, result: EvalResult) -> list[dict[str, Any]]:
    """`item_results` rows of one evaluation: the graded value where the task gives one, else 1/0 for right/wrong.
    An item id seen twice keeps its last result (the key is one row per item)."""
    rows: dict[str, dict[str, Any]] = {}
    for item in result.items:
        tokens = item.detail.get("generated_tokens")
        rows[item.item_id] = {
            "run_id": run_id, "eval_key": eval_key, "split": result.split, "item_id": item.item_id,
            "score": float(item.value) if item.value is not None else float(item.correct),
            "correct": bool(item.correct), "tokens": int(tokens) if isinstance(tokens, int) else None,
        }  # fmt: skip
    return list(rows.values())


def metric_cells(value: Any) -> tuple[float | None, str | None]:
    """(value, text) cells of one `metrics` row: numbers and booleans as numbers, the rest as text."""
    if value is None:
        return None, None
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        return float(value), None
    if isinstance(value, str):
        return None, value
    return None, json.dumps(value, sort_keys=True, default=str)
