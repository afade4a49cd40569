"""Block keys named by the trace's tree of shared content (issue 59, item 3): the keys ``BlockKeys``
(kvstudy/memory/prefix.py) gives, renamed so that one run of keys covers a whole unbranched stretch of the tree
instead of one segment.

The requests' segment lists form a tree (a node per distinct segment after a given path, as ``BlockKeys``' chains).
An *edge* is a maximal path of nodes each the only child of the one before (SGLang's radix tree compresses the same
way); it is named by its first node. A block whose end lies at token E of a request, inside node X of edge h, is keyed
``(h << 32) + (E - start of h)``. Two blocks get one key exactly when they end at the same token of the same node,
which is when ``BlockKeys`` gives them one key: only the names change, and the caches, the offload tiers and the
policies compare keys only for equality (the run caches also need a request's keys to rise, an edge's keys to be one
lattice of step block_size, and a request to hold an edge's keys from its first block: each holds here as it does per
chain, edges being numbered after their parents). A Mooncake request's 20-odd segments are one or a few edges, so the
run caches (prefix_runs.py, offload_runs.py) do a few steps per request where they did one per segment.

The tree is built once per run from every request's segments (``PathKeys.of``: replicas given the same list share it,
and any two get the same names from the same list, so a key means one content on every replica).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from kvstudy.memory.prefix import KeyRuns

_LAST: list = [None]  # (the segments list, block size, its PathKeys): replicas of one run share the tree


class PathKeys:
    """Keys of requests' full blocks (``keys(i, tokens)``, as ``KeyRuns``) by the edges of their segments' tree."""

    def __init__(self, segments: Sequence[Optional[Sequence[Tuple[object, int]]]], block_size: int) -> None:
        self.block_size = int(block_size)
        kids: dict = {}   # (parent node, segment key, length) -> node
        parent: List[int] = []
        start: List[int] = []  # a node's first token (the tokens of the path before it)
        ends: List[int] = []   # a node's end token
        children: List[int] = []
        last: List[int] = []   # per request: the node its segments end in (-1: none)
        for segs in segments:
            node, pos = -1, 0
            if segs:
                for key, length in segs:
                    link = (node, key, length)
                    nxt = kids.get(link)
                    if nxt is None:
                        nxt = kids[link] = len(parent)
                        parent.append(node)
                        start.append(pos)
                        ends.append(pos + length)
                        children.append(0)
                        if node >= 0:
                            children[node] += 1
                    node = nxt
                    pos += length
            last.append(node)
        # a node heads an edge unless it is its parent's only child (nodes are numbered after their parents)
        head = list(range(len(parent)))
        for v, p in enumerate(parent):
            if p >= 0 and children[p] == 1:
                head[v] = head[p]
        self._kids, self._parent, self._start, self._head, self._end, self._last = \
            kids, parent, start, head, ends, last

    @classmethod
    def of(cls, segments, block_size: int) -> "PathKeys":
        """The tree of this segments list (built once: the replicas of a run pass the same list)."""
        kept = _LAST[0]
        if kept is not None and kept[0] is segments and kept[1] == block_size:
            return kept[2]
        made = cls(segments, block_size)
        _LAST[0] = (segments, block_size, made)
        return made

    def _edges(self, i: int) -> List[Tuple[int, int]]:
        """(edge, the end token of request i's path in it) of each edge request i's segments pass, first to last."""
        v = self._last[i]
        out = []
        head, parent, end = self._head, self._parent, self._end
        while v >= 0:
            h = head[v]
            out.append((h, end[v]))
            v = parent[h]
        out.reverse()
        return out

    def keys(self, i: int, tokens: int) -> KeyRuns:
        """Keys of request i's full blocks within its first ``tokens`` tokens (past its segments: none)."""
        bs = self.block_size
        cap = int(tokens) // bs * bs
        firsts: List[int] = []
        starts: List[int] = [0]
        n = 0
        start = self._start
        for h, stop in self._edges(i):
            s = start[h]
            if s >= cap:
                break
            first_end = (s // bs + 1) * bs  # the first block ending inside the edge
            last = stop if stop < cap else cap
            if first_end <= last:
                last -= last % bs
                firsts.append((h << 32) + first_end - s)
                n += (last - first_end) // bs + 1
                starts.append(n)
        return KeyRuns(firsts, starts, bs)

    def key_of(self, segments: Sequence[Tuple[object, int]], end: int) -> Optional[int]:
        """The key of the block ending at token ``end`` inside the last of ``segments`` (a path from the root), or
        None: no request has that path."""
        node = -1
        for key, length in segments:
            node = self._kids.get((node, key, length))
            if node is None:
                return None
        h = self._head[node]
        return (h << 32) + end - self._start[h]

    def segment_total(self, i: int) -> int:
        """Tokens request i's segments cover."""
        v = self._last[i]
        return self._end[v] if v >= 0 else 0
