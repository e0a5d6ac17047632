"""Every benchmark's data variants come from one place (`BenchmarkTask.loaders`): each variant it labels can be
loaded, and a variant it does not know is a one-line error naming the ones it does."""

from __future__ import annotations

import pytest

from a2rl_bench.benchmarks import list_tasks


@pytest.mark.parametrize("task", list_tasks(), ids=lambda t: t.id)
def test_each_labelled_variant_has_a_loader_and_an_unknown_one_names_them(task):
    assert set(task.loaders()) == set(task.variant_labels)
    with pytest.raises(ValueError) as e:
        task.load("no-such-variant")
    message = str(e.value)
    assert "'no-such-variant'" in message and "\n" not in message
    assert all(repr(variant) in message for variant in task.loaders())
