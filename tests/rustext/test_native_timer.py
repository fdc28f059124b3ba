"""rustext DeadlineHeap, against a sorted-list model, with an injected clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rustext import DeadlineHeap


def test_order_cancel_and_stale_handles() -> None:
    h = DeadlineHeap()
    a = h.add(30, "a")
    h.add(10, "b")
    c = h.add(20, "c")
    h.add(10, "d")
    assert len(h) == 4 and h and h.next_deadline() == 10
    assert c in h
    assert h.cancel(c) is True
    assert h.cancel(c) is False
    assert c not in h
    assert h.pop_expired(9) == []
    assert h.pop_expired(30) == ["b", "d", "a"]
    assert h.cancel(a) is False
    assert not h and h.next_deadline() is None
    b = h.add(5, ("any", "object"))
    assert a != b
    assert h.clear() == [("any", "object")]


def test_negative_and_large_deadlines() -> None:
    h = DeadlineHeap()
    h.add(2**62, "late")
    h.add(-5, "early")
    assert h.pop_expired(0) == ["early"]
    assert h.pop_expired(2**62) == ["late"]


ops = st.lists(
    st.tuples(st.sampled_from(["add", "cancel", "pop"]), st.integers(0, 100), st.integers(0, 1000)),
    max_size=300,
)


@given(ops)
@settings(max_examples=200, deadline=None)
def test_matches_sorted_model(script: list[tuple[str, int, int]]) -> None:
    h = DeadlineHeap()
    model: list[tuple[int, int, int]] = []  # (deadline, order, key)
    handles: list[tuple[int, int]] = []
    for i, (op, t, pick) in enumerate(script):
        if op == "add":
            handles.append((h.add(t, i), i))
            model.append((t, i, i))
        elif op == "cancel" and handles:
            handle, key = handles[pick % len(handles)]
            live = [m for m in model if m[2] == key]
            assert h.cancel(handle) is bool(live)
            model = [m for m in model if m[2] != key]
        elif op == "pop":
            model.sort()
            assert h.pop_expired(t) == [m[2] for m in model if m[0] <= t]
            model = [m for m in model if m[0] > t]
        assert len(h) == len(model)
        assert h.next_deadline() == (min(m[0] for m in model) if model else None)


def test_cycles_through_keys_are_collected() -> None:
    import gc
    import weakref

    class Owner:
        pass

    owner = Owner()
    owner.heap = DeadlineHeap()  # type: ignore[attr-defined]
    owner.heap.add(1, (owner, 1))  # type: ignore[attr-defined]
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None
