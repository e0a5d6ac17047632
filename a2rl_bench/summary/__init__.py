"""The post-hoc summary of a run: process metrics (`process`), route labels and the mode check (`route_labels`,
from the grader's route audit `a2rl_bench.grading.route_audit`), failure verdicts (`verdicts`), intervals
(`intervals`), the optional LLM narrative (`narrative`) and the run report (`report`)."""
