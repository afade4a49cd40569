"""Latency models: how long one iteration (batch) takes.

An iteration is described by its prefill chunks, each ``(new tokens, tokens already cached)``, and its
decode requests, given as a count and the sum of their cached context lengths (Vidur keys decode
attention on the mean context, so the sum is all it needs).

* ``vidur``: Vidur's trained sklearn predictor (default; ``kvstudy.latency.vidur_adapter``).
* ``unit``: every iteration takes one time unit, the MC-SF paper's theoretical model (Sec. 2). On the paper's
  memory (``memory=paper``, the paper's token convention) times are round indices and follow the paper's convention
  that a round's tokens are stamped with the round's index (``stamps_at_start``), so a request admitted in round p
  completes at p + o. On paged memory (``memory=paged``, vLLM's convention) the loop (kvstudy/engine/loop.py) ignores
  ``stamps_at_start``: it stamps every token at the end of its iteration (a prefill in [0, 1) gives the first token at 1), and an
  iteration that runs nothing costs no time (docs/engine.md, "Time under latency=unit").
* ``linear``: d0 + d1 * tokens seconds, a cheap stand-in for fast tests.
* ``mcsf_authors``: the linear batch-time formula the MC-SF authors' published scripts time every batch with
  (``anonymouspeople111/neurips2025-code``, ``MC-SF.py`` and the three others), see ``McsfAuthorsLatency``.
"""
from __future__ import annotations

import contextlib
import fcntl
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional, Sequence, Tuple

from kvstudy.config.validate import check_group
from kvstudy.costs.arch import ModelArch
from kvstudy.errors import ConfigError, ResourceError, file_system, phase
from kvstudy.latency.tables import HardwareSpec, PredictorSettings, ProfileFiles, VidurTables, cache_key
from kvstudy.profiles import generated
from kvstudy.profiles.devices import DEVICES
from kvstudy.running.paths import PROFILES_DIR, cache_dir, prepare_cache

Chunks = Sequence[Tuple[int, int]]


class LatencyModel:
    name = "base"
    #: True: a token is stamped with the start of its iteration (paper's round index); False: with its end.
    stamps_at_start = False
    #: True: ``iteration_seconds`` also takes ``decode_generated_sum``, the sum over the decodes of the tokens each
    #: has produced so far (its prompt not counted); the engines compute it only for a model that asks
    needs_generated = False
    #: Optional, for speed: ``decode_run_seconds(num_decodes, decode_context_sum, count) -> list``, the seconds of
    #: ``count`` decode-only iterations in a row of the same requests, the context sum growing by ``num_decodes`` in
    #: each, every value equal to ``iteration_seconds`` of that iteration (fewer allowed: the engine asks
    #: ``iteration_seconds`` for the rest, so an out-of-range error comes from the iteration that is out of range).
    #: The engine's decode runs use it (issue 47); VidurLatency has it, vectorised.

    #: pipeline stages the model times (``iteration_seconds`` is a batch's whole time through them); with more than
    #: one, ``hop_seconds(tokens)`` is the hop between two stages (kvstudy/engine/pipeline.py keeps batches in flight)
    stages = 1

    def iteration_seconds(self, prefill_chunks: Chunks, num_decodes: int, decode_context_sum: int) -> float:
        raise NotImplementedError

    def hop_seconds(self, tokens: int) -> float:
        return 0.0

    def min_iteration_seconds(self) -> float:
        """A lower bound on ``iteration_seconds`` of any iteration that computes at least one token (0: none known).
        The disaggregated driver bounds how soon a prefill replica can hand off with it (kvstudy/cluster/
        disaggregated.py); it must never exceed a real iteration's seconds."""
        return 0.0

    def describe(self) -> dict:
        return {"name": self.name}


class UnitLatency(LatencyModel):
    name = "unit"
    stamps_at_start = True

    def __init__(self, **_ignored) -> None:
        pass

    def iteration_seconds(self, prefill_chunks, num_decodes, decode_context_sum) -> float:
        return 1.0


