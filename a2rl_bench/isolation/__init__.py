"""Isolation of the agent: the bubblewrap sandbox (`sandbox`, its launcher `forwarder`), the one process
supervisor (`procs`), walks over agent-writable trees that never follow a swapped-in link (`safefs`), and the
leak audit's views of a text (`leak_decode`; the post-run audit itself is `a2rl_bench.summary.leak_audit`)."""
