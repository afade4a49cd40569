"""profiles/: deterministic rebuild, calibration against real A100 data, real profiles drop in."""
import json
import shutil

import pandas as pd
import pytest

from kvstudy.running.paths import CALIBRATION_FILE, PROFILES_DIR, SHARED_REFERENCE, load_model_arch
from kvstudy.profiles.builder import build_model, build_network
from kvstudy.profiles.calibration import load_calibration
from tests.conftest import needs_shared


def test_rebuild_matches_committed_profiles(tmp_path):
    calib = load_calibration(CALIBRATION_FILE)
    for path in build_model(load_model_arch("opt_13b"), calib, tmp_path) + build_network(calib, tmp_path):
        committed = PROFILES_DIR / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} differs from a rebuild"


def test_profiles_cover_simulated_batches():
    att = pd.read_csv(PROFILES_DIR / "compute/a100/llama2_70b/attention.csv")
    assert att["batch_size"].max() >= 1024  # MC-SF runs 200+ concurrent decodes
    mlp = pd.read_csv(PROFILES_DIR / "compute/a100/llama2_70b/mlp.csv")
    assert mlp["num_tokens"].max() >= 16492
    assert sorted(mlp["num_tensor_parallel_workers"].unique()) == [1, 2, 4, 8]
    size = sum(p.stat().st_size for p in PROFILES_DIR.rglob("*") if p.is_file())
    assert size < 20e6


@needs_shared
def test_calibration_error_against_real_a100_measurements():
    from kvstudy.profiles.calibration import calibrate

    result = calibrate(SHARED_REFERENCE / "vidur-data")
    errors = {row["op"]: row for row in result["mlp_errors"]}
    for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"):
        assert errors[op]["median_ape_pct"] <= 10.0, errors[op]
    for fit in result["network"]:
        if fit["collective"] == "all_reduce" and fit["workers"] == fit["devices_per_node"]:
            assert fit["median_ape_pct"] <= 10.0, fit
    # the committed calibration is the one these files produce
    committed = json.loads(CALIBRATION_FILE.read_text())
    assert committed["mlp_ops"] == result["mlp_ops"]


@pytest.mark.slow  # over about 4 s (measured 4.3-14 s, issue 54's fast-tier budget)
@needs_shared
def test_real_vidur_profiles_take_the_same_path(tmp_path):
    """Real measured MLP + network files with generated attention: same code path, different numbers."""
    from kvstudy.latency.models import vidur
    from kvstudy.latency.tables import HardwareSpec

    real = SHARED_REFERENCE / "vidur-data" / "profiling"
    compute = tmp_path / "compute"
    compute.mkdir()
    shutil.copy(real / "compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv", compute / "mlp.csv")
    shutil.copy(PROFILES_DIR / "compute/a100/llama2_70b/attention.csv", compute / "attention.csv")
    arch = load_model_arch("llama2_70b")
    hw = HardwareSpec("a100_tp2", "a100", "a100_pairwise_nvlink", 2)
    lat = vidur(arch, hw, capacity_tokens=4096, compute_dir=str(compute),
                network_dir=str(real / "network/a100_pairwise_nvlink"), num_estimators=[8], max_batch_size=128)
    ours = vidur(arch, hw, capacity_tokens=4096, num_estimators=[8], max_batch_size=128)
    assert lat.info["profiles"] == str(compute)
    a = lat.iteration_seconds([(512, 0)], 0, 0)
    b = ours.iteration_seconds([(512, 0)], 0, 0)
    assert a != b and abs(a / b - 1) < 0.3  # calibrated profiles land near the measured ones
