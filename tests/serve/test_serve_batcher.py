"""fastbert.serve.batcher.Batcher with a recording model: batches within the token budget and the
input cap, in arrival order, sorted longest first; a request spread over batches comes back whole and
in order; cancelled rows are dropped; a model error fails only its batch's requests; close() drains."""
import asyncio
import threading

import pytest

from fastbert.serve.batcher import Batcher
from fastbert.serve.runner import Seq, cost


class Model:
    """Returns each row's first id and records the batches; waits for `gate` when one is given."""

    def __init__(self, gate=None, fail_on=None):
        self.batches, self.gate, self.fail_on = [], gate, fail_on

    def __call__(self, seqs):
        self.batches.append([s.ids for s in seqs])
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail_on is not None and any(s.ids[0] == self.fail_on for s in seqs):
            raise RuntimeError("model failed")
        return [s.ids[0] for s in seqs]


def rows(*lengths, start=0):
    return [Seq(list(range(start + i, start + i + n))) for i, n in enumerate(lengths)]


def run(batcher, *requests):
    """Submit the requests together (after the first batch was taken when the model is gated) and
    gather their results or exceptions."""
    async def main():
        jobs = [batcher.submit(r) for r in requests]
        return await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
    return asyncio.run(main())


@pytest.mark.parametrize("padded", [False, True])
def test_budget_cap_order_and_sorting(padded):
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, padded=padded, max_batch_tokens=20, max_batch_requests=3)

    async def main():
        first = batcher.submit(rows(2, start=100))             # taken alone: the model waits on it
        while not model.batches:
            await asyncio.sleep(0.005)
        jobs = [batcher.submit(rows(3, 9, start=0)), batcher.submit(rows(4, 4, 4, 4, start=10)),
                batcher.submit(rows(25, start=20))]
        gate.set()
        return await asyncio.gather(first.future, *(j.future for j in jobs))

    results = asyncio.run(main())
    assert results == [[100], [0, 1], [10, 11, 12, 13], [20]]   # every request whole, in its own order
    batches = model.batches[1:]
    for b in batches:
        assert len(b) <= 3
        assert [len(r) for r in b] == sorted((len(r) for r in b), reverse=True)
        assert len(b) == 1 or cost([len(r) for r in b], padded) <= 20     # one row over budget goes alone
    flat = sorted(r[0] for b in batches for r in b)
    assert flat == [0, 1, 10, 11, 12, 13, 20]                    # nothing lost, nothing twice
    # arrival order: the budget closes each batch at the first row that does not fit
    if padded:   # rows x longest: [3, 9] costs 18; a 4 more would cost 27
        assert [sorted(len(r) for r in b) for b in batches] == [[3, 9], [4, 4, 4], [4], [25]]
    else:        # 3 + 9 + 4 = 16; then 4 + 4 + 4 (the cap), then the 25 alone
        assert [sorted(len(r) for r in b) for b in batches] == [[3, 4, 9], [4, 4, 4], [25]]
    batcher.close()


def test_cancelled_rows_are_dropped_and_errors_stay_in_their_batch():
    gate = threading.Event()
    model = Model(gate, fail_on=50)
    batcher = Batcher(model, padded=False, max_batch_tokens=6)

    async def main():
        first = batcher.submit(rows(1, start=1))
        while not model.batches:
            await asyncio.sleep(0.005)
        gone = batcher.submit(rows(2, 2, start=30))
        bad = batcher.submit(rows(3, start=50))
        good = batcher.submit(rows(5, start=60))
        batcher.cancel(gone)
        gate.set()
        results = await asyncio.gather(first.future, bad.future, good.future, return_exceptions=True)
        return results, gone.future.done()

    (first, bad, good), gone_done = asyncio.run(main())
    assert first == [1] and good == [60] and isinstance(bad, RuntimeError)
    assert not gone_done                                          # nobody waits for it: never settled
    assert all(r[0] not in (30, 31) for b in model.batches for r in b)
    batcher.close()


def test_close_drains_the_queue():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, padded=False, max_batch_tokens=4)

    async def main():
        jobs = [batcher.submit(rows(3, start=10 * i)) for i in range(5)]
        while not model.batches:
            await asyncio.sleep(0.005)
        closer = threading.Thread(target=batcher.close)
        closer.start()
        gate.set()
        results = await asyncio.gather(*(j.future for j in jobs))
        closer.join(10)
        return results, closer.is_alive()

    results, still_closing = asyncio.run(main())
    assert results == [[0], [10], [20], [30], [40]] and not still_closing
    with pytest.raises(RuntimeError, match="shutting down"):
        run(batcher, rows(1))


def test_bad_limits():
    with pytest.raises(ValueError, match="positive"):
        Batcher(Model(), padded=False, max_batch_tokens=0)
