"""Work the test suite (and every run) no longer repeats (issue 54, item 4): the code digest kept in the cache."""
import os
import time

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
