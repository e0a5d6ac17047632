"""The results store's schema: ordered migrations (tables, then views), as SQL.

Entry i takes a store file from schema version i to i + 1; a file records its version, and a newer a2rl migrates
an older file forward on open. An entry is SQL, or a `Step`: SQL, then a Python backfill of rows already stored.
"""

from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from a2rl.store import derived, derived_intervals


@dataclass(frozen=True)
class Step:
    """A migration whose new columns or tables hold numbers only Python computes: its SQL, then `backfill`."""

    sql: str
    backfill: Callable[[duckdb.DuckDBPyConnection], None]


# The settings of the analysed runs, the CTE of `leaderboard_ci` (migrations 6 and 12 differ in what they join).
_SETTINGS_OF_RUNS = """\
    WITH s AS (
        SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
               evaluator_id, any_value(variant_label) AS variant_label,
               count(*)::BIGINT AS n, avg(delta_test) AS mean_delta, stddev_samp(delta_test) AS sd_delta,
               avg(final_test) AS mean_final_test, avg(baseline_test) AS mean_baseline_test,
               avg((delta_test > 0)::DOUBLE) AS improve_rate,
               sum(n_mode_breaches)::BIGINT AS n_mode_breaches,
               count(*) FILTER (WHERE n_mode_breaches > 0)::BIGINT AS runs_with_mode_breaches,
               list(seed ORDER BY seed, run_id) AS seeds,
               list(delta_test ORDER BY seed, run_id) AS deltas
        FROM analysed_runs
        GROUP BY setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
                 evaluator_id
    )
"""

# The select of `leaderboard_ci` over its settings: their intervals (migration 12 selects the stored standard error
# and joins the stored rows), the noise floor beside them.
_LEADERBOARD_CI_SELECT = """\
    SELECT s.*, {se_delta} AS se_delta,
           i.ci_low, i.ci_high, coalesce(i.interval, 'n = 1: no interval') AS interval,
           coalesce(i.verdict, 'no significant change') AS verdict, coalesce(i.n_items, 0)::BIGINT AS n_items,
           coalesce(i.design, 'seeds') AS design,
           nf.noise_se, nf.noise_floor, nf.noise_floor_source, nf.n_items AS noise_n_items
    FROM s LEFT JOIN {intervals} i ON i.setting_id = s.setting_id AND i.metric = 'delta'
    LEFT JOIN noise_floor nf
      ON nf.split = 'test' AND (nf.task, nf.variant, nf.item_selection, nf.base_model, nf.evaluator_id)
         = (s.task, s.variant, s.item_selection, s.base_model, s.evaluator_id);
"""

# The systems' rows of `system_task_scores` (migrations 6 and 12 differ in the Baseline row).
_SYSTEM_ROWS = """\
    SELECT 'system' AS row_kind, r.setting_id, r.agent, r.driver, r.mode, r.protocol, r.budget_s, r.task, r.variant,
           r.item_selection, r.base_model, r.evaluator_id, count(*)::BIGINT AS n, avg(r.final_test) AS mean_score,
           any_value(i.ci_low) AS ci_low, any_value(i.ci_high) AS ci_high,
           coalesce(any_value(i.interval), 'n = 1: no interval') AS interval, any_value(i.n_items) AS n_items
    FROM analysed_runs r LEFT JOIN setting_intervals i ON i.setting_id = r.setting_id AND i.metric = 'score'
    GROUP BY r.setting_id, r.agent, r.driver, r.mode, r.protocol, r.budget_s, r.task, r.variant, r.item_selection,
             r.base_model, r.evaluator_id
    UNION ALL
"""

# The best gain of each run at each share of its budget (migrations 11 and 12 differ in the interval over them).
_BUDGET_PER_RUN = """\
    WITH per_run AS (
        SELECT r.run_id, r.setting_id, r.delta_test, f.budget_fraction, d.feedback_split AS split,
               coalesce(g.best_gain, 0.0) AS best_gain
        FROM analysed_runs r CROSS JOIN (SELECT unnest([0.25, 0.5, 1.0]) AS budget_fraction) f
        LEFT JOIN run_derived d ON d.run_id = r.run_id
        LEFT JOIN budget_gains g ON g.run_id = r.run_id AND g.budget_fraction = f.budget_fraction
    )
"""