class LinearLatency(LatencyModel):
    """``d0 + d1 x tokens`` seconds per iteration: the whole model's compute. With ``hardware.pipeline_parallel`` =
    S > 1 the layers split evenly over the stages, each taking ``(d0 + d1 x tokens) / S``, and a batch's whole time is
    ``d0 + d1 x tokens + (S - 1) hop`` (``hop`` seconds between stages), as Vidur's tables compose it
    (kvstudy/latency/tables.py: stages x layers per stage + hops)."""
    name = "linear"

    def __init__(self, d0: float = 0.02, d1: float = 1e-5, hop: float = 0.0, hardware=None, **_ignored) -> None:
        # each against kvstudy/config/schema.py, then "not both 0" (validate._check_together)
        check_group("latency", {"_target_": "kvstudy.latency.models.LinearLatency", "d0": d0, "d1": d1, "hop": hop})
        self.d0, self.d1, self.hop = float(d0), float(d1), float(hop)
        self.stages = int(getattr(hardware, "pipeline_parallel", 1) or 1)

    def iteration_seconds(self, prefill_chunks, num_decodes, decode_context_sum) -> float:
        compute = self.d0 + self.d1 * (num_decodes + sum(c for c, _ in prefill_chunks))
        return compute if self.stages == 1 else compute + (self.stages - 1) * self.hop

    def hop_seconds(self, tokens: int) -> float:
        return self.hop if self.stages > 1 else 0.0

    def min_iteration_seconds(self) -> float:
        if self.d1 < 0:
            return 0.0  # no bound if a token could cost less than 0
        return self.d0 + self.d1 + (self.stages - 1) * self.hop  # one token

    def describe(self) -> dict:
        return {"name": self.name, "d0": self.d0, "d1": self.d1, **({"hop": self.hop} if self.hop else {})}


class McsfAuthorsLatency(LatencyModel):
    """The MC-SF authors' batch time: ``t_ms = (a * c + b) * n + t0 + p * P`` (their scripts' coefficients by default:
    a = 0.0027, b = 0.52, t0 = 44.6, p = 0.378), where n is the number of jobs in the batch (prompts, or prefill
    chunks, plus decodes), P the prompt tokens processed, and c the mean over the n jobs of their "context": 0 for
    a prompt, and for a decode the tokens its request has produced so far (1 at the first decode after the prompt;
    the prompt's tokens are not counted). Evaluated with the scripts' order of floating-point operations, so that
    kvstudy's clock matches theirs to the last bit (docs/authors_code.md).

    What the 44.6 ms intercept implies: every batch costs at least 45 ms, and the per-job term (0.52 ms, plus
    0.0027 ms per token of mean context) is several times Vidur's marginal decode cost. Against Vidur's Llama2-70B
    on two A100s (kvstudy's default): one decode 45.1 vs 57.5 ms, 50 decodes (100 tokens produced, 170 of context)
    84.1 vs 60.9 ms, 200 such decodes 202.6 vs 87.8 ms, a 500-token prompt 234.1 vs 186.3 ms. So the formula is
    faster for a lone decode and 1.4-2.3x slower for those two loaded batches; over a whole high-demand run of
    Table 1 (MC-SF, seed 0) a batch takes 91.9 ms on average against 69.1 ms (1.33x), which the queue turns into
    twice the mean latency (docs/authors_code.md).
    """

    name = "mcsf_authors"
    needs_generated = True

    def __init__(self, per_context_ms: float = 0.0027, per_job_ms: float = 0.52, intercept_ms: float = 44.6,
                 per_prompt_token_ms: float = 0.378, **_ignored) -> None:
        # each against kvstudy/config/schema.py, then "per_job_ms, intercept_ms not both 0" (validate._check_together)
        check_group("latency", {"_target_": "kvstudy.latency.models.McsfAuthorsLatency",
                                "per_context_ms": per_context_ms, "per_job_ms": per_job_ms,
                                "intercept_ms": intercept_ms, "per_prompt_token_ms": per_prompt_token_ms})
        self.a, self.b, self.t0, self.p = (float(per_context_ms), float(per_job_ms), float(intercept_ms),
                                           float(per_prompt_token_ms))

    def iteration_seconds(self, prefill_chunks, num_decodes, decode_context_sum, decode_generated_sum=None) -> float:
        if decode_generated_sum is None:
            if num_decodes:
                raise TypeError("McsfAuthorsLatency needs decode_generated_sum (the decodes' produced tokens)")
            decode_generated_sum = 0  # a prefill-only batch: nothing produced to count
        jobs = len(prefill_chunks) + num_decodes
        prompt = sum(c for c, _ in prefill_chunks)
        # the scripts' expression: mean context as int / int, then ((a * c + b) * n + t0 + p * P) / 1000
        mean_context = decode_generated_sum / jobs
        return ((self.a * mean_context + self.b) * jobs + self.t0 + self.p * prompt) / 1000

    def describe(self) -> dict:
        return {"name": self.name, "per_context_ms": self.a, "per_job_ms": self.b, "intercept_ms": self.t0,
                "per_prompt_token_ms": self.p}


