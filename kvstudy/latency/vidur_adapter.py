"""The one module that imports ``vidur``: build Vidur's sklearn execution-time predictor offline.

Vidur 0.0.26's ``SklearnExecutionTimePredictor`` downloads profiles and trained predictions from the
Hugging Face hub. Its two extension points are overridden here:

* ``_get_input_files`` returns local Vidur-schema CSVs (``profiles/`` or a user's real profiles);
* ``_load_predictions_from_hf`` trains Vidur's models on those files and predicts Vidur's lookup tables
  locally (the method's contract is "return the prediction dicts"; nothing is fetched).

Other fixes over the stock class, each for a fact about 0.0.26 (see docs/latency.md):

* Training is seeded (``RandomForestRegressor(random_state=seed)``; stock training is unseeded).
* Vidur's own on-disk cache is keyed only by dataset string, TP and a few sizes, not by model
  dimensions or CSV content; kvstudy gives every build its own ``cache_dir`` named by a hash of the
  CSV bytes, the architecture, the hardware and every predictor setting (``tables.cache_key``).
* ``prediction_max_tokens_per_request`` is set from the run (stock 2M builds several GB of tables).
* The linear-regression class lacks ``_get_kv_parallel_communication_time``; it is supplied.
* The attention grids are predicted into dense arrays (``GridPredictions``, the same estimators on the same
  rows: the same values) instead of a dict of one tuple per point, and Vidur's xz-compressed CSV copies of
  every prediction (written into a build folder that is dropped) are not written: a 131,072-token model's
  prefill grid has 8.4 M points (5.5 GB and 8 minutes stock, 1 GB and 20 s so).
* Vidur's INFO logging to stdout is silenced (set KVSTUDY_VIDUR_LOG=1 to see it).
* Models are registered from kvstudy's YAMLs as ``BaseModelConfig`` subclasses named
  ``kvstudy/<name>-<fingerprint>`` (OPT is not in Vidur). Vidur's ActivationType has no ReLU; OPT is
  registered with GELU, which Vidur's predictor never reads.

The cross-validated error reported beside the settings is a shuffled K-fold MAPE of the same
estimator on the same training frame (Vidur's GridSearchCV uses unshuffled folds, which on a sorted
grid measure extrapolation rather than the interpolation the lookup tables do).
"""
from __future__ import annotations

import logging
import pickle
import sys
import time
import os
from collections.abc import Mapping
from dataclasses import field, make_dataclass
from typing import Dict, Tuple

import numpy as np

from kvstudy.costs.arch import ModelArch
from kvstudy.latency.tables import HardwareSpec, PredictorSettings, ProfileFiles, VidurTables

from sklearn.base import clone
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures

from vidur.config import (  # noqa: E402
    CacheConfig,
    LinearRegressionExecutionTimePredictorConfig,
    RandomForrestExecutionTimePredictorConfig,
    ReplicaConfig,
)
from vidur.config.model_config import BaseModelConfig  # noqa: E402
from vidur.config.utils import get_all_subclasses  # noqa: E402
from vidur.entities import Batch  # noqa: E402
from vidur.execution_time_predictor.linear_regression_execution_time_predictor import (  # noqa: E402
    LinearRegressionExecutionTimePredictor,
)
from vidur.execution_time_predictor.random_forrest_execution_time_predictor import (  # noqa: E402
    RandomForrestExecutionTimePredictor,
)
from vidur.types import ActivationType, NormType, ReplicaId  # noqa: E402

# vidur's logger prints INFO lines to stdout and sets its own level on import; silence it afterwards.
if not os.environ.get("KVSTUDY_VIDUR_LOG"):
    logging.getLogger("vidur").setLevel(logging.CRITICAL)

VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "attn_rope",
             "input_layernorm", "post_attention_layernorm", "add")


