"""Combining study files: per draw the best schedule and the best bound of any file, proofs carried over,
and nothing combined that is not the same draw or does not re-check."""
import numpy as np
import pandas as pd
import pytest

from kvstudy.errors import ConfigError
from kvstudy.optimum.combine import best_known
from kvstudy.optimum.study import study


@pytest.fixture(scope="module")
def runs():
    plain = study(2, trials=0, only=[0, 1], time_limit=0)  # MC-SF and the closed-form bounds, paper size
    searched = study(2, trials=0, only=[1], time_limit=0, lns_passes=1)  # a better, stored schedule for trial 1
    return plain, searched


def test_best_schedule_and_bound_of_any_file(runs):
    plain, searched = runs
    lifted = plain.copy()
    lifted.loc[lifted["trial"] == 0, "bound"] += 7.0  # e.g. an LP bound: larger, still below the schedule
    both = best_known({"plain": plain, "searched": searched, "lifted": lifted})
    t0, t1 = both.set_index("trial").loc[0], both.set_index("trial").loc[1]
    assert t1["incumbent"] == searched["incumbent"].iloc[0] < plain.loc[plain.trial == 1, "incumbent"].iloc[0]
    assert t1["incumbent_from"] == "searched" and t1["files"] == 3
    assert t0["bound"] == plain.loc[plain.trial == 0, "bound"].iloc[0] + 7.0 and t0["bound_from"] == "lifted"
    assert not both["proven_optimal"].any()
    assert np.allclose(both["ratio_low"], both["mcsf"] / both["incumbent"])


def test_a_best_schedule_known_only_as_a_number_is_flagged(runs):
    plain, searched = runs
    bare = searched.drop(columns=["start"])  # a file from before the start column: same value, no schedule
    tied = best_known({"bare": bare, "searched": searched}).iloc[0]
    assert tied["incumbent_from"] == "searched" and tied["incumbent_checked"]  # the stored schedule wins the tie
    better = bare.copy()
    better["incumbent"] -= 1  # a claim no schedule backs
    alone = best_known({"better": better, "searched": searched}).iloc[0]
    assert alone["incumbent_from"] == "better" and not alone["incumbent_checked"]
    assert not best_known({"searched": searched}, verify=False)["incumbent_checked"].any()


def test_a_bound_within_one_of_the_schedule_proves_it(runs):
    plain, _ = runs
    tight = plain.copy()
    tight["bound"] = tight["incumbent"] - 0.5  # objective (1) is an integer: nothing lies strictly between
    both = best_known({"plain": plain, "tight": tight})
    assert both["proven_optimal"].all() and (both["bound"] == both["incumbent"]).all()
    assert (both["ratio_high"] == both["ratio_low"]).all()


def test_files_that_disagree_are_refused_by_name(runs):
    plain, searched = runs
    other = plain.copy()
    other.loc[other["trial"] == 1, "n"] += 1
    with pytest.raises(ConfigError, match=r"trial 1: the sources disagree on n"):
        best_known({"plain": plain, "other": other})
    with pytest.raises(ConfigError, match=r"trial 1 in other has n=.*the seed-0 draw has n="):
        best_known({"other": other})
    tampered = searched.copy()
    tampered.at[0, "start"] = np.asarray(tampered.at[0, "start"]) * 0  # everything at round 0: over memory
    with pytest.raises(ConfigError, match=r"trial 1 in tampered: stored schedule rejected by the checker"):
        best_known({"tampered": tampered})
    wrong = plain.copy()
    wrong["bound"] = wrong["incumbent"] + 5.0
    with pytest.raises(ConfigError, match=r"bound .* from wrong exceeds the schedule"):
        best_known({"wrong": wrong})
    with pytest.raises(ConfigError, match=r"cut holds draws cut to \[6\]"):
        best_known({"cut": study(2, trials=1, time_limit=0, cut=6)})


def test_files_on_disk(runs, tmp_path):
    plain, _ = runs
    path = tmp_path / "m2.parquet"
    plain.to_parquet(path)
    assert best_known([path])["incumbent_from"].eq("m2.parquet").all()
    junk = tmp_path / "junk.parquet"
    junk.write_text("no")
    with pytest.raises(ConfigError, match="cannot read .*junk.parquet as a study file"):
        best_known([junk])
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "x.parquet")
    with pytest.raises(ConfigError, match=r"x.parquet has no column\(s\) \['model'"):
        best_known([tmp_path / "x.parquet"])


def test_a_copied_file_counts_once(runs):
    plain, searched = runs
    once = best_known({"plain": plain, "searched": searched})
    twice = best_known({"plain": plain, "copy": plain.copy(), "searched": searched})
    pd.testing.assert_frame_equal(once, twice)  # same files count and seconds: the copy is left out
    assert once.set_index("trial").loc[1, "files"] == 2
    changed = plain.copy()
    changed["lns_seconds"] = 1.0  # no longer a copy: counted
    assert best_known({"plain": plain, "changed": changed})["files"].tolist() == [2, 2]
