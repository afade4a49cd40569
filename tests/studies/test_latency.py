"""Latency models: Vidur's tables answer exactly what Vidur's own predictor answers; offline; cached."""

import numpy as np
import pytest

from kvstudy.errors import OutOfRangeError
from kvstudy.latency.models import LinearLatency, UnitLatency, vidur, vidur_cache_folder
from kvstudy.latency.tables import HardwareSpec, VidurTables
from kvstudy.running.paths import load_model_arch

TP2 = HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2)


def test_unit_and_linear():
    assert UnitLatency().iteration_seconds([(100, 0)], 5, 500) == 1.0
    lin = LinearLatency(d0=0.01, d1=0.001)
    assert lin.iteration_seconds([(100, 0), (20, 0)], 5, 500) == pytest.approx(0.01 + 0.125)


def test_tables_match_vidur_get_execution_time(llama_tp2_latency):
    """Random batches: kvstudy's array lookup equals vidur.get_execution_time(Batch).total_time."""
    from kvstudy.latency import vidur_adapter

    from kvstudy.latency.models import profile_files

    arch = load_model_arch("llama2_70b")
    folder = str(vidur_cache_folder(llama_tp2_latency.info["cache_key"]) / "vidur")
    predictor = vidur_adapter.make_predictor(arch, TP2, profile_files(arch, TP2), llama_tp2_latency.settings, folder)
    rng = np.random.default_rng(0)
    for _ in range(40):
        chunks = [(int(c), int(k)) for c, k in zip(rng.integers(1, 2000, rng.integers(0, 3)),
                                                     rng.integers(0, 2000, 3))]
        decodes = rng.integers(1, 3000, rng.integers(0, 300)).tolist()
        if not chunks and not decodes:
            continue
        ours = llama_tp2_latency.iteration_seconds(chunks, len(decodes), int(sum(decodes)))
        theirs = vidur_adapter.vidur_iteration_seconds(predictor, chunks, decodes)
        assert ours == pytest.approx(theirs, rel=1e-9)


def test_acceptance_queries_are_plausible(llama_tp2_latency):
    prefill = llama_tp2_latency.iteration_seconds([(512, 0)], 0, 0)
    decode = llama_tp2_latency.iteration_seconds([], 64, 64 * 600)
    mixed = llama_tp2_latency.iteration_seconds([(512, 0)], 64, 64 * 600)
    # 70B params x 2 FLOP x 512 tokens on 2 x 312 TFLOPS is >= 115 ms; decode reads 69 GB/GPU at 2 TB/s >= 34 ms
    assert 0.115 < prefill < 0.5
    assert 0.034 < decode < 0.2
    assert mixed > max(prefill, decode)


def test_out_of_range_is_an_error_naming_the_limit(llama_tp2_latency):
    with pytest.raises(OutOfRangeError, match="max_batch_size=1024"):
        llama_tp2_latency.iteration_seconds([], 1025, 1025 * 100)
    with pytest.raises(OutOfRangeError, match="max_tokens"):
        llama_tp2_latency.iteration_seconds([(4000, 0)] * 10, 0, 0)


def test_warm_load_reads_cache(llama_tp2_latency):
    from kvstudy.latency import models

    # the same process keeps what it loaded (sweep workers run many runs); another test on this worker may have
    # cleared the memo since the fixture loaded it (tests/running/test_test_time.py does), so load once, then again
    first = vidur(load_model_arch("llama2_70b"), TP2, capacity_tokens=16492)
    again = vidur(load_model_arch("llama2_70b"), TP2, capacity_tokens=16492)
    assert again.info["source"] == "memory"
    assert again.tables is first.tables
    models._LOADED.clear()
    again = vidur(load_model_arch("llama2_70b"), TP2, capacity_tokens=16492)
    assert again.info["source"] == "cache"
    assert again.info["cache_key"] == llama_tp2_latency.info["cache_key"]
    assert np.array_equal(again.tables.per_token_ms, llama_tp2_latency.tables.per_token_ms, equal_nan=True)


def test_training_is_seeded_and_cache_keyed_by_content(tmp_path, monkeypatch):
    """Two cold builds give identical tables; different CSV bytes give a different cache key."""
    import shutil

    from kvstudy.running.paths import PROFILES_DIR

    arch = load_model_arch("opt_13b")
    hw = HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1)
    small = dict(num_estimators=[4], max_depth=[8], k_fold_cv_splits=2, max_batch_size=64)
    tables = []
    for i in range(2):
        monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / f"cache{i}"))
        tables.append(vidur(arch, hw, capacity_tokens=2048, **small))
    assert tables[0].info["source"] == tables[1].info["source"] == "trained"
    assert np.array_equal(tables[0].tables.decode_ms, tables[1].tables.decode_ms, equal_nan=True)
    root = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR / "network", root / "network")
    shutil.copytree(PROFILES_DIR / "compute" / "a100" / "opt_13b", root / "compute" / "a100" / "opt_13b")
    mlp = root / "compute" / "a100" / "opt_13b" / "mlp.csv"
    from kvstudy.latency.models import profile_files
    from kvstudy.latency.tables import PredictorSettings, cache_key

    s = PredictorSettings()
    same = cache_key(profile_files(arch, hw, str(root)), arch.fingerprint(), hw, s)
    assert same == cache_key(profile_files(arch, hw), arch.fingerprint(), hw, s)
    lines = mlp.read_text().splitlines()
    mlp.write_text("\n".join(lines[:-1]) + "\n")
    assert cache_key(profile_files(arch, hw, str(root)), arch.fingerprint(), hw, s) != same


def test_save_load_roundtrip(tmp_path, llama_tp2_latency):
    llama_tp2_latency.tables.save(tmp_path / "t.npz")
    back = VidurTables.load(tmp_path / "t.npz")
    assert back.iteration_seconds([(100, 0)], 10, 3000) == llama_tp2_latency.tables.iteration_seconds([(100, 0)], 10, 3000)


BUILD = r'''
import sys
from kvstudy.latency.models import vidur
from kvstudy.latency.tables import HardwareSpec
from kvstudy.running.paths import load_model_arch
t = vidur(load_model_arch("opt_13b"), HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1), capacity_tokens=2048,
          num_estimators=[4], max_depth=[8], k_fold_cv_splits=2, max_batch_size=64)
print(t.info["source"])
'''


@pytest.mark.slow
def test_two_processes_needing_the_same_tables_train_them_once(tmp_path):
    """A cold sweep's workers (or parallel test workers) that need one predictor at once: the first trains it, the
    others wait for it and load it (kvstudy/latency/models.py ``_build_lock``), with identical tables."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KVSTUDY_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert sorted(out.split()[-1] for out, _ in outs) == ["cache", "trained"]
    assert sum(err.count("training Vidur's predictor") for _, err in outs) == 1
