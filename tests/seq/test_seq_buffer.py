"""seq/buffered.py and seq/simple.py: the buffer both sequences share."""

from __future__ import annotations

import asyncio

import pytest

from seq.buffered import BufferedSeq
from seq.errors import SeqClosed, SeqInconsistent, SeqUnavailable
from seq.simple import LocalCounter, SimpleBufSeq


class Scripted(BufferedSeq):
    """A source whose fetches the test releases one by one."""

    def __init__(self, buf_size: int) -> None:
        super().__init__(buf_size)
        self.asked: list[int] = []
        self.gates: list[asyncio.Future[tuple[int, int]]] = []
        self.next_id = 1
        self.asked_event = asyncio.Event()

    async def _fetch(self, n: int) -> tuple[int, int]:
        self.asked.append(n)
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self.gates.append(fut)
        self.asked_event.set()
        return await fut

    def release(self, rng: tuple[int, int] | None = None) -> None:
        fut = next(f for f in self.gates if not f.done())
        if rng is None:
            n = self.asked[self.gates.index(fut)]
            rng = (self.next_id, self.next_id + n)
        self.next_id = rng[1]
        fut.set_result(rng)

    async def wait_asked(self, count: int) -> None:
        while len(self.asked) < count:
            self.asked_event.clear()
            await asyncio.wait_for(self.asked_event.wait(), 5)


@pytest.mark.parametrize("buf", [0, 1, 2, 1024])
async def test_simple_starts_at_one_and_has_no_gaps(buf: int) -> None:
    async with SimpleBufSeq(buf) as s:
        got = [await s.next() for _ in range(3000)]
    assert got == list(range(1, 3001))


async def test_stream_and_close() -> None:
    s = SimpleBufSeq(10)
    got = []
    async for i in s.stream():
        got.append(i)
        if len(got) == 25:
            break
    assert got == list(range(1, 26))
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(SeqClosed):
        await s.next()


async def test_shared_among_tasks_increasing_in_return_order() -> None:
    counter = LocalCounter()
    seqs = [SimpleBufSeq(b, counter=counter) for b in (0, 3, 100)]
    out: list[int] = []

    async def worker(s: SimpleBufSeq) -> None:
        for _ in range(500):
            out.append(await s.next())
            await asyncio.sleep(0)

    await asyncio.gather(*(worker(s) for s in seqs for _ in range(4)))
    assert len(set(out)) == len(out) == 6000


async def test_double_buffering_fetches_before_running_dry() -> None:
    s = Scripted(10)
    first = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    s.release()
    assert await first == 1
    assert s.asked == [10]
    for want in range(2, 6):  # handing out ID 5 (half used) starts the next fetch
        assert await s.next() == want
    await s.wait_asked(2)
    s.release()
    await asyncio.sleep(0)
    got = [await s.next() for _ in range(15)]
    assert got == list(range(6, 21))  # no wait at the boundary: the next range was already there
    await s.aclose()


async def test_buf0_fetches_what_waiters_need() -> None:
    s = Scripted(0)
    waiters = [asyncio.ensure_future(s.next()) for _ in range(5)]
    await s.wait_asked(1)
    assert s.asked == [1]  # the first caller's fetch was already decided
    s.release()
    await s.wait_asked(2)
    assert s.asked[1] == 4  # the 4 that waited meanwhile share the next fetch
    s.release()
    assert sorted(await asyncio.gather(*waiters)) == [1, 2, 3, 4, 5]
    await s.aclose()


async def test_an_error_reaches_every_waiter() -> None:
    class Failing(BufferedSeq):
        async def _fetch(self, n: int) -> tuple[int, int]:
            await asyncio.sleep(0.01)
            raise SeqUnavailable("no quorum")

    s = Failing(0)
    res = await asyncio.gather(*(s.next() for _ in range(4)), return_exceptions=True)
    assert all(isinstance(r, SeqUnavailable) for r in res)
    await s.aclose()


