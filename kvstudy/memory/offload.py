"""A KV offload tier behind the prefix cache (issue 49): host DRAM and local disk holding the blocks the GPU evicts,
loaded back when a later prompt starts with them, or recomputed when that is cheaper.

Semantics (each named where it follows or leaves vLLM's CPU offloading / KV connectors, LMCache and Mooncake's store):

* **Write on eviction.** A cached block the GPU's prefix cache evicts (kvstudy/memory/prefix.py: least recently
  released first) is written to the first tier; a block already there is only touched. Writes are asynchronous
  (LMCache's ``store`` runs on a side stream; vLLM's offloading connector likewise): they cost no iteration time and
  are counted in bytes per tier. (LMCache also stores at prefill time, write-through; kvstudy writes on eviction
  only, as the issue and SGLang's HiCache write-back policy do.)
* **Tiers, LRU.** Each tier holds at most ``capacity`` blocks, least recently used (written or loaded) first out; a
  block leaving a tier moves to the next one (written there) or, from the last, is dropped. A block lives in one tier
  at a time (exclusive): written to the first tier again, it leaves a lower one.
* **Lookup.** A prefill's prefix is looked up on the GPU first (its hit, as without tiers), then in the tiers, block
  after block from where the GPU's hit ends, as long as each next block is in some tier (vLLM's connector
  ``get_num_new_matched_tokens``: the external hit continues the local one). At most ``(prompt - 1) // block_size``
  blocks are skipped in all (a prefill computes at least the prompt's last token).
* **Load or recompute** (``choice``): ``load`` always (vLLM and LMCache), ``recompute`` never (a baseline), ``auto``:
  load when the transfer takes less time than those tokens add to the request's prefill (the latency model's prefill
  of the request's rest with them, minus without them: ``recompute_seconds``, the marginal cost). Per GPU: each GPU moves its own shard of the KV over its own link,
  so a block's transfer is its per-GPU bytes over the tier's read bandwidth.
* **Timing** (``load``): ``blocking``, the iteration waits for every load it started before computing (vLLM's
  offloading connector without layer-wise transfer: the iteration's time plus the loads'); ``overlapped``, loads are
  layer by layer, each layer's transfer overlapping the previous layer's compute (LMCache's layer-wise mode): the
  longer of compute and transfer, plus one layer's share of the shorter, which nothing hides.
* Loaded blocks take GPU blocks like computed ones (the request's own, then cached under their keys): memory is the
  same whether a prefix is loaded or recomputed; only compute and time differ.

Records: per request ``offload_loaded_tokens``; per run the summary's ``offload`` (per tier: blocks held at the end,
blocks and bytes written and read, hit rate: tokens loaded / tokens looked up at every prefill start), the lookups,
and the loads' seconds.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, Optional, Sequence

from kvstudy.costs.transfer import Link, layerwise
from kvstudy.errors import ConfigError
from kvstudy.memory.offload_runs import RunLru, falling_runs, rising_runs, run_keys

#: the tiers kvstudy names, in order (a config sets each one's size and bandwidths; ``None`` size: no such tier)
TIER_NAMES = ("host", "disk")
LOAD_MODES = ("blocking", "overlapped")
CHOICES = ("auto", "load", "recompute")


@dataclass
class Tier:
    name: str
    capacity_gb: float          # per GPU; 1e9: unlimited for any run
    read_gbps: float            # GB/s per GPU, into GPU memory
    write_gbps: float           # GB/s per GPU (asynchronous: counted, not timed)
    capacity_blocks: float = 0  # set by ``reset``
    blocks: RunLru = field(default_factory=lambda: RunLru(1))  # least recently used first (set by ``reset``)
    written_blocks: int = 0
    read_blocks: int = 0

    def __post_init__(self) -> None:
        #: the tier's read path into GPU memory (kvstudy/costs/transfer.py), a block at a time
        self.read_link = Link(self.read_gbps) if self.read_gbps > 0 else None


class _Pending:
    """A falling run of keys ``[lo, hi)`` a replica's connector wrote, not yet carried out (``put_later``), and the
    replica's counts of written blocks per tier."""

    __slots__ = ("lo", "hi", "replica", "written")

    def __init__(self, lo: int, hi: int, replica: int, written: List[int]) -> None:
        self.lo, self.hi, self.replica, self.written = lo, hi, replica, written