# The budget table over its runs' gains (migrations 6 and 11 differ in how a run's gain is found).
_BUDGET_DELTAS_SELECT = """\
    SELECT l.setting_id, l.task, l.variant, l.item_selection, l.base_model, l.agent, l.driver, l.mode, l.protocol,
           l.budget_s, l.evaluator_id, p.budget_fraction, any_value(p.split) AS split, count(*)::BIGINT AS n,
           avg(p.best_gain) AS mean_best_gain, true AS floored_at_0,
           CASE WHEN count(*) >= 2 AND stddev_samp(p.best_gain) > 0
                THEN greatest(avg(p.best_gain) - t975(count(*) - 1) * stddev_samp(p.best_gain) / sqrt(count(*)), 0.0)
                END AS ci_low,
           CASE WHEN count(*) >= 2 AND stddev_samp(p.best_gain) > 0
                THEN least(avg(p.best_gain) + t975(count(*) - 1) * stddev_samp(p.best_gain) / sqrt(count(*)), 100.0)
                END AS ci_high,
           CASE WHEN count(*) < 2 THEN 'n = 1: no interval'
                WHEN stddev_samp(p.best_gain) = 0 THEN 'the seeds agree exactly: no interval'
                ELSE 't-interval over seeds (the feedback items are not resampled)' END AS interval,
           avg(p.delta_test) AS headline_delta_test
    FROM per_run p JOIN leaderboard_ci l USING (setting_id)
    GROUP BY ALL
    ORDER BY l.task, l.variant, l.setting_id, p.budget_fraction;"""

