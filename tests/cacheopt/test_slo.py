"""The CacheOPT study's SLOs and metrics (kvstudy/cacheopt/slo.py), on a hand-worked requests table."""
import numpy as np
import pytest


def test_slo_metrics_hand_worked():
    import pandas as pd

    from kvstudy.cacheopt import slo

    req = pd.DataFrame({"request_id": [0, 1, 2], "state": ["done", "done", "waiting"],
                        "ttft": [1.0, 3.0, np.nan], "mean_tbt": [0.1, 0.3, np.nan], "max_tbt": [0.2, 0.5, np.nan],
                        "e2e_latency": [5.0, 9.0, np.nan], "output_tokens": [10, 30, 5],
                        "arrival_time": [0.0, 1.0, 2.0], "first_scheduled_time": [0.5, 2.0, np.nan],
                        "completion_time": [5.0, 10.0, np.nan], "preempted_seconds": [0.0, 2.0, 0.0],
                        "preemptions": [0, 1, 0]})
    assert slo.reference([req, req]) == (2.0, pytest.approx(0.2))
    assert slo.attainment(req, np.array([1.0, 2.0, 9.0]), np.array([0.2, 1.0, 9.0])) == (pytest.approx(1 / 3),
                                                                                         pytest.approx(2 / 3))
    assert slo.tails(req)["normalized_latency"] == pytest.approx((0.5 + 0.3) / 2)
    split = slo.time_split(req)
    assert split == {"waiting": 0.75, "execution": pytest.approx((4.5 + 6.0) / 2), "preemption": 1.0,
                     "preemptions": 0.5}
    tft, tbt = slo.draw_slos(np.array([100, 1000]), 2.0, 0.1, 512, seed=0)
    assert 0.5 * 2.0 <= tft[0] <= 2.5 * 2.0 and 2 * 0.5 * 2.0 <= tft[1] <= 2 * 2.5 * 2.0  # 1000 tokens: 2 chunks
    assert np.array_equal(tft, slo.draw_slos(np.array([100, 1000]), 2.0, 0.1, 512, seed=0)[0])
    assert slo.sustainable_rate(np.array([10, 20, 30]), np.array([0.1, 0.3, 0.9]), 0.6) == pytest.approx(25.0)
    assert np.isnan(slo.sustainable_rate(np.array([10]), np.array([1.0]), 0.5))