def register_model(arch: ModelArch) -> str:
    """Register ``arch`` with Vidur's model registry (idempotent) and return its Vidur name."""
    name = f"kvstudy/{arch.name}-{arch.fingerprint()}"
    if any(sub.get_name() == name for sub in get_all_subclasses(BaseModelConfig) if "get_name" in vars(sub)):
        return name
    values = {
        "num_layers": arch.num_layers, "num_q_heads": arch.num_q_heads, "num_kv_heads": arch.num_kv_heads,
        "embedding_dim": arch.embedding_dim, "mlp_hidden_dim": arch.mlp_hidden_dim,
        "max_model_len": arch.max_model_len, "use_gated_mlp": arch.use_gated_mlp, "use_bias": arch.use_bias,
        "use_qkv_bias": arch.use_qkv_bias,
        "activation": ActivationType.SILU if arch.activation == "silu" else ActivationType.GELU,
        "norm": NormType.RMS_NORM if arch.norm == "rms_norm" else NormType.LAYER_NORM,
        "post_attn_norm": arch.post_attn_norm, "vocab_size": arch.vocab_size,
    }
    fields_ = [(k, type(v), field(default=v)) for k, v in values.items()]
    make_dataclass(f"KvStudyModel_{arch.fingerprint()}", fields_, bases=(BaseModelConfig,),
                   namespace={"get_name": staticmethod(lambda: name)})
    return name


class GridPredictions(Mapping):
    """One operator's predictions on a regular 2-D grid, ``values[i, j]`` at ``(axes[0][i], axes[1][j])``; a read-only
    mapping from those key pairs, as Vidur's lookups (``get_execution_time``) index its prediction dicts."""

    def __init__(self, axes: Tuple[np.ndarray, np.ndarray], values: np.ndarray) -> None:
        self.axes, self.values = axes, values

    @classmethod
    def predict(cls, model, columns: Tuple[str, str], first: np.ndarray, second: np.ndarray) -> "GridPredictions":
        """The model's predictions on every (first, second) pair, the first axis outermost (itertools.product's order,
        Vidur's row order), in one call on an int64 frame with the training columns, as Vidur predicts them."""
        import pandas as pd

        X = pd.DataFrame({columns[0]: np.repeat(first.astype(np.int64), len(second)),
                          columns[1]: np.tile(second.astype(np.int64), len(first))})
        values = np.asarray(model.predict(X), dtype=float).reshape(len(first), len(second))
        return cls((first, second), values)

    def _index(self, axis: np.ndarray, value) -> int:
        step = axis[1] - axis[0] if len(axis) > 1 else 1
        i = (value - axis[0]) // step
        if not (0 <= i < len(axis)) or axis[int(i)] != value:
            raise KeyError(value)
        return int(i)

    def __getitem__(self, key):
        a, b = key
        return self.values[self._index(self.axes[0], a), self._index(self.axes[1], b)]

    def __iter__(self):
        return ((a, b) for a in self.axes[0] for b in self.axes[1])

    def __len__(self) -> int:
        return self.values.size


