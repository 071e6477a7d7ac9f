"""The Rx adapter: consecutive lifted stages share one subscription (`pipe` chains them) with
exactly the contract of one operator per stage — same items, same partial batch, same error."""

from __future__ import annotations

from typing import Any

import reactivex
from hypothesis import given, settings
from hypothesis import strategies as st
from reactivex import operators as ops
from reactivex.subject import Subject

from respflow.operators import RespflowError, each, lift, pipe


class Doubler:
    def feed(self, item: int) -> list[int]:
        return [item, item]

    def flush(self) -> list[int]:
        return [-1]


class FailAt:
    """Fails on one item value (after passing on what came before it), or at flush."""

    def __init__(self, bad: int | None, at_flush: bool) -> None:
        self.bad = bad
        self.at_flush = at_flush

    def feed_all(self, items: list[int]) -> list[int]:
        out = []
        for item in items:
            if item == self.bad:
                exc = RespflowError(f"bad item {item}", code="bad")
                exc.partial = out
                raise exc
            out.append(item + 1000)
        return out

    def flush(self) -> list[int]:
        if self.at_flush:
            raise ValueError("flush failed")
        return [7]


def run(operator: Any, batches: list[list[int]]) -> tuple[list[list[int]], str | None, bool]:
    source: Subject[list[int]] = Subject()
    out: list[list[int]] = []
    error: list[str] = []
    done: list[bool] = []
    operator(source).subscribe(out.append, lambda e: error.append(f"{type(e).__name__}:{getattr(e, 'code', '')}:{getattr(e, 'stage', '')}:{e}"), lambda: done.append(True))
    for batch in batches:
        source.on_next(batch)
    source.on_completed()
    return out, (error[0] if error else None), bool(done)


def stages(bad: int | None, at_flush: bool, bad2: int | None) -> list[Any]:
    return [
        lift(Doubler, name="double"),
        lift(lambda: FailAt(bad, at_flush), name="fail"),
        each(lambda x: x * 10, name="times10"),
        lift(lambda: FailAt(bad2, False), name="fail2"),
    ]


def unfused(ops_list: list[Any]) -> Any:
    """The same stages, each its own subscription (a plain Rx operator between them)."""
    spaced: list[Any] = []
    for op in ops_list:
        spaced += [op, ops.map(lambda batch: batch)]
    return pipe(*spaced)


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(0, 6), max_size=5), max_size=5),
    bad=st.one_of(st.none(), st.integers(0, 6)),
    at_flush=st.booleans(),
    bad2=st.one_of(st.none(), st.sampled_from([10030, 10040, 10070, 9990])),
)
def test_a_chain_of_lifts_behaves_as_one_operator_per_stage(
    batches: list[list[int]], bad: int | None, at_flush: bool, bad2: int | None
) -> None:
    fused = run(pipe(*stages(bad, at_flush, bad2)), batches)
    separate = run(unfused(stages(bad, at_flush, bad2)), batches)
    assert fused == separate


def test_the_chain_delivers_the_partial_batch_then_the_named_error() -> None:
    out, error, done = run(pipe(*stages(3, False, None)), [[1, 2, 3, 4]])
    # 1 1 2 2 pass fail (+1000), times10 and fail2 (+1000); 3 fails in 'fail': what came
    # before it is delivered first, through the later stages
    assert out == [[11010, 11010, 11020, 11020]]
    assert error == "RespflowError:bad:fail:error[bad]: bad item 3"
    assert not done


def test_a_later_stage_error_wins() -> None:
    out, error, _ = run(pipe(*stages(3, False, 10020)), [[1, 2, 3]])
    assert out == [[11010, 11010]]  # fail2 failed on 2's 10020, before fail's own error at 3
    assert error is not None and ":fail2:" in error


def test_a_bug_in_a_stage_is_an_internal_error_naming_the_step() -> None:
    out, error, done = run(pipe(*stages(None, True, None)), [[1]])
    assert out[0] == [11010, 11010]
    assert error is not None and error.startswith("RespflowError:internal_error:fail:") and "flush failed" in error
    assert not done


def test_pipe_fuses_only_consecutive_lifts() -> None:
    """A plain Rx operator between lifts is applied as it is (and still sees every batch)."""
    seen: list[list[int]] = []
    tap = ops.do_action(seen.append)
    out, error, done = run(pipe(lift(Doubler, name="d"), tap, each(lambda x: x + 1, name="inc")), [[1], [2]])
    assert seen == [[1, 1], [2, 2], [-1]]
    assert out == [[2, 2], [3, 3], [0]]
    assert error is None and done
    assert reactivex  # the operators are reactivex's own type
