"""Provenance in summary.json and an honest resume (kvstudy/running/provenance.py, api.run): a finished run is skipped only
when its config and its code fingerprint match; resume=config / never; bad folders named in one line."""
import json
import re
import textwrap

import pytest

from kvstudy import api
from kvstudy.running import provenance
from kvstudy.errors import ConfigError

SMALL = ["+policy=mcsf", "+demand=high", "latency=linear", "workload.num_requests=50", "engine.progress=false"]


def test_summary_records_where_the_result_came_from(tmp_path):
    summary = api.run(api.compose(SMALL), tmp_path / "r")
    prov = summary["provenance"]
    assert prov["python"].count(".") == 2 and prov["vidur_version"] == "0.0.26"
    assert prov["kvstudy_version"] and re.fullmatch(r"[0-9a-f]{16}", prov["fingerprint"])
    if (provenance.PACKAGE_DIR.parent / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", prov["kvstudy_commit"]) and prov["kvstudy_dirty"] in (True, False)
    assert prov["policy_module"] is None  # kvstudy's own policy: covered by the code digest
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["provenance"] == prov


def test_vidur_runs_record_their_profile_files():
    cfg = api.compose(["+policy=mcsf", "+demand=high"])
    paths = api._profile_paths(cfg)
    assert [p.name for p in paths] == ["mlp.csv", "attention.csv", "all_reduce.csv", "send_recv.csv"]
    assert api._profile_paths(api.compose(SMALL)) == []  # the linear model reads none


def test_resume_skips_only_the_same_config_and_code(tmp_path, monkeypatch):
    cfg, out = api.compose(SMALL), tmp_path / "r"
    first = api.run(cfg, out)
    assert api.run(cfg, out).get("skipped")
    monkeypatch.setattr(provenance, "code_digest", lambda: "0" * 64)  # the code changed since
    with pytest.warns(UserWarning, match="made by other code"):
        again = api.run(cfg, out)
    assert not again.get("skipped") and again["provenance"]["fingerprint"] != first["provenance"]["fingerprint"]
    assert api.run(cfg, out).get("skipped")  # now current
    assert not api.run(cfg, out, resume=False).get("skipped")  # never: runs again
    assert not api.run(api.compose(SMALL + ["resume=never"]), out).get("skipped")
    monkeypatch.setattr(provenance, "code_digest", lambda: "1" * 64)
    assert api.run(api.compose(SMALL + ["resume=config"]), out).get("skipped")  # config: whatever the code


def test_a_different_config_is_never_overwritten(tmp_path):
    out = tmp_path / "r"
    api.run(api.compose(SMALL), out)
    for resume in (True, False, "config"):
        with pytest.raises(ConfigError, match=r"different config \(seed: 0 there, 1 here\)"):
            api.run(api.compose(SMALL + ["seed=1"]), out, resume=resume)


def test_keys_that_change_no_result_are_not_a_different_config(tmp_path):
    """A run written before ``record`` and ``resume`` existed, or with another progress setting, is the same config;
    asking for events it did not record runs it again."""
    out = tmp_path / "r"
    api.run(api.compose(SMALL), out)
    old = (out / "resolved_config.yaml").read_text()
    old = re.sub(r"(?m)^record:\n(  .*\n)+", "", old)
    (out / "resolved_config.yaml").write_text(re.sub(r"(?m)^resume: .*\n", "", old))
    assert api.run(api.compose(SMALL + ["engine.progress=true"]), out).get("skipped")
    summary = api.run(api.compose(SMALL + ["record.events=true"]), out)
    assert not summary.get("skipped") and (out / "events.parquet").exists()
    api.run(api.compose(SMALL), out, resume=False)
    assert not (out / "events.parquet").exists()  # no stale tables of an earlier run


def test_a_users_policy_module_is_part_of_the_fingerprint(tmp_path, monkeypatch):
    pkg = tmp_path / "mine"
    pkg.mkdir()
    module = pkg / "my_fcfs_policy.py"
    module.write_text(textwrap.dedent("""
        from kvstudy.policies.mcsf import MCSF

        class Mine(MCSF):
            name = "mine"
    """))
    monkeypatch.syspath_prepend(str(pkg))
    cfg = api.compose(SMALL + ["policy._target_=my_fcfs_policy.Mine"])
    out = tmp_path / "r"
    summary = api.run(cfg, out)
    assert summary["provenance"]["policy_module"]["file"] == str(module)
    assert api.run(cfg, out).get("skipped")
    module.write_text(module.read_text() + "\nEDITED = True\n")
    with pytest.warns(UserWarning, match="made by other code"):
        assert not api.run(cfg, out).get("skipped")


def test_bad_folders_are_named(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        api.run(api.compose(SMALL), a_file)
    with pytest.raises(ConfigError, match="resume='sometimes': allowed code, config, never"):
        api.run(api.compose(SMALL), tmp_path / "r", resume="sometimes")
    out = tmp_path / "r"
    api.run(api.compose(SMALL), out)
    (out / "summary.json").write_text('{"status": "comp')
    with pytest.raises(ConfigError, match="summary.json: not valid JSON"):
        api.load_run(out)


def test_a_helper_beside_the_users_policy_is_part_of_the_fingerprint(tmp_path, monkeypatch):
    """The new-user trial's case: the policy imports a helper (or a parent class) from a sibling module."""
    (tmp_path / "helper_lengths.py").write_text("BONUS = 0\n")
    (tmp_path / "policy_with_helper.py").write_text(textwrap.dedent("""
        from kvstudy.policies.mcsf import MCSF
        import helper_lengths

        class Mine(MCSF):
            name = "mine"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = api.compose(SMALL + ["policy._target_=policy_with_helper.Mine"])
    out = tmp_path / "r"
    assert api.run(cfg, out)["provenance"]["policy_module"]["files_hashed"] == 2
    assert api.run(cfg, out).get("skipped")
    (tmp_path / "helper_lengths.py").write_text("BONUS = 1\n")
    with pytest.warns(UserWarning, match="made by other code"):
        assert not api.run(cfg, out).get("skipped")


def test_a_policy_in_a_package_hashes_the_package(tmp_path, monkeypatch):
    """A policy defined in a package's __init__.py: the package's files count, not the __init__ alone."""
    pkg = tmp_path / "mypolicies"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from kvstudy.policies.mcsf import MCSF as Mine\n")
    (pkg / "lengths.py").write_text("BONUS = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = provenance.user_module("mypolicies.Mine")
    assert mod["files_hashed"] == 2 and mod["file"] == str(pkg / "__init__.py")
    (pkg / "lengths.py").write_text("BONUS = 1\n")
    assert provenance.user_module("mypolicies.Mine")["sha256"] != mod["sha256"]


def test_prose_does_not_change_the_fingerprint_code_does(tmp_path):
    """Docstrings and comments are not code: editing them leaves finished runs current; a changed line does not."""
    path = tmp_path / "m.py"
    path.write_text('"""A module."""\ndef f(x):\n    """Twice x."""\n    return 2 * x  # doubled\n')
    before = provenance._code(path)
    path.write_text('"""A module, better said."""\ndef f(x):\n    """x, twice."""\n    return 2 * x\n')
    assert provenance._code(path) == before
    path.write_text('"""A module."""\ndef f(x):\n    """Twice x."""\n    return 3 * x\n')
    assert provenance._code(path) != before
    assert "reproduce.py" in provenance.NOT_RESULTS and "timeline.py" in provenance.NOT_RESULTS
