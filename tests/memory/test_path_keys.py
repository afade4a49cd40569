"""Keys named by the trace's tree (kvstudy/memory/path_keys.py) against BlockKeys' (kvstudy/memory/prefix.py): one
key exactly when BlockKeys gives one, and the shape the run caches need (a request's keys rise; every request holding
an edge's keys starts at its first block; one lattice of step block_size per edge)."""
import random

import pytest

from kvstudy.memory.path_keys import PathKeys
from kvstudy.memory.prefix import BlockKeys


def _segments(rng):
    out = []
    for _ in range(rng.randrange(1, 30)):
        if out and rng.random() < 0.7:
            base = rng.choice(out) or []
            segs = list(base[:rng.randrange(0, len(base) + 1)])
        else:
            segs = []
        for _ in range(rng.randrange(0, 5)):
            segs.append((rng.randrange(4), rng.choice([1, 3, 7, 16, 20, 33, 64])))
        out.append(segs if segs or rng.random() < 0.5 else None)
    return out


@pytest.mark.parametrize("seed", range(150))
def test_path_keys_name_blocks_as_block_keys_do(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    segments = _segments(rng)
    paths, chains = PathKeys(segments, bs), BlockKeys(bs)
    to_path, to_chain, first = {}, {}, {}
    for _ in range(3):
        for i, segs in enumerate(segments):
            tokens = rng.randrange(0, 300)
            a = list(chains(segs, tokens)) if segs else []
            b = list(paths.keys(i, tokens)) if segs else []
            assert len(a) == len(b)
            assert all(x < y for x, y in zip(b, b[1:]))  # rising
            for ka, kb in zip(a, b):  # a bijection between the two namings
                assert to_path.setdefault(ka, kb) == kb and to_chain.setdefault(kb, ka) == ka
            for pos, kb in enumerate(b):  # an edge's keys: from its first block, one lattice of step bs
                edge = kb >> 32
                if pos == 0 or (b[pos - 1] >> 32) != edge:
                    assert first.setdefault(edge, kb) == kb
                else:
                    assert kb - b[pos - 1] == bs
    # a first block's name finds its key
    for i, segs in enumerate(segments):
        if not segs:
            continue
        start = 0
        for s, (_, length) in enumerate(segs):
            if start + length >= bs:
                assert paths.key_of(segs[:s + 1], bs) == paths.keys(i, bs)[0]
                break
            start += length


def test_edges_compress_unbranched_paths():
    """A conversation's turns (each the last one's segments and more) are one edge: one run of keys."""
    turns = [[(k, 512) for k in range(n)] for n in (2, 5, 9)]
    paths = PathKeys(turns, 16)
    keys = paths.keys(2, 9 * 512)
    assert len(keys) == 9 * 32 and len(keys.firsts) == 1
    branched = PathKeys(turns + [[(0, 512), (99, 512)]], 16)  # a branch after the first segment
    assert len(branched.keys(2, 9 * 512).firsts) == 2