class _OfflineMixin:
    """Local input files, local 'hub' predictions, seeded estimators, CV error recorded per model."""

    _kv_files: ProfileFiles
    _kv_settings: PredictorSettings

    def _get_input_files(self) -> Tuple[str, str, str, str]:
        f = self._kv_files
        return str(f.mlp), str(f.attention), str(f.all_reduce), str(f.send_recv)

    def _load_predictions_from_hf(self):
        return self._predict_from_models(self._train_models())

    def _train_model(self, model_name, model_type, df, feature_cols, target_col):
        started = time.perf_counter()
        model = super()._train_model(model_name, model_type, df, feature_cols, target_col)
        k = max(2, min(self._kv_settings.k_fold_cv_splits, len(df)))
        folds = KFold(n_splits=k, shuffle=True, random_state=self._kv_settings.seed)
        scores = cross_val_score(clone(model), df[feature_cols], df[target_col], cv=folds,
                                 scoring=self._get_scorer())
        self.cv_mape_pct[model_name] = float(-scores.mean())
        # a cold build takes 20-90 s: one line per operator model, so it visibly goes on (issue 46)
        print(f"  trained {model_name} ({len(df):,} profiled rows, {k}-fold CV error {self.cv_mape_pct[model_name]:.1f}%) "
              f"in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        return model

    def _get_kv_parallel_communication_time(self, batch):  # missing in the linear-regression class
        return 0.0

    # Vidur 0.0.26's two methods (sklearn_execution_time_predictor.py) with the pickle file closed: stock
    # ``pickle.load(open(...))`` / ``pickle.dump(model, open(...))`` leave each file to the garbage collector (one
    # "unclosed file <...attn_pre_proj.pkl>" ResourceWarning per operator model, issue 54), same locks and paths.
    def _load_model_from_cache(self, model_name, model_hash):
        from fasteners import InterProcessReaderWriterLock

        with InterProcessReaderWriterLock(f"{self._cache_dir}/{model_name}_{model_hash}_model_lock.file").read_lock():
            cache_file = f"{self._cache_dir}/predictors/{model_hash}/{model_name}.pkl"
            if self._config.no_cache or not os.path.exists(cache_file):
                return None
            with open(cache_file, "rb") as fh:
                return pickle.load(fh)

    def _store_model_in_cache(self, model_name, model_hash, model) -> None:
        from fasteners import InterProcessReaderWriterLock

        with InterProcessReaderWriterLock(f"{self._cache_dir}/{model_hash}_model_lock.file").write_lock():
            cache_file = f"{self._cache_dir}/predictors/{model_hash}/{model_name}.pkl"
            os.makedirs(os.path.dirname(cache_file), exist_ok=True)
            with open(cache_file, "wb") as fh:
                pickle.dump(model, fh, protocol=pickle.HIGHEST_PROTOCOL)

    def _store_model_prediction_cache(self, model_name, model_hash, predictions) -> None:
        """Vidur writes every prediction dict as an xz-compressed CSV into its cache folder, which kvstudy makes per
        build and drops (only tables.npz is kept): nothing would read them, so they are not written."""

    def _predict_for_attention_layer_models(self, models):
        """Vidur's two attention grids, predicted by the same estimators on the same rows in the same order and
        dtypes as Vidur's own method (so the same values), but kept as dense arrays (``GridPredictions``) instead
        of Vidur's dict of one tuple per point: a long-context model's prefill grid (kv 0..max_tokens step g x
        chunk 32..max_prefill_chunk step 32) holds 8.4 M points at 131,072 tokens, which Vidur's dict (plus the
        product lists and the xz cache it builds on the way) takes more than 12 GB to hold."""
        cfg = self._config
        print("  predicting the attention tables (prefill and decode grids)", file=sys.stderr, flush=True)
        kv = np.arange(0, cfg.prediction_max_tokens_per_request + 1, cfg.kv_cache_prediction_granularity)
        batch = np.arange(1, cfg.prediction_max_batch_size + 1)
        chunk = np.arange(32, cfg.prediction_max_prefill_chunk_size + 1, 32)
        return {"attn_prefill": GridPredictions.predict(models["attn_prefill"], ("kv_cache_size", "prefill_chunk_size"),
                                                        kv, chunk),
                "attn_decode": GridPredictions.predict(models["attn_decode"], ("batch_size", "kv_cache_size"), batch, kv)}


class OfflineRandomForestPredictor(_OfflineMixin, RandomForrestExecutionTimePredictor):
    def __init__(self, files: ProfileFiles, settings: PredictorSettings, **configs) -> None:
        self._kv_files, self._kv_settings, self.cv_mape_pct = files, settings, {}
        super().__init__(**configs)

    def _get_estimator(self):
        return RandomForestRegressor(random_state=self._kv_settings.seed)


class OfflineLinearRegressionPredictor(_OfflineMixin, LinearRegressionExecutionTimePredictor):
    def __init__(self, files: ProfileFiles, settings: PredictorSettings, **configs) -> None:
        self._kv_files, self._kv_settings, self.cv_mape_pct = files, settings, {}
        super().__init__(**configs)

    def _get_estimator(self):
        return make_pipeline(PolynomialFeatures(), LinearRegression())


#: GPUs Vidur 0.0.26's ReplicaConfig accepts (vidur.types.DeviceSKUType).
VIDUR_DEVICES = ("a40", "a100", "h100", "l40")


def replica_config(arch: ModelArch, hw: HardwareSpec) -> ReplicaConfig:
    """Vidur's replica description. A GPU Vidur does not know (kvstudy's ``h200`` and ``l4``) is named
    ``a100`` here: kvstudy hands the predictor its own profile files, so Vidur's SKU entry only feeds Vidur's
    memory planning, which kvstudy does not use (the KV capacity is kvstudy's ``memory.capacity_tokens``)."""
    device = hw.device if hw.device in VIDUR_DEVICES else "a100"
    return ReplicaConfig(model_name=register_model(arch), num_pipeline_stages=hw.pipeline_parallel,
                         tensor_parallel_size=hw.tensor_parallel, device=device, network_device=hw.node)


def make_predictor(arch: ModelArch, hw: HardwareSpec, files: ProfileFiles, settings: PredictorSettings,
                   cache_dir: str):
    """Vidur's predictor for this model and hardware, trained from local files into ``cache_dir``."""
    common = dict(
        model_profiling_dataset=f"local:{files.mlp.parent}",
        network_profiling_dataset=f"local:{files.all_reduce.parent}",
        cache_dir=cache_dir,
        k_fold_cv_splits=settings.k_fold_cv_splits,
        num_training_job_threads=settings.training_threads,
        kv_cache_prediction_granularity=settings.kv_granularity,
        prediction_max_prefill_chunk_size=settings.max_prefill_chunk,
        prediction_max_batch_size=settings.max_batch_size,
        prediction_max_tokens_per_request=settings.max_tokens,
        use_native_execution_time_predictor=False,
    )
    cache = CacheConfig(block_size=settings.block_size)
    if settings.estimator == "random_forest":
        config = RandomForrestExecutionTimePredictorConfig(
            num_estimators=list(settings.num_estimators), max_depth=list(settings.max_depth),
            min_samples_split=list(settings.min_samples_split), **common)
        cls = OfflineRandomForestPredictor
    else:
        config = LinearRegressionExecutionTimePredictorConfig(polynomial_degree=list(settings.polynomial_degree),
                                                              **common)
        cls = OfflineLinearRegressionPredictor
    return cls(files, settings, predictor_config=config, replica_config=replica_config(arch, hw), cache_config=cache)


def _dense_1d(pred: Dict[tuple, float], size: int) -> np.ndarray:
    out = np.full(size + 1, np.nan)
    for (n,), v in pred.items():
        out[int(n)] = v
    return out


def tables_from_predictor(predictor, arch: ModelArch, hw: HardwareSpec, settings: PredictorSettings) -> VidurTables:
    """Flatten Vidur's prediction dicts into the arrays ``VidurTables`` queries (same formula as
    ``vidur.entities.ExecutionTime.total_time``: per layer, TP all-reduce counted twice)."""
    p = predictor._predictions
    cfg = predictor._config
    size = settings.max_tokens
    per_token = sum(_dense_1d(p[op], size) for op in VIDUR_OPS if op != "post_attention_layernorm")
    if arch.post_attn_norm:
        per_token = per_token + _dense_1d(p["post_attention_layernorm"], size)
    if hw.tensor_parallel > 1:
        comm = _dense_1d(p["all_reduce"], size) + cfg.nccl_cpu_launch_overhead_ms \
            + cfg.nccl_cpu_skew_overhead_per_device_ms * hw.tensor_parallel ** 1.25
        per_token = per_token + 2 * comm
    send_recv = _dense_1d(p["send_recv"], size) if hw.pipeline_parallel > 1 else np.zeros(size + 1)
    g = settings.kv_granularity
    n_kv = size // g + 1
    decode = np.full((settings.max_batch_size + 1, n_kv), np.nan)
    n_chunk = settings.max_prefill_chunk // 32
    prefill = np.full((n_kv, n_chunk + 1), np.nan)
    for table, pred, (rows, cols) in ((decode, p["attn_decode"], (1, g)), (prefill, p["attn_prefill"], (g, 32))):
        if isinstance(pred, GridPredictions):  # the grid the mixin predicts: one array assignment
            first, second = pred.axes
            table[np.ix_(first // rows, second // cols)] = pred.values
        else:  # a dict of Vidur's (batch, kv) or (kv, chunk) keys
            for (a, b), v in pred.items():
                table[int(a) // rows, int(b) // cols] = v
    return VidurTables(
        per_token_ms=per_token, decode_ms=decode, prefill_ms=prefill, send_recv_ms=send_recv,
        layers_per_stage=arch.num_layers // hw.pipeline_parallel, stages=hw.pipeline_parallel,
        kv_granularity=g, decode_overhead=float(predictor._attention_decode_batching_overhead_fraction),
        cv_mape_pct=dict(predictor.cv_mape_pct))


def vidur_iteration_seconds(predictor, prefill_chunks, decode_contexts) -> float:
    """Vidur's own answer for one iteration, through its ``Batch`` entity (used to test the tables)."""
    q = [c for c, _ in prefill_chunks] + [1] * len(decode_contexts)
    kv = [ctx for _, ctx in prefill_chunks] + list(decode_contexts)
    batch = Batch(ReplicaId(0), [None] * len(q), q, kv)
    stages = predictor._replica_config.num_pipeline_stages
    return float(sum(predictor.get_execution_time(batch, s).total_time for s in range(stages)))


def run_vidur_simulator(arch: ModelArch, hw: HardwareSpec, files: ProfileFiles, settings: PredictorSettings,
                        cache_dir: str, arrival, prompt, output, capacity_tokens: int, work_dir: str,
                        max_tokens_in_batch: int, batch_size_cap: int = 1024, scheduler: str = "vllm",
                        chunk_size: int = 512, block_size: int = None, watermark: float = 0.01,
                        per_request: bool = False, num_replicas: int = 1, global_scheduler: str = "round_robin",
                        seed: int = 0) -> dict:
    """Run Vidur's own event-driven simulator (its ``vllm`` or ``sarathi`` replica scheduler) on the given
    requests, with the same offline predictor kvstudy uses. For ``bench/vs_vidur.py``; returns timing facts
    and, with ``per_request``, each request's arrival, first-token, completion time and restart count.

    Vidur's trace-replay generator reads Azure-style columns (Date, Time, PromptTokenCount,
    CompletionTokenCount); the requests are written in that form with all scale factors 1.

    ``num_replicas`` behind Vidur's ``global_scheduler`` (round_robin, random, lor); Python's ``random`` is seeded
    with ``seed`` as Vidur's main does (``set_seeds``: its random router draws from it). With ``per_request`` each
    request's replica is returned too.
    """
    import time

    import pandas as pd
    from vidur.config import (ClusterConfig, LORGlobalSchedulerConfig, MetricsConfig, RandomGlobalSchedulerConfig,
                              RoundRobinGlobalSchedulerConfig, SarathiSchedulerConfig, SimulationConfig,
                              TraceRequestGeneratorConfig, VllmSchedulerConfig)
    from vidur.utils.random import set_seeds
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
    from vidur.simulator import Simulator

    if scheduler not in ("vllm", "sarathi"):
        raise ValueError(f"scheduler={scheduler!r}: allowed vllm, sarathi")
    routers = {"round_robin": RoundRobinGlobalSchedulerConfig, "random": RandomGlobalSchedulerConfig,
               "lor": LORGlobalSchedulerConfig}
    if global_scheduler not in routers:
        raise ValueError(f"global_scheduler={global_scheduler!r}: allowed {', '.join(routers)}")
    trace = os.path.join(work_dir, "trace.csv")
    pd.DataFrame({"Date": "2024-01-01", "Time": arrival, "PromptTokenCount": prompt,
                  "CompletionTokenCount": output}).to_csv(trace, index=False)
    predictor = make_predictor(arch, hw, files, settings, cache_dir)
    started = time.perf_counter()
    replica = replica_config(arch, hw)
    block_size = block_size or settings.block_size
    cache = CacheConfig(block_size=block_size, num_blocks=capacity_tokens // block_size,
                        watermark_blocks_fraction=watermark)
    if scheduler == "vllm":
        sched = VllmSchedulerConfig(batch_size_cap=batch_size_cap, max_tokens_in_batch=max_tokens_in_batch)
    else:
        sched = SarathiSchedulerConfig(batch_size_cap=batch_size_cap, chunk_size=chunk_size)
    config = SimulationConfig(
        seed=seed,
        cluster_config=ClusterConfig(num_replicas=num_replicas, replica_config=replica, cache_config=cache,
                                     global_scheduler_config=routers[global_scheduler](),
                                     replica_scheduler_config=sched),
        request_generator_config=TraceRequestGeneratorConfig(
            trace_file=trace, date="2024-01-01", prefill_scale_factor=1, decode_scale_factor=1, time_scale_factor=1,
            max_tokens=int(max(prompt + output))),
        execution_time_predictor_config=predictor._config,
        metrics_config=MetricsConfig(output_dir=os.path.join(work_dir, "vidur_out"), write_metrics=False,
                                     enable_chrome_trace=False, store_plots=False, store_request_metrics=False,
                                     store_batch_metrics=False, store_utilization_metrics=False))
    # Vidur's global scheduler builds its predictor through this registry; hand it the same offline one.
    ExecutionTimePredictorRegistry.get = classmethod(lambda cls, *a, **k: predictor)
    try:
        simulator = Simulator(config)
    finally:
        del ExecutionTimePredictorRegistry.get  # back to the inherited BaseRegistry.get
    requests = [event._request for _, event in simulator._event_queue]
    # Vidur 0.0.26 bug: Request.restart() (vLLM recompute preemption) keeps the per-stage token counter, so the
    # restarted request trips `assert _num_stage_processed_tokens <= total_tokens`. Reset it as restart intends.
    from vidur.entities.request import Request as VidurRequest

    stock_restart = VidurRequest.restart

    def restart(self):
        stock_restart(self)
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False

    VidurRequest.restart = restart
    setup_s = time.perf_counter() - started
    set_seeds(seed)  # what vidur.main does before the simulator runs (the random router's stream)
    routed = {}
    stock_schedule = type(simulator._scheduler).schedule

    def schedule(self):  # the stock global scheduler, with each request's replica noted
        mapping = stock_schedule(self)
        for replica_id, request in mapping:
            routed[request.id] = int(getattr(replica_id, "id", replica_id))  # a ReplicaId or an int
        return mapping

    simulator._scheduler.schedule = schedule.__get__(simulator._scheduler)
    started = time.perf_counter()
    try:
        simulator.run()
    finally:
        VidurRequest.restart = stock_restart
    out = {"setup_seconds": setup_s, "run_seconds": time.perf_counter() - started,
           "simulated_seconds": float(simulator._time)}
    if per_request:
        requests.sort(key=lambda q: q.id)
        out["requests"] = {"arrival": [q.arrived_at for q in requests],
                           "scheduled": [q.scheduled_at if q.scheduled else float("nan") for q in requests],
                           "first_token": [q.prefill_completed_at for q in requests],
                           "completion": [q._completed_at if q.completed else float("nan") for q in requests],
                           "restarts": [q._num_restarts for q in requests],
                           "replica": [routed.get(q.id, -1) for q in requests]}
    return out
