"""Work the test suite (and every run) no longer repeats (issue 54, item 4): the code digest kept in the cache, and
a predictor table cut from a cached larger one instead of trained again."""
import os
import time

import pytest

from kvstudy.running import paths, provenance


def _package(tmp_path, monkeypatch):
    pkg, conf = tmp_path / "pkg", tmp_path / "conf"
    pkg.mkdir()
    conf.mkdir()
    (pkg / "a.py").write_text("X = 1\n")
    (pkg / "optimum").mkdir()
    (pkg / "optimum" / "b.py").write_text("Y = 2\n")  # NOT_RESULTS: never read
    (conf / "c.yaml").write_text("k: 1  # a comment\n")
    monkeypatch.setattr(provenance, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(paths, "CONF_DIR", conf)
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "cache"))
    return pkg, conf


def _fresh():
    provenance.code_digest.cache_clear()
    return provenance.code_digest()


def test_code_digest_is_kept_in_the_cache_and_recomputed_when_a_file_changes(tmp_path, monkeypatch):
    pkg, conf = _package(tmp_path, monkeypatch)
    try:
        first = _fresh()
        kept = list((tmp_path / "cache" / "code").iterdir())
        assert [p.read_text() for p in kept] == [first]
        real = provenance._code_digest

        def refuse(*a):
            raise AssertionError("recomputed although no file changed")

        monkeypatch.setattr(provenance, "_code_digest", refuse)
        assert _fresh() == first  # the second process reads it
        monkeypatch.setattr(provenance, "_code_digest", real)
        # a change of code, a config value, a new file: each a new digest, equal to one computed from scratch
        for change in (lambda: (pkg / "a.py").write_text("X = 2\n"), lambda: (conf / "c.yaml").write_text("k: 2\n"),
                       lambda: (pkg / "new.py").write_text("Z = 3\n")):
            before = _fresh()
            time.sleep(0.01)
            change()
            after = _fresh()
            assert after != before
            monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / f"cold{time.monotonic_ns()}"))
            assert _fresh() == after  # what a process without the kept digest computes
            monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "cache"))
        # a comment is not code: same digest (the rule code_digest had before it was kept)
        digest = _fresh()
        (pkg / "a.py").write_text("X = 2  # why\n")
        assert _fresh() == digest
        # a damaged kept digest is computed again, not trusted
        for p in (tmp_path / "cache" / "code").iterdir():
            p.write_text("garbage")
        assert _fresh() == digest
    finally:
        provenance.code_digest.cache_clear()


def test_code_digest_without_a_usable_cache_is_computed(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch)
    try:
        expected = _fresh()
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "file"))  # a file: cache_dir() refuses it
        assert _fresh() == expected
        monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "file" / "sub"))  # cannot be made
        assert _fresh() == expected
        assert not os.path.exists(tmp_path / "file" / "sub")
    finally:
        provenance.code_digest.cache_clear()


SMALL_BUILD = {"num_estimators": [4], "max_depth": [8], "k_fold_cv_splits": 2, "max_batch_size": 64}


@pytest.mark.slow  # two small predictor trainings, ~5 s of CPU
def test_a_smaller_table_is_cut_from_a_cached_larger_one_not_trained(tmp_path, monkeypatch):
    """The same model, hardware and settings at fewer tokens: cut from the cached build, equal to the bit to a build
    of its own, kept under its own key; other settings are not cut from it (kvstudy/latency/models.py)."""
    import numpy as np

    from kvstudy.latency import models
    from kvstudy.latency.tables import HardwareSpec, VidurTables
    from kvstudy.running.paths import load_model_arch

    arch, hw = load_model_arch("llama32_1b"), HardwareSpec("a100_tp1", "a100", "a100_pairwise_nvlink", 1)
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "own"))
    own = models.vidur(arch, hw, max_tokens=512, **SMALL_BUILD).tables  # a build for 512 tokens
    monkeypatch.setenv("KVSTUDY_CACHE_DIR", str(tmp_path / "cache"))
    big = models.vidur(arch, hw, max_tokens=2048, **SMALL_BUILD)
    assert big.info["source"] == "trained"

    def no_training(*a):
        raise AssertionError("trained although a larger table was cached")

    monkeypatch.setattr(models, "_train", no_training)
    models._LOADED.clear()
    cut = models.vidur(arch, hw, max_tokens=512, **SMALL_BUILD)
    assert cut.info["source"] == "cache" and cut.tables.max_tokens == 512
    for name in ("per_token_ms", "decode_ms", "prefill_ms", "send_recv_ms"):
        assert getattr(cut.tables, name).shape == getattr(own, name).shape, name
        assert np.array_equal(getattr(cut.tables, name), getattr(own, name), equal_nan=True), name
    assert (cut.tables.cv_mape_pct, cut.tables.layers_per_stage) == (own.cv_mape_pct, own.layers_per_stage)
    kept = VidurTables.load(models.vidur_cache_folder(cut.info["cache_key"]) / "tables.npz")
    assert kept is not None and np.array_equal(kept.per_token_ms, own.per_token_ms, equal_nan=True)
    assert cut.iteration_seconds([(300, 100)], 20, 20 * 150) == big.iteration_seconds([(300, 100)], 20, 20 * 150)
    models._LOADED.clear()
    with pytest.raises(AssertionError, match="trained although"):  # another setting: its own build
        models.vidur(arch, hw, max_tokens=512, **{**SMALL_BUILD, "max_batch_size": 32})
