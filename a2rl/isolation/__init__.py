"""Isolation of the agent: the bubblewrap sandbox (`sandbox`, its launcher `forwarder`), the one process
supervisor (`procs`), walks over agent-writable trees that never follow a swapped-in link (`safefs`), and the
post-run leak audit (`leak_audit`)."""
