"""The results store's schema: ordered migrations of its tables, and its views, each defined once, as SQL.

Entry i of MIGRATIONS takes a store file's tables from schema version i to i + 1; a file records its version, and a
newer a2rl migrates an older file forward on open. An entry is SQL, or a `Step`: SQL, then a Python backfill of
rows already stored. The views are not migrated: VIEWS holds each one's current SQL, and a store that was migrated
gets them all anew (`drop_views`, `create_views`), so an old store upgraded reads exactly the views of a new one.
"""

from collections.abc import Callable
from dataclasses import dataclass

import duckdb

from a2rl_bench.store import derived, derived_intervals


@dataclass(frozen=True)
class Step:
    """A migration whose new columns or tables hold numbers only Python computes: its SQL, then `backfill` (run once
    the migrated store has its views again: a backfill may read them)."""

    sql: str
    backfill: Callable[[duckdb.DuckDBPyConnection], None]


# Ordered migrations of the tables: entry i takes the schema from version i to i + 1. Append only; never edit a
# shipped one's tables (the views they once created live in VIEWS now, in their current form; an entry that only
# changed views is kept, empty, so that the numbering holds).
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
    """,
    # 3: mode violations follow `a2rl_bench.grading.route_audit.check_mode` (its label set: RLOO and RL count as RL; DPO
    # is neither SFT nor RL; under rl-only, no training method at all is a violation too).
    """
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
    # 4: per-item results; settings keyed by everything but the seed (a2rl_bench.setting.SETTING_KEY); runs the analysis
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
    """,
    # 6: one interval per setting over its seeds and the hidden-test items they share (a2rl_bench.summary.intervals:
    # seeds × items, each part with its own t quantile, two pseudo-items so that tied seeds never give a zero-width
    # interval); without shared per-item results, the t-interval over seeds plus a binomial bound for the items.
    # Every paper table keyed by the setting; the Baseline row per base model, clipped to 0..100; budget gains say
    # their split and sit beside the headline hidden-test Δ; mode breaches and routes count analysed runs only.
    "",
    # 7: what each training stage added on the hidden test (`test_every_submission`): RL's share per analysed run,
    # from the run's metrics (a2rl_bench.summary.stages: last RL checkpoint against the SFT checkpoint RL started from).
    "",
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
    # comparison with the runner-up leaves 0 out, in Python (`a2rl_bench.analysis.compare.marks`), not in SQL.
    "",
    # 11 (issue 38): the protocol's derived numbers are computed once, in Python (`a2rl_bench.store.derived`, by the
    # rules of `a2rl_bench.protocol`), stored beside the rows they come from, and joined by the views instead of
    # recomputed in SQL: the feedback split, the final pick's test evaluation, best-so-far and the gains on the base
    # model. Rows already stored are backfilled.
    Step("""
    CREATE TABLE run_derived (
        run_id VARCHAR PRIMARY KEY,
        feedback_split VARCHAR,         -- a2rl_bench.protocol.feedback.feedback_split of the run's protocol
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
    """, derived.refresh),
    # 12 (issue 38): the intervals across the runs of a setting are computed once, in Python
    # (`a2rl_bench.store.derived_intervals`, by `a2rl_bench.summary.intervals`), stored per group of runs (task,
    # variant, item selection, base model) and selected by the views: a setting's Δ and score, their standard error, the
    # budget gains' intervals, the base model's noise and the Baseline row. The views hold no t quantile, z or standard
    # error any more, and the macros `t975` and `binomial_se` go. Rows already stored are backfilled.
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
    DROP MACRO IF EXISTS t975;
    DROP MACRO IF EXISTS binomial_se;
    """, derived_intervals.refresh),
    # 14: a run the machine starved (failure class `environment`, issue #45) is left out of every aggregate like an
    # infrastructure failure: the settings view as it stands, under another name, with that one reason added.
    # DuckDB binds views by name when queried, so `analysed_runs` and `excluded_runs` read the new one.
    "",

    # 14 (issue 46): the views are defined once (VIEWS) and replaced whenever a store is migrated; a store of version
    # 13 gets them in that form too.
    "",

    # 15 (issue 42): `excluded_runs` says which way the machine failed an `environment` run (it starved it, or cut it
    # short on a GPU others filled) from the run's stored failure reason, and `stage_shares` how RL's SFT start was
    # found (`sft_start`: declared by the agent's `parent`, or inferred); the views are replaced with them.
    "",
]
SCHEMA_VERSION = len(MIGRATIONS)

