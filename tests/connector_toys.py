"""Toy KV connectors for tests/memory/test_connector.py, importable by ``memory.connector._target_`` (a user's connector is
any importable class implementing kvstudy/memory/connector.py's ``KVConnector``)."""
from kvstudy.memory.connector import NoConnector


class Recorder(NoConnector):
    """Supplies nothing; records every call the memory and the engine make (the seam's wiring)."""

    name = "recorder"
    saves = True
    calls: list = []  # the last run's, class-wide (the instance Hydra builds is the memory's)

    def __init__(self, tag: str = "x") -> None:
        self.tag = tag

    def bind(self, block_size, block_bytes_per_gpu):
        Recorder.calls = [("bind", block_size, block_bytes_per_gpu)]

    def set_timing(self, num_layers, recompute_seconds):
        Recorder.calls.append(("set_timing", num_layers))

    def looked_up(self, tokens):
        Recorder.calls.append(("looked_up", tokens))

    def save(self, keys):
        Recorder.calls.append(("save", len(keys)))

    def describe(self):
        return {"name": self.name, "tag": self.tag}


class KeepsEverything(NoConnector):
    """Every block the GPU evicts is kept (unbounded) and supplied back at ``seconds_per_block`` each, blocking."""

    name = "keeps_everything"
    saves = True

    def __init__(self, seconds_per_block: float) -> None:
        if not seconds_per_block >= 0:
            raise ValueError(f"memory.connector.seconds_per_block={seconds_per_block!r}: allowed a number >= 0")
        self.seconds_per_block = float(seconds_per_block)

    def bind(self, block_size, block_bytes_per_gpu):
        self.block_size, self.kept, self.loaded, self.pending = block_size, set(), {}, 0.0

    def plan(self, keys, hit, most, tokens):
        k = hit
        while k < min(most, len(keys)) and keys[k] in self.kept:
            k += 1
        return k - hit

    def load(self, i, keys, start, count):
        self.loaded[i] = self.loaded.get(i, 0) + count * self.block_size
        self.pending += count * self.seconds_per_block
        return count * self.seconds_per_block

    def save(self, keys):
        self.kept.update(keys)

    def iteration_seconds(self, compute):
        load, self.pending = self.pending, 0.0
        return compute + load

    def loaded_tokens(self):
        return self.loaded

    def describe(self):
        return {"name": self.name, "seconds_per_block": self.seconds_per_block}

    def summary(self):
        return {"kept_blocks": len(self.kept), "loaded_blocks": sum(self.loaded.values()) // self.block_size}