class VidurLatency(LatencyModel):
    name = "vidur"

    def __init__(self, tables: VidurTables, info: dict, settings: PredictorSettings) -> None:
        self.tables = tables
        self.info = info
        self.settings = settings  # what the tables were trained with (also in info, as plain data)

    def iteration_seconds(self, prefill_chunks, num_decodes, decode_context_sum) -> float:
        return self.tables.iteration_seconds(prefill_chunks, num_decodes, decode_context_sum)

    def decode_run_seconds(self, num_decodes, decode_context_sum, count) -> list:
        return self.tables.decode_run_seconds(num_decodes, decode_context_sum, count)

    @property
    def stages(self) -> int:
        return self.tables.stages

    def hop_seconds(self, tokens: int) -> float:
        return self.tables.hop_seconds(tokens)

    def min_iteration_seconds(self) -> float:
        return self.tables.min_iteration_seconds()

    def describe(self) -> dict:
        return {"name": self.name, **self.info}


def profile_files(arch: ModelArch, hw: HardwareSpec, profiles_root: Optional[str] = None,
                  compute_dir: Optional[str] = None, network_dir: Optional[str] = None) -> ProfileFiles:
    """Locate the CSVs: ``<root>/compute/<device>/<model>/`` and ``<root>/network/<node>/`` unless the
    hardware config points ``compute_dir``/``network_dir`` elsewhere (e.g. a Vidur checkout's real data). A device of
    kvstudy/profiles/devices.py without profiles in the repository's ``profiles/`` has them built on first use into
    the cache (kvstudy/profiles/generated.py)."""
    root = Path(profiles_root) if profiles_root else PROFILES_DIR
    compute = Path(compute_dir) if compute_dir else root / "compute" / hw.device / arch.name
    network = Path(network_dir) if network_dir else root / "network" / hw.node
    if not (compute / "mlp.csv").exists() and not (profiles_root or compute_dir) and hw.device in DEVICES:
        # a GPU the builder knows whose profiles the repository does not carry: built once into the cache
        compute = generated.compute_dir(arch, hw.device)
    if not (compute / "mlp.csv").exists():
        available = sorted(p.parent.name for p in (root / "compute" / hw.device).glob("*/mlp.csv"))
        how = (f"build them with `python -m kvstudy.profiles build --device {hw.device} --models {arch.name}`"
               if hw.device in DEVICES else
               f"the profile builder knows only {', '.join(DEVICES)} (kvstudy/profiles/devices.py): for a GPU of "
               f"one's own, put its measured profiles (Vidur's profiler) in {compute}/")
        raise ConfigError(f"no profiles for model '{arch.name}' on device '{hw.device}' (looked for {compute}/mlp.csv); "
                          f"profiled models: {', '.join(available) or 'none'}; {how}")
    return ProfileFiles(compute / "mlp.csv", compute / "attention.csv", network / "all_reduce.csv",
                        network / "send_recv.csv")