async def test_range_below_one_seen_is_refused() -> None:
    s = Scripted(0)
    t = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    s.release((100, 101))
    assert await t == 100
    t = asyncio.ensure_future(s.next())
    await s.wait_asked(2)
    s.release((50, 51))
    with pytest.raises(SeqInconsistent):
        await t
    await s.aclose()


async def test_close_wakes_waiters() -> None:
    s = Scripted(0)
    t = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    await s.aclose()
    with pytest.raises(SeqClosed):
        await t


async def test_adaptive_fetch_grows_when_consumers_outpace_the_round_trip() -> None:
    s = Scripted(10)
    first = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    s.release()
    assert await first == 1
    got = [1]
    for _ in range(4):
        got.append(await s.next())  # ID 5 starts the background fetch
    await s.wait_asked(2)
    assert s.asked == [10, 10]
    rest = asyncio.ensure_future(asyncio.gather(*(s.next() for _ in range(6))))
    await asyncio.sleep(0)
    s.release()  # consumers ran dry while it was in flight
    got += await rest
    assert s.fetch_size == 40  # the next fetch asks for four times as many
    for _ in range(4):
        got.append(await s.next())  # 12..15: ID 15 (half of [11, 21)) starts the next fetch
    await s.wait_asked(3)
    assert s.asked[2] == 40
    for _ in range(4):
        got.append(await s.next())  # 16..19: one ID of [11, 21) left when the range arrives
    s.release()
    await asyncio.sleep(0)
    assert s.fetch_size == 40  # 1 of 10 left: neither late (< 1/16) nor early (> 1/4)
    for _ in range(41):  # 20, then 21..60 (a 4th fetch starts at 40 and is never needed)
        got.append(await s.next())
    assert got == list(range(1, len(got) + 1))  # one fetch in flight: still no gap, in order
    await s.aclose()


async def test_adaptive_fetch_shrinks_for_slow_consumers_and_respects_max() -> None:
    s = Scripted(10)
    s.fetch_size = 40  # as if it had grown
    t = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    s.release()
    assert await t == 1
    for _ in range(20):
        await s.next()  # ID 20 (half of 40) starts the next fetch
    await s.wait_asked(2)
    s.release()  # arrives with 19 of 40 unused: more than a quarter
    await asyncio.sleep(0)
    assert s.fetch_size == 20
    with pytest.raises(ValueError):
        SimpleBufSeq(10, max_fetch=5)
    fixed = Scripted(10)
    fixed.max_fetch = 10
    fixed.fetch_size = 10
    t = asyncio.ensure_future(fixed.next())
    await fixed.wait_asked(1)
    fixed.release()
    await t
    for _ in range(4):
        await fixed.next()
    await fixed.wait_asked(2)
    w = asyncio.ensure_future(asyncio.gather(*(fixed.next() for _ in range(6))))
    await asyncio.sleep(0)
    fixed.release()
    await w
    assert fixed.fetch_size == 10  # max_fetch == buf_size: no adaptation
    await s.aclose()
    await fixed.aclose()


async def test_adaptive_fetch_grows_when_a_range_arrives_just_in_time() -> None:
    s = Scripted(32)
    t = asyncio.ensure_future(s.next())
    await s.wait_asked(1)
    s.release()
    assert await t == 1
    for _ in range(30):
        await s.next()  # up to 31: ID 16 started the next fetch; 1 of 32 left
    await s.wait_asked(2)
    s.release()
    await asyncio.sleep(0)
    assert s.fetch_size == 64
    assert [await s.next() for _ in range(2)] == [32, 33]  # no wait: the range was queued
    await s.aclose()


async def test_a_remote_prefetch_yields_but_ids_stay_in_return_order() -> None:
    s = Scripted(10)
    order: list[int] = []

    async def take() -> None:
        order.append(await s.next())

    t = asyncio.ensure_future(take())
    await s.wait_asked(1)
    s.release()
    await t
    await asyncio.gather(*(take() for _ in range(8)))  # crosses the refill point (ID 5)
    assert order == list(range(1, 10))  # the task that started the fetch yielded before taking an ID
    assert s.asked == [10, 10]  # and the fetch went out before the buffer ran dry
    await s.aclose()
