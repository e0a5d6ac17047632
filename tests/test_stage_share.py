"""RL's share (`summary/stages.py`) starts from the SFT checkpoint RL started from: the one the first RL submission
names as its `parent` when that is an earlier SFT submission, else the best SFT submission on validation. In the
twelfth RL pass the reference agent went on from SFT checkpoints that were not the best on validation; measured
from the best one, its RL share would have been taken against a checkpoint RL never saw."""

from __future__ import annotations

import pytest

from a2rl_bench.summary.stages import SubmissionTest, stage_share

ITEMS = 10


def _items(tests: dict[int, float]):
    """Per-item results: submission k wins the first `test / 10` of 10 items."""
    return lambda sid: {f"i{i}": float(i < tests[sid] / 10) for i in range(ITEMS)} if sid in tests else None


def _run(parent_of_first_rl: int | None) -> list[SubmissionTest]:
    # SFT 1 is the best on validation (a tie with 3 goes to the earlier); SFT 3 is what RL went on from.
    rows = [(1, "SFT", 70.0, 50.0, None), (2, "SFT", 60.0, 60.0, 1), (3, "SFT", 70.0, 70.0, 2),
            (4, "GRPO", 72.0, 80.0, parent_of_first_rl), (5, "GRPO", 71.0, 90.0, 4)]  # fmt: skip
    return [SubmissionTest(submission_id=i, stage=st, validation=v, test=t, parent=p) for i, st, v, t, p in rows]


@pytest.mark.parametrize(("parent", "start", "rule"), [
    (3, 3, "declared"),  # the agent's word, an earlier SFT submission: taken
    (None, 1, "inferred"),  # nothing said: the best SFT on validation, the earlier on a tie
    (4, 1, "inferred"),  # itself, no SFT submission: inferred
    (2, 2, "declared"),  # any earlier SFT submission the agent names, the worse one too (its word, labelled)
])  # fmt: skip
def test_rls_share_starts_where_the_first_rl_submission_says_it_started(parent, start, rule):
    tests = _run(parent)
    share = stage_share(tests, _items({t.submission_id: t.test for t in tests}))
    assert (share.sft_submission, share.rl_submission, share.start) == (start, 5, rule)
    assert share.delta == pytest.approx(90.0 - {1: 50.0, 2: 60.0, 3: 70.0}[start])
    assert share.n_items == ITEMS


def test_a_parent_after_the_first_rl_submission_or_an_rl_one_is_not_taken():
    tests = _run(7)  # names no submission of the run
    assert stage_share(tests, _items({t.submission_id: t.test for t in tests})).start == "inferred"
