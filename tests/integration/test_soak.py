"""Nothing leaks: many streams through one ``respflow serve`` process (a real process, a real
paced upstream), a fifth abandoned by their client mid-stream, a tenth against an upstream that
cuts. Sized for CI; ``respflow bench --serve --soak`` runs the full 2,000 (figures in the README)."""

from __future__ import annotations

import pytest

from respflow.flows._bench_serve import run_soak

pytestmark = pytest.mark.timeout(180)


def test_a_soak_leaves_threads_fds_and_memory_as_they_were() -> None:
    total, concurrency = 400, 100
    result = run_soak(total=total, concurrency=concurrency, rate=50.0, events=30, progress=lambda _: None)
    # every stream ended well-formed, as its kind should: 0..N numbered, one terminal (a cut
    # upstream reported failed, never completed); abandoned ones were the client's choice
    abandoned = len([i for i in range(total) if i % 5 == 0])
    cut = len([i for i in range(total) if i % 10 == 3 and i % 5 != 0])
    assert result["seen"] == {"abandoned": abandoned, "failed": cut, "completed": total - abandoned - cut}
    before, after = result["before"], result["after"]
    assert after["threads"] <= before["threads"] + 1, (before, after)
    assert after["fds"] <= before["fds"] + 4, (before, after)  # + a kept-alive upstream connection or two
    assert after["rss_mib"] <= before["rss_mib"] * 1.10 + 8, (before, after)