class OffloadTiers:
    """The tiers of one memory, or one pool the replicas of a cluster share (``shared``: Mooncake's store); each
    memory reaches it through its own :class:`OffloadConnector` (its replica's loads, counters and clock)."""

    def __init__(self, tiers: Sequence[Tier], load: str = "blocking", choice: str = "auto",
                 shared: bool = False) -> None:
        if load not in LOAD_MODES:
            raise ValueError(f"memory.offload.load={load!r}: allowed {', '.join(LOAD_MODES)}")
        if choice not in CHOICES:
            raise ValueError(f"memory.offload.choice={choice!r}: allowed {', '.join(CHOICES)}")
        if not tiers:
            raise ValueError("memory.offload: no tier (give memory.offload.host_gb and/or disk_gb)")
        self._tiers: List[Tier] = list(tiers)
        #: a write the pool has taken but not yet carried out (``put_later``), or None
        self._pending: Optional[_Pending] = None
        self._local_sums: Dict[int, float] = {}
        self.load_mode, self.choice, self.shared = load, choice, shared
        self.block_bytes = 0
        self._owner: Dict[Hashable, int] = {}  # block key -> the replica whose node holds it (a shared pool only)
        #: ``bytes -> seconds`` of a read from another replica's node (a shared pool: the node's send/recv profile,
        #: set by kvstudy/running/assemble.py); None: every block is local
        self.remote_seconds: Optional[Callable[[float], float]] = None

    @property
    def tiers(self) -> List[Tier]:
        """The tiers, first to last, with every write taken carried out (``put_later``): whoever reads them sees the
        state the writes in order make."""
        if self._pending is not None:
            self.flush()
        return self._tiers

    @property
    def owner(self) -> Dict[Hashable, int]:
        """Block key -> the replica whose node holds it (a shared pool only), every write taken carried out."""
        if self._pending is not None:
            self.flush()
        return self._owner

    def reset(self, block_bytes_per_gpu: int, block_size: int = 1) -> None:
        """Empty, sized in blocks of ``block_bytes_per_gpu``; keys step by ``block_size`` along a chain (``BlockKeys``).
        """
        self.flush()  # a write taken is counted for its replica first, as a write at once was
        # count -> seconds of that many blocks read from the one tier (``transfer_seconds``): its link and the block's
        # bytes stay as they are until the next reset
        self._local_sums = {}
        self.block_bytes, self.step = int(block_bytes_per_gpu), int(block_size)
        for tier in self.tiers:
            # whole blocks; 1e-6 absorbs the rounding of a size given as blocks x bytes / 1e9
            tier.capacity_blocks = math.floor(tier.capacity_gb * 1e9 / self.block_bytes + 1e-6) if self.block_bytes else 0
            tier.blocks = RunLru(self.step)
            tier.written_blocks = tier.read_blocks = 0
        self._owner.clear()

    def level(self, key: int) -> Optional[int]:
        """The tier holding ``key``, or None."""
        for k, tier in enumerate(self.tiers):
            if tier.blocks.find(key) is not None:
                return k
        return None

    # --- writes ---------------------------------------------------------------------------------------------------
    def put(self, keys: Sequence[int], replica: int = 0) -> int:
        """Blocks a replica's GPU evicted (in eviction order) are written to the first tier (module docstring);
        returns how many were written (a block the pool holds already is only touched)."""
        self.flush()
        return self._put_runs(falling_runs(keys, self.step), replica)

    def put_later(self, keys: Sequence[int], replica: int, written: List[int]) -> None:
        """``put``, each tier's new blocks added to ``written`` (the replica's counts), carried out when the pool is
        next read (``tiers``, ``owner``, the lookups, ``reset``) or another write comes. Why: a GPU whose decoding
        requests grow into new blocks evicts its oldest cached run one block at a time, each block the one below the
        last; such writes are taken as one run and written at once. That is exact when each block that continues the
        run is in no tier (checked as it comes: sufficient, if more than needed) and nothing reads the pool in
        between: a tier appends and then drops its least recently used until it fits, so new blocks appended one by
        one or together leave the same blocks, in the same order, to the same next tier, with the same counts
        (tests/memory/test_offload_runs.py checks it against ``put`` at once). ``written`` is complete once the pool
        has been read (a connector's ``summary`` reads it first)."""
        runs = falling_runs(keys, self.step)
        pending = self._pending
        if len(runs) == 1:
            lo, hi = runs[0]
            if pending is not None and pending.lo == hi and pending.replica == replica and pending.written is written \
                    and (lo >> 32) == (hi >> 32) and not self._held(lo, hi):
                pending.lo = lo  # continues the run taken, downwards
                return
            self.flush()
            self._pending = _Pending(lo, hi, replica, written)
            return
        self.flush()
        self._put_counted(runs, replica, written)

    def flush(self) -> None:
        """The write taken (``put_later``), carried out."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._put_counted([(pending.lo, pending.hi)], pending.replica, pending.written)

    def _held(self, lo: int, hi: int) -> bool:
        """Whether some key of ``[lo, hi)`` is in some tier."""
        tiers = self._tiers
        if len(tiers) == 1:  # (the usual, checked for every block a decode evicts)
            return tiers[0].blocks.holds_any(lo, hi)
        for tier in tiers:
            if tier.blocks.holds_any(lo, hi):
                return True
        return False

    def _put_counted(self, runs: List[tuple], replica: int, written: List[int]) -> None:
        """``runs`` written now (``_put_runs``), each tier's new blocks added to ``written``."""
        tiers = self._tiers
        before = [t.written_blocks for t in tiers]
        self._put_runs(runs, replica)
        for k, t in enumerate(tiers):
            written[k] += t.written_blocks - before[k]

    def _put_runs(self, runs: List[tuple], replica: int) -> int:
        """``put`` of falling runs of keys."""
        # By runs (kvstudy/memory/offload_runs.py): the batch goes to the end of the first tier in its order (a block
        # there already moves to the end: touched, not written again; one in a lower tier moves up, written), then
        # the tier's least recently used leave until it fits.
        for tier in self._tiers[1:]:  # a block lives in one tier: those written to the first leave a lower one
            for lo, hi in runs:
                tier.blocks.cut(lo, hi)
        if self.shared:  # the blocks written now are held by this replica's node (a touched one stays where it is)
            first, step = self._tiers[0].blocks, self.step
            self._owner.update(dict.fromkeys([key for lo, hi in runs for a, b in first.gaps(lo, hi)
                                             for key in range(a, b, step)], replica))
        return self._append(0, runs)

    def _append(self, level: int, runs: Sequence[tuple]) -> int:
        """Runs of keys go to the end of tier ``level`` in their order (one it holds already moves there, touched);
        then its least recently used leave, to the next tier (written there) or dropped, until it fits. Returns how
        many it had not held."""
        tier = self._tiers[level]
        blocks = tier.blocks
        new = 0
        for lo, hi in runs:
            new += blocks.add(lo, hi)
        tier.written_blocks += new
        over = len(blocks) - tier.capacity_blocks
        if over > 0:
            old = blocks.pop_first(over)
            if level + 1 < len(self._tiers):
                self._append(level + 1, old)  # demoted (their owner unchanged)
            elif self.shared:
                deque(map(self._owner.pop, run_keys(old, self.step)), maxlen=0)  # dropped
        return new

    # --- lookups ----------------------------------------------------------------------------------------------------
    def match(self, keys: Sequence[int], start: int, most: int) -> List[int]:
        """The tiers holding ``keys[start:]``, block after block while each is in some tier (at most up to ``most``)."""
        end, step = min(most, len(keys)), self.step
        if len(self.tiers) == 1:  # one tier (the usual): a run of keys it holds
            blocks, k = self.tiers[0].blocks, start
            for lo, hi in rising_runs(keys, start, end, step):
                n = (min(blocks.held_from(lo), hi) - lo) // step
                k += n
                if lo + n * step < hi:
                    break
            return [0] * (k - start)
        out: List[int] = []
        for lo, hi in rising_runs(keys, start, end, step):
            at = lo
            while at < hi:
                for level, tier in enumerate(self.tiers):
                    piece = tier.blocks.find(at)
                    if piece is not None:
                        break
                else:
                    return out
                top = min(piece[1], hi)
                out.extend([level] * ((top - at) // step))
                at = top
        return out

    def transfer_seconds(self, keys: Sequence[Hashable], start: int, count: int, replica: int = 0) -> float:
        """Seconds to read ``keys[start:start+count]`` into one GPU of ``replica``: a block its own node holds at its
        tier's read bandwidth, one after another; the blocks another node holds (a shared pool) in one network
        transfer (the node's send/recv profile)."""
        tiers, owner, b = self.tiers, self.owner, self.block_bytes
        if self.remote_seconds is None and len(tiers) == 1:  # all local, one tier: count x block / bandwidth
            got = self._local_sums.get(count)
            if got is None:  # summed block by block as the general case (bit-equal to it), once per count
                seconds = tiers[0].read_link.seconds
                got = self._local_sums[count] = sum(seconds(b) for _ in range(count))
            return got
        local, remote = 0.0, 0
        for key in keys[start:start + count]:
            if self.remote_seconds is not None and owner.get(key, replica) != replica:
                remote += 1
            else:
                local += tiers[self.level(key)].read_link.seconds(b)
        return local + (self.remote_seconds(remote * b) if remote else 0.0)


class OffloadConnector:
    """The offload tiers as one memory's KV connector (kvstudy/memory/connector.py's ``KVConnector``): its own tiers,
    or a pool shared by replicas; what its replica wrote, loaded and waits for."""

    name = "offload"
    saves = True  # the GPU's evicted blocks are written to the first tier

    def __init__(self, pool: OffloadTiers, replica: int = 0) -> None:
        self.pool, self.replica = pool, replica
        #: ``(tokens, context) -> seconds``: the latency model's prefill of ``tokens`` past ``context`` (the engine
        #: gives it: ``set_timing``); used by ``choice=auto``
        self.recompute_seconds: Optional[Callable[[int, int], float]] = None
        self.num_layers = 1
        self.block_size = 1
        self._counters()

    def set_timing(self, num_layers: int, recompute_seconds: Callable[[int, int], float]) -> None:
        """The layers one GPU runs (the overlapped load's pipeline) and the latency model's prefill seconds
        (``choice=auto``)."""
        self.num_layers, self.recompute_seconds = max(1, int(num_layers)), recompute_seconds

    def _counters(self) -> None:
        n = len(self.pool.tiers)
        self.loaded: Dict[int, int] = {}  # request -> prompt tokens loaded from a tier (all its prefills)
        self.written, self.read = [0] * n, [0] * n
        self.remote_blocks = 0
        self.pending_seconds = 0.0  # loads started in the iteration being formed
        self.load_seconds_total = 0.0
        self.recomputed_blocks = 0  # found in a tier, recomputed (choice)
        #: prefill starts that looked their context up (first prefills and recomputes after a preemption alike) and
        #: the tokens they looked up: a tier's hit rate is its loaded tokens over these (``looked_up``)
        self.lookups = 0
        self.lookup_tokens = 0
        #: the last ``plan``'s lookup, ``(keys, hit, most, blocks found)``: ``skipped``, which the memory calls right
        #: after a ``plan`` that answered 0, counts from it instead of looking the tiers up again
        self._found: Optional[tuple] = None

    def bind(self, block_size: int, block_bytes_per_gpu: int) -> None:
        """A run starts: this replica's counters cleared; its own tiers emptied (a shared pool by replica 0, which the
        cluster driver starts first)."""
        self.block_size = int(block_size)
        if not self.pool.shared or self.replica == 0:
            self.pool.reset(block_bytes_per_gpu, block_size)
        elif self.pool.step != self.block_size:  # a key names a block of one size: a pool's replicas share it
            raise ConfigError(f"memory.offload.shared=true with replicas of different memory.block_size "
                              f"({self.pool.step} and {self.block_size} tokens): the pool's blocks are of one size; "
                              f"allowed: one block size on every replica, or shared=false")
        self._counters()

    def share(self, pool: OffloadTiers, replica: int) -> None:
        """Use ``pool`` (one the cluster's replicas share) as replica ``replica``."""
        self.pool, self.replica = pool, replica
        self._counters()

    def connect_replicas(self, connectors: Sequence["OffloadConnector"], link: Callable[[], Callable[[float], float]]) \
            -> bool:
        """``shared``: one pool for every replica (Mooncake's store), every tier's size times the replicas
        (``memory.offload.*_gb`` is per GPU), a block another node wrote read over ``link()``; returns True then (the
        replicas see each other's writes)."""
        pool = self.pool
        if not pool.shared:
            return False
        pool.remote_seconds = link()
        for tier in pool.tiers:
            tier.capacity_gb *= len(connectors)
        for k, connector in enumerate(connectors):
            connector.share(pool, k)
        return True

    def save(self, keys: Sequence[Hashable]) -> None:
        """The GPU's prefix cache evicted these blocks: written to the first tier (and what it demotes, to the next)."""
        self._found = None  # the tiers change: a later ``skipped`` looks them up
        self.pool.put_later(keys, self.replica, self.written)

    def plan(self, keys: Sequence[Hashable], hit: int, most: int, tokens: int) -> int:
        """Blocks past the GPU's ``hit`` to load, for a prefill of ``tokens`` tokens (0: none found, or recomputing
        is chosen: module docstring). ``auto`` weighs the transfer against what those tokens add to the request's own
        prefill (its time with them minus without them: the marginal cost, not a standalone iteration's)."""
        pool = self.pool
        levels = pool.match(keys, hit, most)
        self._found = (keys, hit, most, len(levels))
        if not levels or pool.choice == "recompute":
            return 0
        if pool.choice == "auto":
            if self.recompute_seconds is None:
                raise RuntimeError("memory.offload.choice=auto needs the latency model: the engine gives it "
                                   "(set_timing) when a run starts (kvstudy/engine/loop.py)")
            block_size = self.block_size
            n = len(levels) * block_size
            rest = max(1, tokens - hit * block_size - n)  # the prefill computes these anyway
            recompute = (self.recompute_seconds(rest + n, hit * block_size)
                         - self.recompute_seconds(rest, hit * block_size + n))
            if pool.transfer_seconds(keys, hit, len(levels), self.replica) >= recompute:
                return 0
        return len(levels)

    def load(self, i: int, keys: Sequence[Hashable], start: int, count: int) -> float:
        """Request i's ``keys[start:start+count]`` are read into the GPU: their tiers touched (LRU: to the end, in
        order), the time added to the iteration's loads; returns the seconds."""
        pool = self.pool
        self._found = None  # the tiers change: a later ``skipped`` looks them up
        self.loaded[i] = self.loaded.get(i, 0) + count * self.block_size
        seconds = pool.transfer_seconds(keys, start, count, self.replica)
        step = pool.step
        # touched, tail first (as the GPU releases a request's blocks): the prefix's head is the most recently used, so
        # the tier drops a chain from its end, never its start
        if len(pool.tiers) == 1:
            tier = pool.tiers[0]
            for lo, hi in reversed(rising_runs(keys, start, start + count, step)):
                tier.blocks.add(lo, hi)
            tier.read_blocks += count
            self.read[0] += count
        else:
            chunk = keys[start:start + count]
            levels = [pool.level(key) for key in chunk]
            for level, tier in enumerate(pool.tiers):
                mine = [key for key, lv in zip(chunk, levels) if lv == level]
                if mine:
                    for lo, hi in falling_runs(mine[::-1], step):
                        tier.blocks.add(lo, hi)
                    tier.read_blocks += len(mine)
                    self.read[level] += len(mine)
        if pool.remote_seconds is not None:
            self.remote_blocks += sum(1 for key in keys[start:start + count]
                                      if pool.owner.get(key, self.replica) != self.replica)
        self.pending_seconds += seconds
        self.load_seconds_total += seconds
        return seconds

    def looked_up(self, tokens: int) -> None:
        """A prefill of ``tokens`` tokens starts and looks its context up (every start counts, a recompute after a
        preemption too, and one that shares nothing: it misses): the denominator of the tiers' hit rates, counted at
        the same lookups as their hits, so a hit rate lies in [0, 1] (issue 54: reloads after preemption had been
        counted against each request's prompt once, 15.25 under rr_sjf)."""
        self.lookups += 1
        self.lookup_tokens += int(tokens)

    def skipped(self, keys: Sequence[Hashable], hit: int, most: int) -> None:
        """Blocks found in a tier but recomputed (counted for the summary). Called right after ``plan`` for the
        same lookup (kvstudy/memory/paged.py's ``start``), so its count is the plan's; otherwise the tiers are looked
        up again."""
        found, self._found = self._found, None
        if found is not None and found[0] is keys and found[1] == hit and found[2] == most:
            self.recomputed_blocks += found[3]
        else:
            self.recomputed_blocks += len(self.pool.match(keys, hit, most))

    def iteration_seconds(self, compute: float) -> float:
        """The iteration's time with the loads it started (module docstring, ``load``); the loads are then done."""
        load, self.pending_seconds = self.pending_seconds, 0.0
        if not load:
            return compute
        if self.pool.load_mode == "blocking":
            return compute + load
        return layerwise(compute, load, self.num_layers)  # layer by layer (kvstudy/costs/transfer.py)

    # --- records --------------------------------------------------------------------------------------------------
    def loaded_tokens(self) -> Dict[int, int]:
        return self.loaded

    def describe(self) -> dict:
        pool = self.pool
        return {"tiers": [{"name": t.name, "capacity_gb": t.capacity_gb, "read_gbps": t.read_gbps,
                           "write_gbps": t.write_gbps} for t in pool.tiers],
                "load": pool.load_mode, "choice": pool.choice, "shared": pool.shared}

    def summary(self) -> dict:
        """This replica's: per tier, blocks written and read (and their bytes), its hit rate (tokens loaded from it
        / tokens looked up, both counted at every prefill start: ``looked_up``), and the blocks the tier holds at the
        end (the pool's)."""
        pool, b, block_size = self.pool, self.pool.block_bytes, self.block_size
        pool.flush()  # a write taken is counted in ``written`` once carried out
        return {"tiers": {t.name: {"blocks": len(t.blocks), "written_blocks": self.written[k],
                                   "written_bytes": self.written[k] * b, "read_blocks": self.read[k],
                                   "read_bytes": self.read[k] * b,
                                   "hit_rate": hit_rate(self.read[k], block_size, self.lookup_tokens)}
                          for k, t in enumerate(pool.tiers)},
                "lookups": self.lookups, "lookup_tokens": self.lookup_tokens, "remote_blocks": self.remote_blocks, "load_seconds": self.load_seconds_total,
                "recomputed_blocks": self.recomputed_blocks, "load": pool.load_mode, "choice": pool.choice,
                "shared": pool.shared}

    def merged_summary(self, parts: Sequence[dict], loaded_tokens: int) -> dict:
        """The replicas' summaries as one (``merged_summary``)."""
        return merged_summary(parts, self.block_size, loaded_tokens)


def hit_rate(read_blocks: int, block_size: int, lookup_tokens: int) -> float:
    """A tier's hit rate: tokens loaded from it / tokens looked up, both counted at the same prefill starts
    (``OffloadConnector.looked_up``; docs/prefix_caching.md, "Offload records"). A lookup loads at most
    ``(tokens - 1) // block_size`` blocks from all tiers together, so the rates of a run's tiers sum to at most 1."""
    return read_blocks * block_size / lookup_tokens if lookup_tokens else 0.0


def merged_summary(parts: Sequence[dict], block_size: int, loaded_tokens: int) -> dict:
    """The replicas' summaries as one: counts summed, hit rates over every replica's lookups; blocks held at the end
    summed over the replicas' own tiers, or the shared pool's once."""
    first = parts[0]
    lookup_tokens = sum(p["lookup_tokens"] for p in parts)
    tiers = {}
    for name in first["tiers"]:
        rows = [p["tiers"][name] for p in parts]
        read = sum(r["read_blocks"] for r in rows)
        tiers[name] = {"blocks": rows[0]["blocks"] if first["shared"] else sum(r["blocks"] for r in rows),
                       **{k: sum(r[k] for r in rows) for k in ("written_blocks", "written_bytes", "read_blocks",
                                                                "read_bytes")},
                       "hit_rate": hit_rate(read, block_size, lookup_tokens)}
    return {**first, "tiers": tiers, "lookups": sum(p["lookups"] for p in parts), "lookup_tokens": lookup_tokens,
            "remote_blocks": sum(p["remote_blocks"] for p in parts),
            "load_seconds": sum(p["load_seconds"] for p in parts),
            "recomputed_blocks": sum(p["recomputed_blocks"] for p in parts), "loaded_tokens": loaded_tokens}


def from_config(offload: Optional[dict]) -> Optional[OffloadConnector]:
    """``memory.offload`` (a mapping: ``host_gb``, ``host_read_gbps``, ``host_write_gbps``, the same for ``disk``,
    ``load``, ``choice``, ``shared``), or None: no tiers (no mapping, or neither size given: then the memory is the
    prefix cache alone, exactly). A tier is present when its size is given (1e9 GB: unlimited for any run). The memory's own tiers; a cluster with ``shared`` gives its replicas one pool instead
    (kvstudy/running/assemble.py)."""
    if not offload or all(offload.get(f"{name}_gb") is None for name in TIER_NAMES):
        return None  # no tier: the prefix cache alone (host_gb=null is the study's "0 GB")
    tiers = [Tier(name, float(offload[f"{name}_gb"]), float(offload.get(f"{name}_read_gbps", 0) or 0),
                  float(offload.get(f"{name}_write_gbps", 0) or 0))
             for name in TIER_NAMES if offload.get(f"{name}_gb") is not None]
    for t in tiers:
        if t.read_gbps <= 0 or t.write_gbps <= 0:
            raise ValueError(f"memory.offload.{t.name}_read_gbps and {t.name}_write_gbps: allowed numbers > 0 "
                             f"(GB/s) for a {t.name} tier of {t.capacity_gb} GB")
    pool = OffloadTiers(tiers, load=offload.get("load", "blocking"), choice=offload.get("choice", "auto"),
                        shared=bool(offload.get("shared", False)))
    return OffloadConnector(pool)
