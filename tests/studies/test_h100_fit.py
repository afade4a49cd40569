"""The H100 fit (issue 54, item 2): its GEMMs fitted with the ECM overlap term phi (kvstudy/profiles/gpu_model.py) stay
within the bounds profiles/README.md reports, beat the plain roofline on every GEMM, and leave A100's fit and
profiles untouched (no phi there). Numbers: `python bench/hardware_fit.py --device h100` (profiles/README.md)."""
import json

import numpy as np
import pytest

from kvstudy.profiles import calibration as calibration_module
from kvstudy.profiles.calibration import calibrate, calibration_file, load_measured_mlp
from kvstudy.profiles.devices import DEVICES
from kvstudy.profiles.gpu_model import GEMM_OPS, roofline_ms
from kvstudy.running.paths import SHARED_REFERENCE
from tests.conftest import needs_shared

#: Pooled median absolute percentage error per GEMM over Vidur's H100 rows of Llama-2-70B, Llama-2-7B and phi-2
#: (measured 6.64 / 6.39 / 5.19 / 8.12 %, profiles/README.md). Three of four within A100's 6.6% (6.63 on
#: attn_pre_proj); mlp_down_proj cannot be, README's "Why the H100 fit was weaker".
GEMM_BOUND_PCT = {"attn_pre_proj": 6.7, "attn_post_proj": 6.5, "mlp_up_proj": 5.3, "mlp_down_proj": 8.2}
#: The plain roofline's medians on the same rows (issue 54's 8.6 / 7.0 / 7.5 / 9.7 %).
ROOFLINE_PCT = {"attn_pre_proj": 8.60, "attn_post_proj": 7.02, "mlp_up_proj": 7.52, "mlp_down_proj": 9.73}


def _medians(result):
    return {row["op"]: row["median_ape_pct"] for row in result["mlp_errors"] if row["op"] in GEMM_OPS}


@pytest.fixture(scope="module")
def h100_fit():
    """The committed fit: tests/studies/test_hardware.py checks that it is what ``calibrate`` gives from the shared files (one
    fit of ~3 s per suite, not two)."""
    return json.loads(calibration_file("h100").read_text())


def test_h100_gemm_medians_within_the_bound(h100_fit):
    medians = _medians(h100_fit)
    for op in GEMM_OPS:
        assert medians[op] <= GEMM_BOUND_PCT[op], (op, medians[op], GEMM_BOUND_PCT[op])
        fit = h100_fit["mlp_ops"][op]
        assert 0 < fit["phi"] < 1 and 0.5 < fit["eta"] <= 1, (op, fit)
        # c0 is a kernel launch again (the small-token rows' 4-6 us), not the 7-13 us the roofline needed
        assert 0.003 < fit["c0"] < 0.007, (op, fit)


@needs_shared
def test_without_the_overlap_term_h100_is_the_old_roofline_fit(monkeypatch, h100_fit):
    """The same rows fitted without phi give issue 54's medians: the term, not anything else, moves them."""
    monkeypatch.setattr(calibration_module, "OVERLAP_FITTED", ())
    plain = calibrate(SHARED_REFERENCE / "vidur-data", "h100")
    assert "phi" not in plain["mlp_ops"]["mlp_up_proj"]
    new = _medians(h100_fit)
    for op, old in _medians(plain).items():
        assert old == pytest.approx(ROOFLINE_PCT[op], abs=0.01)
        assert new[op] < old - 0.6, (op, new[op], old)  # 0.6-2.3 points on every GEMM


@needs_shared
def test_h100_down_proj_rows_are_not_monotone_in_tokens():
    """Why mlp_down_proj stays above 6.6%: on H100 16% of its rows take >10% longer than the same matrix at some larger
    token count (Llama-2-70B TP1 at 640 tokens: 0.72 ms, at 768: 0.56 ms); on A100 4%. No model whose time grows with
    the token count can follow them."""
    def slower_than_a_larger_count(device):
        m = load_measured_mlp(SHARED_REFERENCE / "vidur-data", device)
        shares = []
        for _, g in m[m["op"] == "mlp_down_proj"].groupby(["model", "tp"]):
            t = g.sort_values("num_tokens")["ms"].to_numpy()
            cheapest_later = np.minimum.accumulate(t[::-1])[::-1]
            shares.append(np.mean(t > 1.1 * cheapest_later))
        return 100 * np.mean(shares)
    assert slower_than_a_larger_count("h100") > 15 > 5 > slower_than_a_larger_count("a100")


def test_a100_keeps_the_plain_roofline():
    """No phi in A100's calibration (its profiles rebuild byte for byte: tests/studies/test_profiles.py); phi = 0 is the
    roofline; phi > 0 adds phi x compute to the memory time."""
    a100 = json.loads(calibration_file("a100").read_text())
    assert all("phi" not in p for p in a100["mlp_ops"].values())
    assert "a100" not in calibration_module.OVERLAP_FITTED
    flops, nbytes = np.array([1e9, 1e11, 1e12]), np.array([1e8, 1e8, 1e8])
    gpu = DEVICES["h100"]
    plain = roofline_ms(flops, nbytes, gpu, 0.005, 0.7, 0.9)
    assert np.array_equal(roofline_ms(flops, nbytes, gpu, 0.005, 0.7, 0.9, 0.0), plain)
    compute = flops / (989e12 * 0.7) * 1e3
    memory = nbytes / (3350e9 * 0.9) * 1e3
    assert np.allclose(roofline_ms(flops, nbytes, gpu, 0.005, 0.7, 0.9, 0.5),
                       0.005 + np.maximum(compute, memory + 0.5 * compute))
    assert (roofline_ms(flops, nbytes, gpu, 0.005, 0.7, 0.9, 0.5) >= plain).all()