def _check_tp_rows(files: ProfileFiles, arch: ModelArch, tp: int) -> None:
    import pandas as pd

    header = pd.read_csv(files.mlp, nrows=0).columns
    cols = ["n_head", "n_embd", "n_expanded_embd", "num_tensor_parallel_workers"]
    mlp = pd.read_csv(files.mlp, usecols=cols + (["vocab_size"] if "vocab_size" in header else []))
    rows = mlp[(mlp.n_head == arch.num_q_heads) & (mlp.n_embd == arch.embedding_dim)
               & (mlp.n_expanded_embd == arch.mlp_hidden_dim)]
    if "vocab_size" in rows and len(rows):
        # Vidur selects its training rows by vocab size too; a mismatch leaves it none ("Training data for model
        # attn_pre_proj is empty" from deep inside), so it is named here with both values
        vocabs = sorted(int(v) for v in rows.vocab_size.unique())
        if arch.vocab_size not in vocabs:
            raise ConfigError(f"model '{arch.name}' has vocab_size={arch.vocab_size} but its profile {files.mlp} was "
                              f"measured with vocab_size {', '.join(map(str, vocabs))}; set vocab_size in the model "
                              f"config to the profile's, or profile this model (python -m kvstudy.profiles build)")
    tps = sorted(int(t) for t in rows.num_tensor_parallel_workers.unique())
    if tp not in tps:
        raise ConfigError(f"model '{arch.name}' has no profile rows at tensor_parallel={tp} in {files.mlp}; "
                          f"profiled TP sizes: {tps or 'none (dimensions do not match this model)'}")


#: the largest latency table (tokens per iteration) kvstudy builds: 2^24, far beyond any KV pool of these GPUs
MAX_TABLE_TOKENS = 1 << 24


def vidur_cache_folder(key: str) -> Path:
    """Where one trained build lives: ``tables.npz`` (Vidur's own cache is made in a scratch folder and dropped)."""
    return cache_dir() / "vidur" / key


def vidur(arch: ModelArch, hardware: HardwareSpec, capacity_tokens: int = 0, profiles_root: Optional[str] = None,
          compute_dir: Optional[str] = None, network_dir: Optional[str] = None, max_tokens="auto",
          **settings_kw) -> VidurLatency:
    """Load Vidur's tables from the cache, or train Vidur's predictor once and cache them."""
    files = profile_files(arch, hardware, profiles_root, compute_dir, network_dir)
    # the values given against kvstudy/config/schema.py (a given max_tokens up to MAX_TABLE_TOKENS)
    check_group("latency", {"_target_": "kvstudy.latency.models.vidur", "max_tokens": max_tokens,
                            **({"estimator": settings_kw["estimator"]} if "estimator" in settings_kw else {})})
    if max_tokens == "auto":
        need = max(capacity_tokens, arch.max_model_len)
        max_tokens = 1 << (need - 1).bit_length()
    if max_tokens > MAX_TABLE_TOKENS:  # auto: the table the capacity asks for
        raise ConfigError(f"the latency table would cover {max_tokens:,} tokens per iteration (memory.capacity_tokens="
                          f"{capacity_tokens:,}); allowed at most {MAX_TABLE_TOKENS:,}: lower memory.capacity_tokens "
                          f"or set latency.max_tokens (an iteration above it is then an error, never a clamp)")
    for key in ("num_estimators", "max_depth", "min_samples_split", "polynomial_degree"):
        if key in settings_kw:
            settings_kw[key] = tuple(settings_kw[key])
    settings = PredictorSettings(max_tokens=int(max_tokens),
                                 max_prefill_chunk=min(settings_kw.pop("max_prefill_chunk", arch.max_model_len),
                                                       arch.max_model_len), **settings_kw)
    started = time.perf_counter()
    # a sweep worker runs many configs of one model and hardware: keep what it loaded, keyed by everything the
    # tables depend on plus each profile file's size and modification time (so an edited profile is re-read)
    paths = [Path(p) for p in (files.mlp, files.attention, files.all_reduce, files.send_recv)]
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else (str(p),) for p in paths)
    memo_key = (arch.fingerprint(), repr(hardware), repr(settings), stamp, str(cache_dir()))
    if memo_key in _LOADED:
        key, tables = _LOADED[memo_key]
        return VidurLatency(tables, _info("memory", started, key, files, settings, tables), settings)
    files.check()
    _check_tp_rows(files, arch, hardware.tensor_parallel)
    key = cache_key(files, arch.fingerprint(), hardware, settings)
    folder = vidur_cache_folder(key)
    tables = VidurTables.load(folder / "tables.npz")
    source = "cache"
    if tables is None:
        tables = _cut_from_larger(files, arch, hardware, settings, folder)
    if tables is None:
        prepare_cache(folder)  # a cache that cannot be written: one line, before the training
        # a full disk or Ctrl-C while training: one line naming the folder and what it keeps (kvstudy/errors.py)
        with phase(f"training Vidur's predictor for {arch.name} on {hardware.name} into {folder}",
                   "the cache keeps nothing of it; the next run trains it again"), \
                file_system(folder, _CACHE_FIX), _build_lock(folder):
            # another process (a sweep's worker, a parallel test) may have built it while this one waited
            tables = VidurTables.load(folder / "tables.npz")
            if tables is None:
                tables = _train(arch, hardware, files, settings, folder)
                source = "trained"
    _LOADED[memo_key] = (key, tables)
    return VidurLatency(tables, _info(source, started, key, files, settings, tables), settings)


