"""What the live display says while it waits (issue #45): never "measuring the rate" once every item is counted,
and not "about 2 s left" held for minutes while a last slow item or the evaluation's end takes its time."""

from __future__ import annotations

from pathlib import Path


def test_a_complete_count_says_finishing_and_a_late_last_item_is_not_seconds_left():
    from a2rl.ops.progress import CountView, ItemProgress, RunProgress, Snapshot

    run = RunProgress(run_id="r", harness_dir=Path("."), phase="final_grading")
    view = CountView()
    done = ItemProgress(what="test", id="a", done=32, total=32, started_at=1000.0, at=1100.0, loaded=True)
    (count,) = view.counts(Snapshot(progress=run, items=done), now=1101.0)
    assert (count.done, count.total, count.left) == (32, 32, "finishing")
    assert done.left() == "finishing"
    # 31 of 32 at 3 s an item: the estimate runs out while the last item takes 150 s more. It said "about 2 s left"
    # for those 150 s; a count that still moves says what it is doing (the phase's own clock counts beside it).
    late = ItemProgress(what="test", id="b", done=31, total=32, started_at=2000.0, at=2093.0, loaded=True)
    view = CountView()
    shown = {view.counts(Snapshot(progress=run, items=late), now=2093.0 + t)[0].left for t in range(0, 150, 5)}
    assert shown == {"finishing"}, shown
