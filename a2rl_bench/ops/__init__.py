"""Operating a2rl: the local Prefect server, worker, deployments and retries (`prefect_local`), GPU slots
(`gpu_slots`), stale temporary files (`housekeeping`), run progress (`progress`) and the status view (`status`)."""