def _cut_from_larger(files: ProfileFiles, arch: ModelArch, hardware: HardwareSpec, settings: PredictorSettings,
                     folder: Path) -> Optional[VidurTables]:
    """The tables for ``settings`` cut from a cached build for more tokens with every other input the same (the
    next powers of two up to MAX_TABLE_TOKENS), or None. Vidur fits its operator models on the profiles alone;
    ``max_tokens`` only sets how far they are predicted, point by point, so the smaller tables are the larger one's
    first rows, to the bit (tests/running/test_test_time.py compares a cut with a build). Kept under its own key, so the next
    load reads it directly (a cache that cannot be written: used this time all the same)."""
    size = settings.max_tokens * 2
    while size <= MAX_TABLE_TOKENS:
        larger = VidurTables.load(vidur_cache_folder(cache_key(files, arch.fingerprint(), hardware,
                                                                replace(settings, max_tokens=size))) / "tables.npz")
        if larger is not None and larger.max_tokens == size:
            tables = larger.cut(settings.max_tokens)
            with contextlib.suppress(OSError):
                folder.mkdir(parents=True, exist_ok=True)
                tables.save(folder / "tables.npz")
            return tables
        size *= 2
    return None


def _train(arch: ModelArch, hardware: HardwareSpec, files: ProfileFiles, settings: PredictorSettings,
           folder: Path) -> VidurTables:
    """Train Vidur's predictor into a scratch folder and save its tables as ``folder/tables.npz``."""
    from kvstudy.latency import vidur_adapter  # the only vidur import, needed on a cold build only

    minutes = " (a large table: this can take several minutes)" if settings.max_tokens > 65536 else ""
    print(f"training Vidur's predictor for {arch.name} on {hardware.name}, iterations up to "
          f"{settings.max_tokens:,} tokens: once per model, hardware and settings, typically 20-90 s{minutes}; "
          f"cached in {folder}", file=sys.stderr, flush=True)
    # Vidur writes its own model cache as it trains; a build killed part-way would leave truncated files there
    # that the next build would load. Each build gets a fresh folder, removed afterwards: only tables.npz
    # (written atomically) is kept.
    with tempfile.TemporaryDirectory(prefix="vidur-build-", dir=folder) as scratch:
        try:
            predictor = vidur_adapter.make_predictor(arch, hardware, files, settings, scratch)
        except (pickle.UnpicklingError, EOFError) as exc:  # Vidur reads back the models it wrote: cut short
            free = shutil.disk_usage(scratch).free / 1e6
            raise ResourceError(f"{folder}: a model Vidur wrote while training could not be read back ({exc}), "
                                f"as when the disk is full ({free:,.0f} MB free there); {_CACHE_FIX}, then run "
                                f"again") from None
        tables = vidur_adapter.tables_from_predictor(predictor, arch, hardware, settings)
    tables.save(folder / "tables.npz")
    return tables


_CACHE_FIX = "free space there or set KVSTUDY_CACHE_DIR to a folder on another disk"


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One build per cache folder at a time: processes that need the same tables at once (a cold sweep's workers,
    parallel test workers) wait for the first one's build instead of repeating it. The lock is advisory
    (``fcntl.flock`` on ``folder/.lock``), released when its holder exits, however it exits."""
    with open(folder / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: tables loaded in this process (read-only arrays), see ``vidur``
_LOADED: dict = {}


def _info(source: str, started: float, key: str, files: ProfileFiles, settings: PredictorSettings,
          tables: VidurTables) -> dict:
    return {"source": source, "load_seconds": round(time.perf_counter() - started, 3), "cache_key": key,
            "profiles": str(files.mlp.parent), "network": str(files.all_reduce.parent),
            "settings": asdict(settings), "cv_mape_pct": tables.cv_mape_pct}
