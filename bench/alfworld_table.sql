-- The alfworld hidden-test table (BENCHMARKS.md, "ALFWorld on a GPU") from the DuckDB store the runs wrote.
-- One row per run: baseline, best validation, final hidden test, delta with an item-level 95% interval,
-- wall time per phase and the GPU. Run: python bench/gpu_alfworld.py --table results/a2rl.duckdb (which adds
-- RL's share per run, a2rl_bench.summary.stages, and the intervals over seeds; t975 is the library's, added to the
-- connection by a2rl_bench.store.results.add_interval_functions).
--
-- Two item-level 95% intervals of delta: delta_ci95_* is Newcombe's hybrid score interval (Wilson bounds of
-- each success rate, combined) from the stored counts (evaluations.n_correct of n), treating the two
-- evaluations as independent; paired_ci95_* is the paired t interval over the same games' outcomes
-- (item_pairs: base and final score per hidden-test game), degenerate ([d, d]) when no game changed.
WITH test_eval AS (
    SELECT run_id, kind, n, n_correct, score, duration_s,
           n_correct::DOUBLE / n AS p,
           ((n_correct::DOUBLE / n) + 1.9208 / n
             - 1.96 * sqrt((n_correct::DOUBLE / n) * (1 - n_correct::DOUBLE / n) / n + 0.9604 / (n * n)))
             / (1 + 3.8416 / n) AS lo,
           ((n_correct::DOUBLE / n) + 1.9208 / n
             + 1.96 * sqrt((n_correct::DOUBLE / n) * (1 - n_correct::DOUBLE / n) / n + 0.9604 / (n * n)))
             / (1 + 3.8416 / n) AS hi
    FROM evaluations
    WHERE split = 'test' AND kind IN ('baseline', 'final') AND n > 0
),
paired AS (
    SELECT b.run_id, b.n AS n_test, b.n_correct AS base_correct, f.n_correct AS final_correct,
           f.p - b.p AS d,
           f.p - b.p - sqrt((f.p - f.lo) ^ 2 + (b.hi - b.p) ^ 2) AS d_lo,
           f.p - b.p + sqrt((f.hi - f.p) ^ 2 + (b.p - b.lo) ^ 2) AS d_hi
    FROM test_eval b JOIN test_eval f ON f.run_id = b.run_id AND b.kind = 'baseline' AND f.kind = 'final'
),
item_level AS (
    SELECT run_id, count(*) AS n_items, avg(final_score - base_score) AS d,
           stddev_samp(final_score - base_score) AS sd
    FROM item_pairs GROUP BY run_id
),
grading AS (
    SELECT run_id, count(*) FILTER (WHERE kind = 'submission') AS n_graded,
           round(sum(duration_s) FILTER (WHERE kind = 'submission'), 0) AS grading_s
    FROM evaluations GROUP BY run_id
),
machine AS (
    SELECT run_id, any_value(json_extract_string(detail_json, '$.gpus[0]')) AS gpu
    FROM events WHERE kind IN ('session-start', 'session-resumed') GROUP BY run_id
)
SELECT r.agent,
       r.mode,
       r.base_model,
       r.seed,
       r.budget_s,
       r.status,
       r.baseline_val,
       r.best_val,
       p.base_correct || '/' || p.n_test AS baseline_test_games,
       p.final_correct || '/' || p.n_test AS final_test_games,
       r.baseline_test,
       r.final_test,
       r.delta_test,
       round(100 * p.d_lo, 1) AS delta_ci95_lo,
       round(100 * p.d_hi, 1) AS delta_ci95_hi,
       round(100 * (i.d - t975(i.n_items - 1) * i.sd / sqrt(i.n_items)), 1) AS paired_ci95_lo,
       round(100 * (i.d + t975(i.n_items - 1) * i.sd / sqrt(i.n_items)), 1) AS paired_ci95_hi,
       r.n_submissions,
       g.n_graded,
       round(r.agent_seconds, 0) AS agent_s,
       g.grading_s,
       round(r.wall_seconds, 0) AS wall_s,
       r.phase_seconds_json AS phase_s,
       coalesce(m.gpu, 'none (CPU)') AS gpu,
       r.run_id
FROM runs r
LEFT JOIN paired p USING (run_id)
LEFT JOIN item_level i USING (run_id)
LEFT JOIN grading g USING (run_id)
LEFT JOIN machine m USING (run_id)
WHERE r.task = 'alfworld'
ORDER BY r.agent, r.mode, r.seed, r.started_at;