# Ordered migrations: entry i takes the schema from version i to i + 1. Append only; never edit a shipped one.
MIGRATIONS: list[str | Step] = [
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
    # 3: mode violations follow `a2rl.grading.route_audit.check_mode` (its label set: RLOO and RL count as RL; DPO is
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
    # 5: every submission on the hidden test after the session, for analysis only (evaluations of kind `posthoc`;
    # DuckDB cannot alter a CHECK constraint, so the table is rebuilt with the same columns and keys), and the
    # agent's own label of the training stage behind each submission (`stage`, e.g. SFT or GRPO).
    """
    CREATE TABLE evaluations_v5 (
        run_id VARCHAR,
        eval_key VARCHAR,
        kind VARCHAR CHECK (kind IN ('baseline', 'submission', 'final', 'posthoc')),
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
    INSERT INTO evaluations_v5 BY NAME SELECT * FROM evaluations;
    DROP TABLE evaluations;
    ALTER TABLE evaluations_v5 RENAME TO evaluations;
    ALTER TABLE submissions ADD COLUMN stage VARCHAR;
    -- Per submission: its validation score, its hidden-test score when evaluated post hoc, and its stage.
    CREATE OR REPLACE VIEW submission_tests AS
    SELECT s.run_id, s.submission_id, s.stage, s.route, s.agent_elapsed_s, s.score AS validation_score,
           p.score AS test_score, p.n AS test_n, p.eval_key AS test_eval_key,
           coalesce(f.final_submission_id = s.submission_id, false) AS is_final_pick
    FROM submissions s
    LEFT JOIN evaluations p ON p.run_id = s.run_id AND p.submission_id = s.submission_id AND p.kind = 'posthoc'
    LEFT JOIN runs f ON f.run_id = s.run_id
    WHERE s.status = 'scored';
    """,
    # 6: one interval per setting over its seeds and the hidden-test items they share (a2rl.summary.intervals:
    # seeds × items, each part with its own t quantile, two pseudo-items so that tied seeds never give a zero-width
    # interval); without shared per-item results, the t-interval over seeds plus a binomial bound for the items.
    # Every paper table keyed by the setting; the Baseline row per base model, clipped to 0..100; budget gains say
    # their split and sit beside the headline hidden-test Δ; mode breaches and routes count analysed runs only.
    """
    CREATE OR REPLACE VIEW setting_intervals AS
    WITH k AS (
        SELECT setting_id, count(*)::BIGINT AS k, avg(delta_test) AS mean_delta, var_samp(delta_test) AS var_delta,
               avg(final_test) AS mean_final, var_samp(final_test) AS var_final, avg(baseline_test) AS mean_base,
               any_value(task) AS task, any_value(variant) AS variant, any_value(item_selection) AS item_selection,
               any_value(base_model) AS base_model, any_value(evaluator_id) AS evaluator_id
        FROM analysed_runs GROUP BY setting_id
    ), v AS (
        SELECT r.setting_id, p.run_id, p.item_id, p.final_score - p.base_score AS d, p.final_score AS f
        FROM item_pairs p JOIN analysed_runs r USING (run_id)
    ), shared AS (  -- every seed scored every item: a seeds x items table
        SELECT v.setting_id, count(DISTINCT v.item_id)::BIGINT AS n, any_value(k.k) AS k
        FROM v JOIN k USING (setting_id) GROUP BY v.setting_id
        HAVING count(DISTINCT v.run_id) = any_value(k.k) AND count(*) = any_value(k.k) * count(DISTINCT v.item_id)
    ), m AS (
        SELECT * FROM (VALUES ('delta', -1.0, 1.0), ('score', 0.0, 1.0)) t(metric, lo, hi)
    ), x AS (
        SELECT v.setting_id, m.metric, v.run_id, v.item_id, false AS pseudo,
               CASE m.metric WHEN 'delta' THEN v.d ELSE v.f END AS value
        FROM v JOIN shared USING (setting_id) CROSS JOIN m
        UNION ALL
        SELECT r.setting_id, m.metric, r.run_id, p.item_id, true, CASE p.item_id WHEN 'low' THEN m.lo ELSE m.hi END
        FROM analysed_runs r JOIN shared USING (setting_id) CROSS JOIN m
        CROSS JOIN (VALUES ('low'), ('high')) p(item_id)
    ), items AS (
        SELECT setting_id, metric, avg(value) AS mean FROM x GROUP BY setting_id, metric, item_id, pseudo
    ), seeds AS (
        SELECT setting_id, metric, avg(value) AS mean FROM x GROUP BY setting_id, metric, run_id
    ), crossed AS (
        SELECT a.setting_id, a.metric, s.k, s.n, a.estimate, a.centre,
               (SELECT var_samp(i.mean) FROM items i WHERE i.setting_id = a.setting_id AND i.metric = a.metric)
                   / (s.n + 2) AS var_items,
               coalesce((SELECT var_samp(e.mean) FROM seeds e WHERE e.setting_id = a.setting_id AND e.metric = a.metric)
                   / s.k, 0.0) AS var_seeds
        FROM (SELECT setting_id, metric, 100 * avg(value) FILTER (WHERE NOT pseudo) AS estimate,
                     100 * avg(value) AS centre FROM x GROUP BY setting_id, metric) a
        JOIN shared s USING (setting_id)
    ), crossed_ci AS (
        SELECT setting_id, metric, k, n AS n_items, estimate,
               centre - 100 * sqrt(t975(n + 1) ^ 2 * var_items + coalesce(t975(k - 1) ^ 2, 0) * var_seeds) AS low,
               centre + 100 * sqrt(t975(n + 1) ^ 2 * var_items + coalesce(t975(k - 1) ^ 2, 0) * var_seeds) AS high,
               CASE WHEN k > 1 THEN 'seeds × items: ' || k || ' seeds sharing ' || n
                                    || ' items, t-intervals of both parts combined (+2 pseudo-items)'
                    ELSE 't over ' || n || ' items (+2 pseudo-items)' END AS interval
        FROM crossed
    ), fallback AS (  -- no shared per-item results: t over seeds + a binomial bound for the items (when n is known)
        SELECT k.setting_id, m.metric, k.k, coalesce(nf.n_items, 0)::BIGINT AS n_items,
               CASE m.metric WHEN 'delta' THEN k.mean_delta ELSE k.mean_final END AS estimate,
               CASE m.metric WHEN 'delta' THEN k.var_delta ELSE k.var_final END / k.k AS var_seeds,
               CASE WHEN nf.n_items > 1 THEN binomial_se(k.mean_final, nf.n_items) ^ 2
                    + CASE m.metric WHEN 'delta' THEN binomial_se(k.mean_base, nf.n_items) ^ 2 ELSE 0 END
                    ELSE 0 END AS var_items
        FROM k CROSS JOIN m
        LEFT JOIN noise_floor nf ON nf.split = 'test' AND (nf.task, nf.variant, nf.item_selection, nf.base_model,
                                                            nf.evaluator_id)
                                     = (k.task, k.variant, k.item_selection, k.base_model, k.evaluator_id)
        WHERE k.setting_id NOT IN (SELECT setting_id FROM shared)
    ), fallback_ci AS (
        SELECT setting_id, metric, k, n_items, estimate,
               CASE WHEN k >= 2 AND var_seeds + var_items > 0 THEN estimate - sqrt(t975(k - 1) ^ 2 * var_seeds
                    + coalesce(t975(n_items - 1) ^ 2, 0) * var_items) END AS low,
               CASE WHEN k >= 2 AND var_seeds + var_items > 0 THEN estimate + sqrt(t975(k - 1) ^ 2 * var_seeds
                    + coalesce(t975(n_items - 1) ^ 2, 0) * var_items) END AS high,
               CASE WHEN k < 2 THEN 'n = 1: no interval'
                    WHEN var_seeds + var_items = 0
                        THEN 'the seeds agree exactly and no per-item results say how much items vary: no interval'
                    WHEN var_items > 0 THEN 't-interval over seeds + binomial bound for ' || n_items || ' items'
                    ELSE 't-interval over seeds (no per-item results: item sampling not included)' END AS interval
        FROM fallback
    ), both_ci AS (
        SELECT *, 'seeds × items' AS design FROM crossed_ci
        UNION ALL SELECT *, 'seeds' AS design FROM fallback_ci
    )
    SELECT setting_id, metric, design, k AS n, n_items, estimate,
           -- (greatest/least skip NULLs in DuckDB: no interval stays none)
           CASE WHEN low IS NOT NULL THEN greatest(low, CASE metric WHEN 'delta' THEN -100.0 ELSE 0.0 END) END
               AS ci_low,
           CASE WHEN high IS NOT NULL THEN least(high, 100.0) END AS ci_high, interval,
           CASE WHEN metric = 'score' THEN NULL WHEN low > 0 THEN 'improved' WHEN high < 0 THEN 'worse'
                ELSE 'no significant change' END AS verdict
    FROM both_ci
    -- one seed's Δ: its exact paired test is the run's (`a2rl analyze` reads it from item_pairs); SQL leaves it out
    WHERE NOT (metric = 'delta' AND k < 2 AND design = 'seeds × items');
    CREATE OR REPLACE VIEW leaderboard_ci AS
""" + _SETTINGS_OF_RUNS
    + _LEADERBOARD_CI_SELECT.format(se_delta="s.sd_delta / sqrt(s.n)", intervals="setting_intervals") + """\
    CREATE OR REPLACE VIEW leaderboard AS SELECT * FROM leaderboard_ci ORDER BY task, mean_delta DESC NULLS LAST;
    CREATE OR REPLACE VIEW mode_task_matrix AS
    SELECT *,
           count(*) OVER agent_setting > 1 AND mean_delta = max(mean_delta) OVER agent_setting AS is_best,
           count(*) OVER agent_setting > 1 AND mean_delta = min(mean_delta) OVER agent_setting AS is_worst
    FROM leaderboard_ci
    WINDOW agent_setting AS (PARTITION BY task, variant, item_selection, base_model, agent, driver, protocol, budget_s,
                                          evaluator_id);
    -- Paper table: absolute hidden-test scores, one row per setting (the interval over seeds and shared items), and
    -- one Baseline row per task, item selection, evaluator and base model (its item-level interval, in 0..100).
    CREATE OR REPLACE VIEW system_task_scores AS
    WITH base_items AS (
        SELECT r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id, p.item_id, avg(p.base_score) AS value
        FROM item_pairs p JOIN analysed_runs r USING (run_id) GROUP BY ALL
    ), base_x AS (
        SELECT task, variant, item_selection, base_model, evaluator_id, value FROM base_items
        UNION ALL
        SELECT DISTINCT task, variant, item_selection, base_model, evaluator_id, unnest([0.0, 1.0]) FROM base_items
    ), base_ci AS (
        SELECT task, variant, item_selection, base_model, evaluator_id, count(*)::BIGINT - 2 AS n_items,
               100 * avg(value) AS centre,
               100 * t975(count(*) - 1) * sqrt(var_samp(value) / count(*)) AS half
        FROM base_x GROUP BY ALL
    )
""" + _SYSTEM_ROWS + """\
    SELECT 'baseline', NULL, 'Baseline', NULL, NULL, NULL, NULL, r.task, r.variant, r.item_selection, r.base_model,
           r.evaluator_id, 1, avg(r.baseline_test),
           CASE WHEN any_value(b.centre) IS NOT NULL OR any_value(nf.noise_se) IS NOT NULL THEN
               greatest(coalesce(any_value(b.centre - b.half), any_value(nf.mean_baseline_ac - 1.96 * nf.noise_se)), 0.0)
           END,
           CASE WHEN any_value(b.centre) IS NOT NULL OR any_value(nf.noise_se) IS NOT NULL THEN
               least(coalesce(any_value(b.centre + b.half), any_value(nf.mean_baseline_ac + 1.96 * nf.noise_se)), 100.0)
           END,
           CASE WHEN any_value(b.centre) IS NOT NULL
                THEN 'the base model on ' || any_value(b.n_items) || ' items: t over items (+2 pseudo-items), in 0..100'
                ELSE 'the base model: Agresti-Coull, in 0..100' END,
           coalesce(any_value(b.n_items), any_value(nf.n_items))
    FROM analysed_runs r
    LEFT JOIN base_ci b USING (task, variant, item_selection, base_model, evaluator_id)
    LEFT JOIN (SELECT *, 100.0 * (mean_baseline / 100.0 * n_items + 2) / (n_items + 4) AS mean_baseline_ac
               FROM noise_floor WHERE split = 'test') nf
      USING (task, variant, item_selection, base_model, evaluator_id)
    GROUP BY r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id;
    -- Paper table: the best gain on the feedback split (validation; the test set under protocol `paper`) reached within
    -- 25%, 50% and 100% of the agent-time budget. The base model is a candidate from the start, so the gain is never
    -- below 0 (`floored_at_0`); the headline is the hidden-test Δ of the final pick, beside it.
    CREATE OR REPLACE VIEW budget_deltas AS
    WITH per_run AS (
        SELECT r.run_id, r.setting_id, r.delta_test, f.budget_fraction,
               CASE WHEN r.protocol = 'paper' THEN 'test' ELSE 'validation' END AS split,
               greatest(coalesce(max(s.score - CASE WHEN s.split = 'test' THEN r.baseline_test ELSE r.baseline_val END)
                                 FILTER (WHERE s.status = 'scored'
                                         AND s.agent_elapsed_s <= f.budget_fraction * r.budget_s), 0.0), 0.0)
                   AS best_gain
        FROM analysed_runs r CROSS JOIN (SELECT unnest([0.25, 0.5, 1.0]) AS budget_fraction) f
        LEFT JOIN submissions s ON s.run_id = r.run_id
        GROUP BY r.run_id, r.setting_id, r.delta_test, r.protocol, f.budget_fraction
    )
""" + _BUDGET_DELTAS_SELECT + """
    CREATE OR REPLACE VIEW final_routes AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.evaluator_id,
           coalesce(s.route, CASE WHEN r.final_submission_id IS NULL THEN 'base model (no pick)' ELSE 'unlabelled' END)
               AS final_route,
           count(*)::BIGINT AS n_runs, avg(r.delta_test) AS mean_delta
    FROM analysed_runs r LEFT JOIN submissions s ON s.run_id = r.run_id AND s.submission_id = r.final_submission_id
    GROUP BY ALL;
    -- Submissions whose route broke the run's mode, per setting (analysed runs only; excluded runs are in
    -- `failure_classes`).
    CREATE OR REPLACE VIEW mode_breaches AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
           evaluator_id, count(*)::BIGINT AS n_runs,
           count(*) FILTER (WHERE n_mode_breaches > 0)::BIGINT AS runs_with_breaches,
           sum(n_mode_breaches)::BIGINT AS n_breaches
    FROM analysed_runs GROUP BY ALL;
    CREATE OR REPLACE VIEW route_distribution AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.evaluator_id, coalesce(s.route, 'unlabelled') AS route,
           count(*)::BIGINT AS n_submissions, count(DISTINCT s.run_id)::BIGINT AS n_runs
    FROM submissions s JOIN analysed_runs r USING (run_id)
    GROUP BY ALL;
    -- Every run, infrastructure failures and unfinished runs included (they are counted here, nowhere else).
    CREATE OR REPLACE VIEW failure_classes AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
           evaluator_id, status, coalesce(failure_class, 'unclassified') AS failure_class,
           coalesce(excluded_because, 'analysed') AS counted_as, count(*)::BIGINT AS n_runs
    FROM run_settings GROUP BY ALL;
    """,
    # 7: what each training stage added on the hidden test (`test_every_submission`): RL's share per analysed run,
    # from the run's metrics (a2rl.summary.stages: last RL checkpoint against the SFT checkpoint RL started from).
    """
    CREATE OR REPLACE VIEW stage_shares AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.seed, r.run_id,
           max(m.value) FILTER (WHERE m.name = 'rl_share_sft_test') AS sft_start_test,
           max(m.value) FILTER (WHERE m.name = 'rl_share_rl_test') AS last_rl_test,
           max(m.value) FILTER (WHERE m.name = 'rl_share') AS rl_share,
           max(m.value) FILTER (WHERE m.name = 'rl_share_ci_low') AS ci_low,
           max(m.value) FILTER (WHERE m.name = 'rl_share_ci_high') AS ci_high,
           max(m.value) FILTER (WHERE m.name = 'rl_share_p_value') AS p_value,
           max(m.value) FILTER (WHERE m.name = 'rl_share_n_items')::BIGINT AS n_items,
           max(m.text) FILTER (WHERE m.name = 'rl_share_submissions') AS submissions
    FROM analysed_runs r JOIN metrics m USING (run_id)
    WHERE m.name LIKE 'rl_share%'
    GROUP BY ALL
    ORDER BY r.setting_id, r.seed, r.run_id;
    """,
    # 8: the agent's grace past its budget apart from its time; how many attempts a run took.
    """
    ALTER TABLE runs ADD COLUMN grace_seconds DOUBLE;
    ALTER TABLE runs ADD COLUMN attempts BIGINT;
    """,
    # 9: the run's Prefect flow run and the last state an attempt of it reached (`attempts` counts them), so SQL
    # over the central store answers what ran, what failed or crashed on a host, and which flow run to retry.
    """
    ALTER TABLE runs ADD COLUMN flow_run_id VARCHAR;
    ALTER TABLE runs ADD COLUMN prefect_state VARCHAR;
    """,
    # 10 (issue 34): the mode × task view's flags said "best"/"worst" for any highest/lowest mean, however
    # small the difference; they are named for what they are. Best and worst are marked only where the paired
    # comparison with the runner-up leaves 0 out, in Python (`a2rl.analysis.compare.marks`), not in SQL.
    """
    CREATE OR REPLACE VIEW mode_task_matrix AS
    SELECT *,
           count(*) OVER agent_setting > 1 AND mean_delta = max(mean_delta) OVER agent_setting AS highest_mean,
           count(*) OVER agent_setting > 1 AND mean_delta = min(mean_delta) OVER agent_setting AS lowest_mean
    FROM leaderboard_ci
    WINDOW agent_setting AS (PARTITION BY task, variant, item_selection, base_model, agent, driver, protocol, budget_s,
                                          evaluator_id);
    """,
    # 11 (issue 38): the protocol's derived numbers are computed once, in Python (`a2rl.store.derived`, by the rules
    # of `a2rl.protocol`), stored beside the rows they come from, and joined by the views instead of recomputed in
    # SQL: the feedback split, the final pick's test evaluation, best-so-far and the gains on the base model.
    # Rows already stored are backfilled.
    Step("""
    CREATE TABLE run_derived (
        run_id VARCHAR PRIMARY KEY,
        feedback_split VARCHAR,         -- a2rl.protocol.feedback.feedback_split of the run's protocol
        final_test_eval_key VARCHAR,    -- the evaluation holding the final pick's hidden-test items (picking)
        base_test_eval_key VARCHAR      -- the base model's hidden-test evaluation they are paired with
    );
    CREATE TABLE submission_derived (
        run_id VARCHAR,
        submission_id BIGINT,
        baseline DOUBLE,                -- the base model's score on the submission's split
        best_so_far DOUBLE,             -- the best score up to this submission
        improvement_so_far DOUBLE,      -- best_so_far's gain on the baseline, never below 0
        PRIMARY KEY (run_id, submission_id)
    );
    CREATE TABLE budget_gains (
        run_id VARCHAR,
        budget_fraction DOUBLE,         -- a share of the agent-time budget
        best_gain DOUBLE,               -- the best gain of a submission scored within it, never below 0
        PRIMARY KEY (run_id, budget_fraction)
    );
    CREATE OR REPLACE VIEW scaling_curve AS
    SELECT s.run_id, r.setting_id, r.task, r.variant, r.variant_label, r.item_selection, r.protocol, r.agent, r.driver,
           r.mode, r.base_model, r.evaluator_id, r.seed, r.budget_s, s.submission_id, s.agent_elapsed_s, s.split,
           s.status, s.score, d.best_so_far, d.baseline, d.improvement_so_far,
           coalesce(u.cum_tokens, 0)::BIGINT AS cum_tokens,
           coalesce(u.cum_cost_usd, 0.0) AS cum_cost_usd
    FROM submissions s
    JOIN analysed_runs r USING (run_id)
    LEFT JOIN submission_derived d USING (run_id, submission_id)
    ASOF LEFT JOIN llm_usage_cumulative u ON s.run_id = u.run_id AND s.created_at >= u.created_at;
    CREATE OR REPLACE VIEW item_pairs AS
    SELECT d.run_id, fi.item_id, bi.score AS base_score, fi.score AS final_score
    FROM run_derived d
    JOIN item_results fi ON fi.run_id = d.run_id AND fi.eval_key = d.final_test_eval_key
    JOIN item_results bi ON bi.run_id = d.run_id AND bi.eval_key = d.base_test_eval_key AND bi.item_id = fi.item_id;
    CREATE OR REPLACE VIEW budget_deltas AS
""" + _BUDGET_PER_RUN + _BUDGET_DELTAS_SELECT + """
    """, derived.refresh),
    # 12 (issue 38): the intervals across the runs of a setting are computed once, in Python
    # (`a2rl.store.derived_intervals`, by `a2rl.summary.intervals`), stored per group of runs (task, variant, item
    # selection, base model) and selected by the views: a setting's Δ and score, their standard error, the budget
    # gains' intervals, the base model's noise and the Baseline row. The views hold no t quantile, z or standard error
    # any more, and the macros `t975` and `binomial_se` go. Rows already stored are backfilled.
    Step("""
    CREATE TABLE interval_runs (        -- each run's group, as its intervals were last computed
        run_id VARCHAR PRIMARY KEY, task VARCHAR, variant VARCHAR, item_selection VARCHAR, base_model VARCHAR
    );
    CREATE TABLE noise_derived (        -- the `noise_floor` rows: the base model's item-level noise
        task VARCHAR, variant VARCHAR, item_selection VARCHAR, base_model VARCHAR, evaluator_id VARCHAR,
        split VARCHAR, n_rows BIGINT, k_reevaluations BIGINT, mean_baseline DOUBLE, range_baseline DOUBLE,
        n_items BIGINT, is_binary BOOLEAN, sd_item DOUBLE, noise_se DOUBLE, noise_floor DOUBLE,
        noise_floor_source VARCHAR
    );
    CREATE TABLE setting_derived (      -- per setting: metric 'delta' and 'score' (over seeds and shared items) and
        task VARCHAR, variant VARCHAR, item_selection VARCHAR, base_model VARCHAR,  -- 'best_gain' per budget share
        setting_id VARCHAR, metric VARCHAR, budget_fraction DOUBLE, design VARCHAR, n BIGINT, n_items BIGINT,
        estimate DOUBLE, se DOUBLE, ci_low DOUBLE, ci_high DOUBLE, interval VARCHAR, verdict VARCHAR
    );
    CREATE TABLE baseline_derived (     -- the Baseline row of `system_task_scores`: its interval, in 0..100
        task VARCHAR, variant VARCHAR, item_selection VARCHAR, base_model VARCHAR, evaluator_id VARCHAR,
        n_items BIGINT, ci_low DOUBLE, ci_high DOUBLE, interval VARCHAR
    );
    CREATE OR REPLACE VIEW noise_floor AS
    SELECT task, variant, item_selection, base_model, evaluator_id, split, n_rows, k_reevaluations, mean_baseline,
           range_baseline, n_items, is_binary, sd_item, noise_se, noise_floor, noise_floor_source
    FROM noise_derived;
    CREATE OR REPLACE VIEW setting_intervals AS
    SELECT setting_id, metric, design, n, n_items, estimate, ci_low, ci_high, interval, verdict
    FROM setting_derived WHERE metric IN ('delta', 'score');
    CREATE OR REPLACE VIEW leaderboard_ci AS
""" + _SETTINGS_OF_RUNS + _LEADERBOARD_CI_SELECT.format(se_delta="i.se", intervals="setting_derived") + """\
    CREATE OR REPLACE VIEW system_task_scores AS
""" + _SYSTEM_ROWS + """\
    SELECT 'baseline', NULL, 'Baseline', NULL, NULL, NULL, NULL, r.task, r.variant, r.item_selection, r.base_model,
           r.evaluator_id, 1, avg(r.baseline_test), any_value(b.ci_low), any_value(b.ci_high), any_value(b.interval),
           any_value(b.n_items)
    FROM analysed_runs r LEFT JOIN baseline_derived b
      ON r.task IS NOT DISTINCT FROM b.task AND r.variant IS NOT DISTINCT FROM b.variant
         AND r.item_selection IS NOT DISTINCT FROM b.item_selection AND r.base_model IS NOT DISTINCT FROM b.base_model
         AND r.evaluator_id IS NOT DISTINCT FROM b.evaluator_id
    GROUP BY r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id;
    CREATE OR REPLACE VIEW budget_deltas AS
""" + _BUDGET_PER_RUN + """\
    SELECT l.setting_id, l.task, l.variant, l.item_selection, l.base_model, l.agent, l.driver, l.mode, l.protocol,
           l.budget_s, l.evaluator_id, p.budget_fraction, any_value(p.split) AS split, count(*)::BIGINT AS n,
           avg(p.best_gain) AS mean_best_gain, true AS floored_at_0, any_value(i.ci_low) AS ci_low,
           any_value(i.ci_high) AS ci_high, any_value(i.interval) AS interval,
           avg(p.delta_test) AS headline_delta_test
    FROM per_run p JOIN leaderboard_ci l USING (setting_id)
    LEFT JOIN setting_derived i
      ON i.setting_id = p.setting_id AND i.metric = 'best_gain' AND i.budget_fraction = p.budget_fraction
    GROUP BY l.setting_id, l.task, l.variant, l.item_selection, l.base_model, l.agent, l.driver, l.mode, l.protocol,
             l.budget_s, l.evaluator_id, p.budget_fraction
    ORDER BY l.task, l.variant, l.setting_id, p.budget_fraction;
    DROP MACRO t975;
    DROP MACRO binomial_se;
    """, derived_intervals.refresh),
    # 14: a run the machine starved (failure class `environment`, issue #45) is left out of every aggregate like an
    # infrastructure failure: the settings view as it stands, under another name, with that one reason added.
    # DuckDB binds views by name when queried, so `analysed_runs` and `excluded_runs` read the new one.
    """
    ALTER VIEW run_settings RENAME TO run_settings_any_class;
    CREATE VIEW run_settings AS
    SELECT * REPLACE (CASE WHEN excluded_because IS NULL AND failure_class = 'environment'
                           THEN 'environment (the machine starved the run)' ELSE excluded_because END
                      AS excluded_because)
    FROM run_settings_any_class;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