# The views, in an order where each comes after the views it reads (DuckDB binds a view when it is created). Only
# completed runs that the analysis counts (`analysed_runs`) enter the aggregates; sums are cast to BIGINT (DuckDB's
# sum(BIGINT) is HUGEINT, which pandas receives as float64).
VIEWS: dict[str, str] = {
    "latest_runs": """
    CREATE VIEW latest_runs AS
    SELECT * FROM runs ORDER BY started_at DESC NULLS LAST, run_id;
""",
    "llm_usage_cumulative": """
    -- Tokens = input + output + cache read + cache write, cumulated in call order.
    CREATE VIEW llm_usage_cumulative AS
    SELECT run_id, seq, created_at,
           sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0) + coalesce(cache_read_tokens, 0)
               + coalesce(cache_write_tokens, 0)) OVER w::BIGINT AS cum_tokens,
           sum(coalesce(cost_usd, 0)) OVER w AS cum_cost_usd
    FROM llm_calls
    WINDOW w AS (PARTITION BY run_id ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);
""",
    "noise_floor": """
    CREATE VIEW noise_floor AS
    SELECT task, variant, item_selection, base_model, evaluator_id, split, n_rows, k_reevaluations, mean_baseline,
           range_baseline, n_items, is_binary, sd_item, noise_se, noise_floor, noise_floor_source
    FROM noise_derived;
""",
    "mode_violations": """
    CREATE VIEW mode_violations AS
    SELECT s.run_id, r.task, r.agent, r.mode, s.submission_id, s.route
    FROM submissions s JOIN runs r USING (run_id)
    WHERE s.route IS NOT NULL
      AND ((r.mode = 'sft-only' AND s.route NOT IN ('SFT', 'copy', 'none'))
           OR (r.mode = 'rl-only' AND s.route NOT IN ('GRPO', 'PPO', 'RLOO', 'RL', 'SFT+RL')));
""",
    "run_settings": """
    CREATE VIEW run_settings AS
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
    ), reasons AS (
        SELECT run_id, text AS failure_reason FROM metrics WHERE name = 'failure_reason'
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
                    -- one of the harness's own clauses (summary/verdicts.py), never the reason's free text
                    WHEN r.failure_class = 'environment'
                         AND starts_with(fr.failure_reason, 'the machine cut the run short')
                        THEN 'environment (the machine cut the run short)'
                    WHEN r.failure_class = 'environment' THEN 'environment (the machine starved the run)'
               END AS excluded_because
        FROM runs r LEFT JOIN ev USING (run_id) LEFT JOIN breaches b USING (run_id) LEFT JOIN usage u USING (run_id)
             LEFT JOIN reasons fr USING (run_id)
    )
    SELECT *, substr(md5(concat_ws('|', coalesce(task, 'unknown'), coalesce(variant, 'unknown'), item_selection,
                  coalesce(base_model, 'unknown'), coalesce(agent, 'unknown'), coalesce(driver, 'unknown'),
                  coalesce(mode, 'unknown'), coalesce(protocol, 'unknown'), coalesce(budget_s::VARCHAR, 'unknown'),
                  evaluator_id)), 1, 12) AS setting_id
    FROM keyed;
""",
    "analysed_runs": """
    -- The runs every aggregate counts; `excluded_runs` says how many others there are and why.
    CREATE VIEW analysed_runs AS SELECT * FROM run_settings WHERE excluded_because IS NULL;
""",
    "excluded_runs": """
    CREATE VIEW excluded_runs AS
    SELECT excluded_because AS reason, count(*)::BIGINT AS n_runs
    FROM run_settings WHERE excluded_because IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1;
""",
    "run_costs": """
    -- Paper table: what a run cost (driver LLM calls) and Δ per dollar, per setting.
    CREATE VIEW run_costs AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id, count(*)::BIGINT AS n,
           avg(cost_usd) AS mean_cost_usd, sum(cost_usd) AS total_cost_usd, avg(llm_tokens) AS mean_llm_tokens,
           avg(delta_test) AS mean_delta,
           CASE WHEN avg(cost_usd) > 0 THEN avg(delta_test) / avg(cost_usd) END AS delta_per_usd
    FROM analysed_runs GROUP BY ALL;
""",
    "final_routes": """
    CREATE VIEW final_routes AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.evaluator_id,
           coalesce(s.route, CASE WHEN r.final_submission_id IS NULL THEN 'base model (no pick)' ELSE 'unlabelled' END)
               AS final_route,
           count(*)::BIGINT AS n_runs, avg(r.delta_test) AS mean_delta
    FROM analysed_runs r LEFT JOIN submissions s ON s.run_id = r.run_id AND s.submission_id = r.final_submission_id
    GROUP BY ALL;
""",
    "mode_breaches": """
    -- Submissions whose route broke the run's mode, per setting (analysed runs only; excluded runs are in
    -- `failure_classes`).
    CREATE VIEW mode_breaches AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
           evaluator_id, count(*)::BIGINT AS n_runs,
           count(*) FILTER (WHERE n_mode_breaches > 0)::BIGINT AS runs_with_breaches,
           sum(n_mode_breaches)::BIGINT AS n_breaches
    FROM analysed_runs GROUP BY ALL;
""",
    "item_pairs": """
    CREATE VIEW item_pairs AS
    SELECT d.run_id, fi.item_id, bi.score AS base_score, fi.score AS final_score
    FROM run_derived d
    JOIN item_results fi ON fi.run_id = d.run_id AND fi.eval_key = d.final_test_eval_key
    JOIN item_results bi ON bi.run_id = d.run_id AND bi.eval_key = d.base_test_eval_key AND bi.item_id = fi.item_id;
""",
    "submission_tests": """
    -- Per submission: its validation score, its hidden-test score when evaluated post hoc, and its stage.
    CREATE VIEW submission_tests AS
    SELECT s.run_id, s.submission_id, s.stage, s.route, s.agent_elapsed_s, s.score AS validation_score,
           p.score AS test_score, p.n AS test_n, p.eval_key AS test_eval_key,
           coalesce(f.final_submission_id = s.submission_id, false) AS is_final_pick
    FROM submissions s
    LEFT JOIN evaluations p ON p.run_id = s.run_id AND p.submission_id = s.submission_id AND p.kind = 'posthoc'
    LEFT JOIN runs f ON f.run_id = s.run_id
    WHERE s.status = 'scored';
""",
    "setting_intervals": """
    CREATE VIEW setting_intervals AS
    SELECT setting_id, metric, design, n, n_items, estimate, ci_low, ci_high, interval, verdict
    FROM setting_derived WHERE metric IN ('delta', 'score');
""",
    "stage_shares": """
    CREATE VIEW stage_shares AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.seed, r.run_id,
           max(m.value) FILTER (WHERE m.name = 'rl_share_sft_test') AS sft_start_test,
           max(m.value) FILTER (WHERE m.name = 'rl_share_rl_test') AS last_rl_test,
           max(m.value) FILTER (WHERE m.name = 'rl_share') AS rl_share,
           max(m.value) FILTER (WHERE m.name = 'rl_share_ci_low') AS ci_low,
           max(m.value) FILTER (WHERE m.name = 'rl_share_ci_high') AS ci_high,
           max(m.value) FILTER (WHERE m.name = 'rl_share_p_value') AS p_value,
           max(m.value) FILTER (WHERE m.name = 'rl_share_n_items')::BIGINT AS n_items,
           max(m.text) FILTER (WHERE m.name = 'rl_share_submissions') AS submissions,
           -- 'declared': the SFT checkpoint the first RL submission named as its parent; 'inferred': the best SFT
           -- submission on validation before RL (no parent named, or none that is an earlier SFT submission)
           coalesce(max(m.text) FILTER (WHERE m.name = 'rl_share_start'), 'inferred') AS sft_start
    FROM analysed_runs r JOIN metrics m USING (run_id)
    WHERE m.name LIKE 'rl_share%'
    GROUP BY ALL
    ORDER BY r.setting_id, r.seed, r.run_id;
""",
    "leaderboard_ci": """
    CREATE VIEW leaderboard_ci AS
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
    SELECT s.*, i.se AS se_delta,
           i.ci_low, i.ci_high, coalesce(i.interval, 'n = 1: no interval') AS interval,
           coalesce(i.verdict, 'no significant change') AS verdict, coalesce(i.n_items, 0)::BIGINT AS n_items,
           coalesce(i.design, 'seeds') AS design,
           nf.noise_se, nf.noise_floor, nf.noise_floor_source, nf.n_items AS noise_n_items
    FROM s LEFT JOIN setting_derived i ON i.setting_id = s.setting_id AND i.metric = 'delta'
    LEFT JOIN noise_floor nf
      ON nf.split = 'test' AND (nf.task, nf.variant, nf.item_selection, nf.base_model, nf.evaluator_id)
         = (s.task, s.variant, s.item_selection, s.base_model, s.evaluator_id);
""",
    "mode_task_matrix": """
    CREATE VIEW mode_task_matrix AS
    SELECT *,
           count(*) OVER agent_setting > 1 AND mean_delta = max(mean_delta) OVER agent_setting AS highest_mean,
           count(*) OVER agent_setting > 1 AND mean_delta = min(mean_delta) OVER agent_setting AS lowest_mean
    FROM leaderboard_ci
    WINDOW agent_setting AS (PARTITION BY task, variant, item_selection, base_model, agent, driver, protocol, budget_s,
                                          evaluator_id);
""",
    "scaling_curve": """
    CREATE VIEW scaling_curve AS
    SELECT s.run_id, r.setting_id, r.task, r.variant, r.variant_label, r.item_selection, r.protocol, r.agent, r.driver,
           r.mode, r.base_model, r.evaluator_id, r.seed, r.budget_s, s.submission_id, s.agent_elapsed_s, s.split,
           s.status, s.score, d.best_so_far, d.baseline, d.improvement_so_far,
           coalesce(u.cum_tokens, 0)::BIGINT AS cum_tokens,
           coalesce(u.cum_cost_usd, 0.0) AS cum_cost_usd
    FROM submissions s
    JOIN analysed_runs r USING (run_id)
    LEFT JOIN submission_derived d USING (run_id, submission_id)
    ASOF LEFT JOIN llm_usage_cumulative u ON s.run_id = u.run_id AND s.created_at >= u.created_at;
""",
    "selection_gap": """
    CREATE VIEW selection_gap AS
    SELECT run_id, setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s, evaluator_id, variant_label, seed,
           best_val - baseline_val AS val_gain, delta_test AS test_gain,
           (best_val - baseline_val) - delta_test AS selection_gap,
           final_submission_id = best_submission_id AS final_is_val_best
    FROM analysed_runs
    WHERE protocol = 'heldout' AND best_val IS NOT NULL AND baseline_val IS NOT NULL;
""",
    "route_distribution": """
    CREATE VIEW route_distribution AS
    SELECT r.setting_id, r.task, r.variant, r.item_selection, r.base_model, r.agent, r.driver, r.mode, r.protocol,
           r.budget_s, r.evaluator_id, coalesce(s.route, 'unlabelled') AS route,
           count(*)::BIGINT AS n_submissions, count(DISTINCT s.run_id)::BIGINT AS n_runs
    FROM submissions s JOIN analysed_runs r USING (run_id)
    GROUP BY ALL;
""",
    "failure_classes": """
    -- Every run, infrastructure failures and unfinished runs included (they are counted here, nowhere else).
    CREATE VIEW failure_classes AS
    SELECT setting_id, task, variant, item_selection, base_model, agent, driver, mode, protocol, budget_s,
           evaluator_id, status, coalesce(failure_class, 'unclassified') AS failure_class,
           coalesce(excluded_because, 'analysed') AS counted_as, count(*)::BIGINT AS n_runs
    FROM run_settings GROUP BY ALL;
""",
    "system_task_scores": """
    CREATE VIEW system_task_scores AS
    SELECT 'system' AS row_kind, r.setting_id, r.agent, r.driver, r.mode, r.protocol, r.budget_s, r.task, r.variant,
           r.item_selection, r.base_model, r.evaluator_id, count(*)::BIGINT AS n, avg(r.final_test) AS mean_score,
           any_value(i.ci_low) AS ci_low, any_value(i.ci_high) AS ci_high,
           coalesce(any_value(i.interval), 'n = 1: no interval') AS interval, any_value(i.n_items) AS n_items
    FROM analysed_runs r LEFT JOIN setting_intervals i ON i.setting_id = r.setting_id AND i.metric = 'score'
    GROUP BY r.setting_id, r.agent, r.driver, r.mode, r.protocol, r.budget_s, r.task, r.variant, r.item_selection,
             r.base_model, r.evaluator_id
    UNION ALL
    SELECT 'baseline', NULL, 'Baseline', NULL, NULL, NULL, NULL, r.task, r.variant, r.item_selection, r.base_model,
           r.evaluator_id, 1, avg(r.baseline_test), any_value(b.ci_low), any_value(b.ci_high), any_value(b.interval),
           any_value(b.n_items)
    FROM analysed_runs r LEFT JOIN baseline_derived b
      ON r.task IS NOT DISTINCT FROM b.task AND r.variant IS NOT DISTINCT FROM b.variant
         AND r.item_selection IS NOT DISTINCT FROM b.item_selection AND r.base_model IS NOT DISTINCT FROM b.base_model
         AND r.evaluator_id IS NOT DISTINCT FROM b.evaluator_id
    GROUP BY r.task, r.variant, r.item_selection, r.base_model, r.evaluator_id;
""",
    "budget_deltas": """
    CREATE VIEW budget_deltas AS
    WITH per_run AS (
        SELECT r.run_id, r.setting_id, r.delta_test, f.budget_fraction, d.feedback_split AS split,
               coalesce(g.best_gain, 0.0) AS best_gain
        FROM analysed_runs r CROSS JOIN (SELECT unnest([0.25, 0.5, 1.0]) AS budget_fraction) f
        LEFT JOIN run_derived d ON d.run_id = r.run_id
        LEFT JOIN budget_gains g ON g.run_id = r.run_id AND g.budget_fraction = f.budget_fraction
    )
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
""",
    "leaderboard": """
    CREATE VIEW leaderboard AS SELECT * FROM leaderboard_ci ORDER BY task, mean_delta DESC NULLS LAST;
""",
}


def drop_views(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the views of the store `con` uses, whatever version made them (before its tables are migrated: an old
    view may read a macro or a column that a migration drops)."""
    for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary AND database_name = "
        "current_database() AND schema_name = current_schema() ORDER BY view_oid DESC").fetchall():  # fmt: skip
        con.execute(f'DROP VIEW "{name}"')


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    for sql in VIEWS.values():
        con.execute(sql)
