"""QueueOrder (kvstudy/policies/queue_order.py) against the plain list vLLM keeps: random joins at both ends, pops,
admission walks, filters and stable sorts with many tied keys give the same order at every step."""
import pickle
import random

import pytest

from kvstudy.policies.queue_order import QueueOrder


@pytest.mark.parametrize("seed", range(20))
def test_same_order_as_a_list_with_stable_sorts(seed):
    rng = random.Random(seed)
    key_of = {}
    q, ref, nxt = QueueOrder(), [], 0
    for _ in range(600):
        op = rng.random()
        if op < 0.3 or not ref:
            nxt += 1
            key_of[nxt] = (rng.randrange(3), rng.randrange(3))  # few distinct keys: ties decided by list position
            if rng.random() < 0.7:
                q.append(nxt)
                ref.append(nxt)
            else:
                q.appendleft(nxt)
                ref.insert(0, nxt)
        elif op < 0.45:
            assert q.first() == ref[0]
            assert q.popleft() == ref.pop(0)
        elif op < 0.6:
            q.sort(lambda i: key_of[i])
            ref.sort(key=lambda i: key_of[i])
        elif op < 0.85:
            walked = rng.randint(1, len(ref))
            started = [i for i in ref[:walked] if rng.random() < 0.4]
            q.take(walked, started)
            ref = [i for i in ref if i not in set(started)]
        else:
            gone = {i for i in ref if rng.random() < 0.1}
            q.keep(lambda i: i not in gone)
            ref = [i for i in ref if i not in gone]
        assert list(q) == ref and len(q) == len(ref) and bool(q) == bool(ref)
    assert list(pickle.loads(pickle.dumps(q))) == ref


def test_a_sort_moves_only_what_joined_since_the_last():
    q = QueueOrder([5, 3, 4])
    q.sort(lambda i: (i,))
    q.append(1)
    q.appendleft(9)
    assert list(q) == [9, 3, 4, 5, 1]
    q.sort(lambda i: (i,))
    assert list(q) == [1, 3, 4, 5, 9] and not q.front and not q.back
