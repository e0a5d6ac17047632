"""Inference: batched generation (`generation`, `decode_engine`, `remote_generation` / `generation_worker`,
`vllm_backend`) and the evaluation of one checkpoint on one split of a task object (`evaluation`)."""
