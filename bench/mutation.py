"""Mutation testing of kvstudy's core with cosmic-ray (issue 55; docs/mutation.md): one module's mutants, or a seeded
random sample of the core's, each mutant running only the test files that cover its module (``TESTS`` below).

    pip install -e ".[mutation]"                          # cosmic-ray 8.x; outside CI: the whole core is hours
    python bench/mutation.py --module kvstudy/cluster/routers.py --sample 20 --seed 0
    python bench/mutation.py --sample 300 --seed 55                      # over the whole core
    python bench/mutation.py --list                                       # the module -> test files mapping

cosmic-ray mutates files in place, so the run works on a copy of the checkout (``git ls-files``, untracked files
too) under ``--workdir``: the checkout stays untouched and other work in it goes on. Every mutant runs
``python -m pytest -n 0 -x -q`` on its module's test files (one process, stops at the first failure) under ``nice``;
a mutant whose tests fail, error or exceed ``--timeout`` is killed. Equivalent mutants (no behaviour can tell them
apart) are listed in ``EQUIVALENT`` with the reason and counted apart. Writes ``<workdir>/report.json`` (the sample,
each mutant's outcome and diff) and prints the kill rate per module and every survivor's diff.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = ("kvstudy/engine", "kvstudy/memory", "kvstudy/policies", "kvstudy/cacheopt", "kvstudy/cluster", "kvstudy/costs")

_STEP = ["tests/engine/test_step_engine.py", "tests/engine/test_decode_block_check.py", "tests/engine/test_decode_runs.py",
         "tests/mutation/test_mutation_gaps.py"]
_ADMISSION = ["tests/policies/test_policies.py", "tests/policies/test_mcsf_incremental.py", "tests/policies/test_protection.py",
              "tests/policies/test_admission_paged.py", "tests/mutation/test_mutation_gaps.py"]
_CACHEOPT = ["tests/cacheopt/test_cacheopt_components.py", "tests/cacheopt/test_cacheopt_policy.py", "tests/cacheopt/test_cacheopt_inputs.py",
             "tests/mutation/test_mutation_gaps.py"]
#: module (a file, or a folder for every file in it not named on its own) -> the test files that cover it; the most
#: specific key wins
TESTS = {
    "kvstudy/engine": _STEP + ["tests/engine/test_events.py", "tests/policies/test_admission_paged.py", "tests/policies/test_reserving.py"],
    "kvstudy/engine/events.py": ["tests/engine/test_events.py", "tests/engine/test_step_engine.py"],
    "kvstudy/engine/paper_setting.py": ["tests/policies/test_policies.py", "tests/policies/test_mcsf_incremental.py"],
    "kvstudy/memory": _STEP + ["tests/memory/test_capacity_vllm.py", "tests/policies/test_admission_paged.py"],
    "kvstudy/memory/paper.py": ["tests/policies/test_policies.py", "tests/policies/test_mcsf_incremental.py"],
    "kvstudy/memory/prefix.py": ["tests/memory/test_prefix_cache.py", "tests/memory/test_prefix_engine.py", "tests/memory/test_offload.py",
                                "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/memory/offload.py": ["tests/memory/test_offload.py", "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/policies": _ADMISSION,
    "kvstudy/policies/vllm.py": _STEP + ["tests/memory/test_capacity_vllm.py", "tests/policies/test_cache_orders.py"],
    "kvstudy/policies/step.py": _STEP + ["tests/policies/test_rr_sjf.py"],
    "kvstudy/policies/rr_sjf.py": ["tests/policies/test_rr_sjf.py"] + _STEP,
    "kvstudy/policies/reserving.py": ["tests/policies/test_reserving.py", "tests/engine/test_decode_runs.py",
                                      "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/policies/cache_orders.py": ["tests/policies/test_cache_orders.py", "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/cacheopt": _CACHEOPT,
    "kvstudy/cacheopt/slo.py": ["tests/cacheopt/test_slo.py", "tests/cacheopt/test_cacheopt_study.py"],
    "kvstudy/cacheopt/study.py": ["tests/cacheopt/test_cacheopt_study.py"],
    "kvstudy/cacheopt/setup.py": ["tests/cacheopt/test_cacheopt_policy.py", "tests/cacheopt/test_cacheopt_study.py"],
    "kvstudy/cluster": ["tests/cluster/test_routers.py", "tests/cluster/test_cluster.py", "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/costs": ["tests/memory/test_capacity_vllm.py", "tests/memory/test_capacity_docs.py", "tests/engine/test_step_engine.py",
                      "tests/memory/test_offload.py", "tests/mutation/test_mutation_gaps.py"],
    "kvstudy/costs/predictors.py": ["tests/policies/test_rr_sjf.py", "tests/cacheopt/test_cacheopt_inputs.py"],
    "kvstudy/costs/arch.py": ["tests/memory/test_capacity_vllm.py", "tests/config/test_configs.py", "tests/studies/test_workloads.py"],
}

#: mutants no test can kill because no behaviour tells them apart: "module:line operator #occurrence" -> why
#: (labels as the report prints them; a line number moves when the module changes: re-check after editing it)
EQUIVALENT = {
    "kvstudy/cluster/routers.py:116:43 core/ReplaceUnaryOperator_USub_Invert #0":
        "prefix_affinity's key -cached becomes ~cached = -cached - 1: the same order, the same choice",
    **{f"kvstudy/cluster/routers.py:{at} core/NumberReplacer #{k}":
       "a default of ReplicaLoad's fields: runs route on kvstudy/cluster/driver.py's ReplicaView, which computes every "
       "field; nothing in kvstudy builds a ReplicaLoad (the tests' stand-in, with every field given where it matters)"
       for at, k in (("37:19", 0), ("37:19", 1), ("38:23", 2), ("38:23", 3), ("39:21", 4), ("39:21", 5),
                     ("40:22", 6), ("40:22", 7), ("41:64", 8), ("41:64", 9))},
    "kvstudy/cluster/routers.py:98:25 core/ReplaceComparisonOperator_Eq_LtE #0":
        "power_of_two's len(replicas) == 1 -> <= 1: a cluster has at least one replica (cluster.replicas >= 1)",
    # the seeded sample of issue 55 (--sample 300 --seed 55), at commit 08703e0's line numbers
    "kvstudy/engine/check.py:48:39 core/ReplaceComparisonOperator_LtE_Lt #0":
        "the check's short way refuses request 0 too: the full check then runs and accepts it (speed only)",
    "kvstudy/engine/check.py:49:33 core/ReplaceComparisonOperator_LtE_Eq #1":
        "the check's short way refuses a partial chunk: the full check then runs and accepts it (speed only)",
    "kvstudy/engine/check.py:184:65 core/ReplaceBinaryOperator_Sub_Add #6":
        "without victims freed is 0 (used + 0 = used - 0); with victims `preempted or ...` is true before the sum",
    "kvstudy/engine/decode_clock.py:103:115 core/NumberReplacer #32":
        "held.get(i, 0) -> (i, 1): a request on the decode clock always holds its context's blocks: never the default",
    "kvstudy/engine/loop.py:364:24 core/ReplaceComparisonOperator_Gt_GtE #0":
        "8 victims cleared in one pass over the running list or one by one: the same list, order and state (speed)",
    "kvstudy/engine/loop.py:430:83 core/ReplaceBinaryOperator_Sub_Add #10":
        "a decode run asks for more iterations' seconds ahead than max_iterations lets it use: the extra are unused",
    "kvstudy/engine/loop.py:432:60 core/AddNot #75":
        "max(c, 0.0) and c + 0.0 are the same for an iteration's seconds c >= 0 (no latency model returns -0.0)",
    "kvstudy/engine/loop.py:433:41 core/ReplaceBinaryOperator_Mul_RShift #1":
        "how many seconds a decode run asks for at once: each value is the same (tests/engine/test_decode_runs.py)",
    "kvstudy/engine/loop.py:679:117 core/NumberReplacer #181":
        "the rounding of policy_us_per_iteration, a wall-clock measurement (bench/compare_runs.py's WALL), not a "
        "result",
    "kvstudy/engine/records.py:53:23 core/ReplaceBinaryOperator_Mul_Div #0":
        "clearing(self, *, ...) -> (self, /, ...): every caller passes keywords, which both accept",
    "kvstudy/engine/state.py:104:33 core/NumberReplacer #25":
        "admission_round's start value: set at every admission; only completed requests' are read (records._tbt)",
    "kvstudy/memory/paged.py:265:18 core/NumberReplacer #58":
        "PagedMemory without a cache: cache_stats is read only by PagedCacheRows, which only prefix caching builds",
    "kvstudy/memory/paged.py:330:27 core/ReplaceComparisonOperator_Gt_NotEq #4":
        "when the keys memo is cleared: keys(i, tokens) is recomputed identically when missing (speed only)",
    "kvstudy/memory/paper.py:77:15 core/NumberReplacer #16":
        "release's return on the paper memory: read only for a swap (its blocks' bytes), which the paper never does",
    "kvstudy/memory/prefix.py:95:21 core/ReplaceComparisonOperator_Gt_NotEq #1":
        "when LruKeys drops its consumed entries (memory only): the order of the live keys is the same",
    "kvstudy/memory/prefix.py:95:34 core/ReplaceBinaryOperator_Mul_Mod #1":
        "when LruKeys drops its consumed entries (memory only): the order of the live keys is the same",
    "kvstudy/costs/swap_models.py:72:18 core/ReplaceComparisonOperator_LtE_Eq #0":
        "blocks <= 0 -> == 0: the engine asks for the seconds of a count of blocks moved, never a negative one (a "
        "preemption or a swap-in moves >= 0 blocks, and 0 is the same under both)",
    "kvstudy/cacheopt/policy.py:259:68 core/ReplaceComparisonOperator_Eq_Is #8":
        "h (the host stored in mem.loans) and i are the same int object: d.lend's host comes from "
        "view.held_and_context(), which iterates view.running (kvstudy/policies/step.py:112), the same list the "
        "returned loop iterates; checked with request indices 300/301 (past CPython's small-int cache): the conflict "
        "rule fires at the same step (t=125) with and without the mutant, and 300 random small runs give identical "
        "decisions",
    "kvstudy/cacheopt/policy.py:300:69 core/ReplaceBinaryOperator_Add_Sub #12":
        "sort key -(ctx + bs) vs -(ctx - bs) differ by the constant 2*bs for every critical request: same order "
        "(sorted is stable, ties keep the same order)",
    "kvstudy/cacheopt/policy.py:407:82 core/NumberReplacer #119":
        "bisect_left(order, (thr, -1)) and bisect_left(order, (thr, 0)) give the same position: order holds (a - u, k)"
        " with k >= 0, so every entry with a - u == thr is >= both keys and every entry with a - u < thr is below both",
    "kvstudy/cacheopt/policy.py:566:20 core/ReplaceComparisonOperator_LtE_Lt #5":
        "left == 0 is never followed by another prefill entry: left = token_budget - decodes is >= the step's own "
        "budget (which subtracted the same decodes, and stalls/later victims only raise left); every entry but the "
        "last is taken while the step's budget stays > 0 (prefilling chunks and _start take min(.., budget); the "
        "waiting loop breaks at budget <= 0; _admit returns at budget <= 0), so only the last entry can bring left to "
        "0; checked: 300 random runs (token budgets 8-64, embedding, swaps) give identical decisions with the mutant",
    "kvstudy/costs/predictors.py:92:29 core/ReplaceBinaryOperator_Sub_BitXor #2":
        "under is an int8 array of 0/1 (a comparison cast), and 1 - x == 1 ^ x for x in {0, 1}, both int8: the same "
        "flipped directions.",
    "kvstudy/policies/admission.py:164:14 core/ReplaceComparisonOperator_Eq_Is #2":
        "the one caller (PrefixFutureMemoryPolicy.schedule) passes the class attribute 'arrival', an interned literal,"
        " so `is` is True whenever == is; and had it been False, the fallback SchedulerView.ordered_waiting('arrival')"
        " yields the same (position, prompt + g, max(0, pred - shift - g)) tuples in the same fifo order from the "
        "adapter's arrays. Differential runs (MC-Benchmark on paper and paged memory, 30 random instances) identical.",
    "kvstudy/policies/mcsf.py:66:40 core/ReplaceComparisonOperator_Eq_NotEq #0":
        "with equal keys the mutant rebuilds the check, which the kept check equals exactly "
        "(tests/test_mcsf_incremental.py pins kept == fresh); the key changes only after an overflow, where MC-SF's "
        "on_overflow (Policy default) evicts every running request, or in a new run (forget() gives a new token) whose"
        " first view has no running request: either way the reused check has all its members removed, the same empty "
        "check a rebuild gives. Differential runs (MC-SF/MC-Benchmark, paper memory, noisy predictions with clearings,"
        " each engine run twice, with and without the remedy) identical.",
    "kvstudy/policies/protection.py:58:38 core/ReplaceComparisonOperator_GtE_Gt #0":
        "when k == total, head_prompts(k) already holds the whole queue; the mutant does one more pass with k = 4 * "
        "total, whose head_prompts is the same whole queue and gives the same taken, then returns (k > total): same "
        "answer, one extra pass.",
    "kvstudy/policies/rr_sjf.py:56:22 core/ReplaceTrueWithFalse #0":
        "own_queue_order only makes the engine keep its waiting queue as a WaitingSet instead of a deque "
        "(engine/loop.py 154, state.py 68): same members; QueuedVLLM reads only len(view.waiting) and the engine only "
        "membership, len and min(st.waiting) (loop.py 694), never the order. Differential runs of fcfs/rr/rr_sjf/sjf "
        "(recompute and swap) identical.",
    "kvstudy/policies/rr_sjf.py:98:24 core/ReplaceComparisonOperator_Eq_IsNot #1":
        "view.state is a numpy int8 array (engine/state.py 65), so state[i] is a fresh numpy scalar and `is not "
        "WAITING` is always True: the mutant also appends arrivals rejected up front (state REJECTED), which the very "
        "next lines drop (len(order) != len(waiting) + swapped -> filtered to WAITING/SWAPPED); wait_since of a "
        "rejected request is never read. Differential runs identical.",
    "kvstudy/policies/rr_sjf.py:124:20 core/ReplaceContinueWithBreak #0":
        "can_swap_in is NEVER only when host blocks + 1 > num_blocks, but the engine swaps a request out only if "
        "num_blocks - (held + 1) >= watermark_blocks (engine/transitions.py 35), else it recomputes it; host blocks "
        "never grow while swapped, so a swapped request is never NEVER and the branch is unreachable.",
    "kvstudy/policies/rr_sjf.py:134:16 core/ReplaceContinueWithBreak #2":
        "can_allocate(prefill_blocks(i)) is NEVER only when blocks(prompt + g) > num_blocks - watermark_blocks; the "
        "engine rejects such a request up front (mem.rejection with the watermark, loop.py 163, g = 0) and after a "
        "recompute preemption (transitions.py 63, same test), and _sync drops rejected requests from the policy's "
        "order before the walk (length check); so the walk never meets a NEVER request.",
    "kvstudy/policies/vllm.py:187:88 core/ReplaceComparisonOperator_Lt_GtE #6":
        "the mutant only makes _head_fits (a shortcut) say True more often for lpm/dfs_weight; when the original says "
        "False the smallest waiting prompt leaves free - blocks < watermark, so _schedule_prefills (same free, same "
        "block count) breaks before starting anything and vLLM falls through to the same decode decision; for Sarathi "
        "the full path then equals DECODE_ALL (decode fast branch, no prefill). Differential runs with lpm/dfs_weight "
        "on a prefix cache identical.",
    "kvstudy/policies/vllm.py:201:21 core/ReplaceBinaryOperator_Sub_LShift #6":
        "the line's own comment: a waiting request with total - blocks < watermark (can_allocate NEVER) is rejected by"
        " the engine up front and after any recompute preemption (loop.py 163, transitions.py 63; not adapted), so the"
        " `continue` is never reached and replacing its test by one that is never true changes nothing. Differential "
        "runs of vllm/sarathi with watermarks identical.",
}


def tests_for(module: str) -> list:
    """The test files of ``module`` (the most specific key of ``TESTS`` that is it or a folder above it)."""
    keys = [k for k in TESTS if module == k or module.startswith(k + "/")]
    if not keys:
        raise SystemExit(f"error: {module} is not in kvstudy's core ({', '.join(CORE)}); allowed: a .py file under one")
    return TESTS[max(keys, key=len)]


def core_modules(selection: list) -> list:
    out = []
    for item in selection or CORE:
        path = REPO / item
        if path.is_dir():
            out += sorted(str(p.relative_to(REPO)) for p in path.glob("*.py") if p.name != "__init__.py")
        elif path.is_file() and path.suffix == ".py":
            out.append(item)
        else:
            raise SystemExit(f"error: --module {item}: no such file or folder in {REPO}; allowed: a .py file or a "
                             f"folder under {', '.join(CORE)}")
        tests_for(out[-1] if out else item)
    return out


def copy_tree(dest: Path) -> None:
    """The checkout's files (tracked and untracked, not ignored) copied to ``dest``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def prepare(work: Path, python: str):
    """A fresh copy of the checkout under ``work`` and the tests' environment; checks the copy is what they import."""
    if work.exists():
        if not (work / "tree").is_dir():  # never delete a folder this script did not make
            raise SystemExit(f"error: --workdir {work} exists and is not one of this script's; allowed: a new path "
                             f"or a former run's")
        shutil.rmtree(work)
    tree = work / "tree"
    tree.mkdir(parents=True)
    copy_tree(tree)
    env = dict(os.environ, KVSTUDY_TEST_CACHE=os.environ.get("KVSTUDY_TEST_CACHE", str(work / "testcache")))
    shared = subprocess.run([python, "-c", "from kvstudy.running.paths import SHARED_REFERENCE as s; print(s)"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    env.setdefault("KVSTUDY_SHARED", shared)  # the copy's ../shared does not exist
    seen = subprocess.run([python, "-c", "import kvstudy; print(kvstudy.__file__)"], cwd=tree, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    if not seen.startswith(str(tree)):  # the tests must import the mutated copy, not the checkout
        raise SystemExit(f"error: in {tree} Python imports kvstudy from {seen}, not the copy")
    return tree, env


#: test files left out of every module's mapping (``--exclude-test``: a kill rate before a file's tests existed)
EXCLUDED: set = set()


def test_command(python: str, module: str) -> str:
    files = [f for f in tests_for(module) if f not in EXCLUDED]
    if not files:
        raise SystemExit(f"error: --exclude-test leaves {module} no test file; allowed: fewer exclusions")
    return f"nice -n 19 {python} -m pytest -n 0 -x -q -p no:cacheprovider {' '.join(files)}"


def label(module: str, item) -> str:
    """A mutant's name: module:line:column operator #occurrence (stable while the module's source is)."""
    mut = item.mutations[0]
    return f"{module}:{mut.start_pos[0]}:{mut.start_pos[1]} {mut.operator_name} #{mut.occurrence}"


def sessions_for(modules, work: Path, tree: Path, args, cr) -> dict:
    """One cosmic-ray session per module (its own test command), its mutants listed: module -> (config, db)."""
    sessions = {}
    for m in modules:
        cfg, db = work / f"{m.replace('/', '.')}.toml", work / f"{m.replace('/', '.')}.sqlite"
        cfg.write_text(f'[cosmic-ray]\nmodule-path = "{tree / m}"\ntimeout = {args.timeout}\nexcluded-modules = []\n'
                       f'test-command = "{test_command(args.python, m)}"\n\n[cosmic-ray.distributor]\nname = "local"\n')
        subprocess.run([cr.cosmic, "init", str(cfg), str(db)], cwd=tree, check=True)
        sessions[m] = (cfg, db)
    return sessions


def shard(text: str):
    """``K/N`` -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: K/N, e.g. 1/2")
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: 1 <= K <= N")
    return k, n


def draw(sessions: dict, sample, seed: int, cr, part=(1, 1), only=None):
    """Every mutant in a fixed order (cosmic-ray's job ids are random), a seeded sample of them, and of the sample
    the ``part`` = (K, N) slice (every N-th, from the K-th: the same draw whatever N); the others are marked
    skipped; ``only`` (a set of labels) keeps those of the sample alone. Returns (all, chosen) as (label, module,
    job id) rows."""
    everything = []
    for m, (_, db) in sessions.items():
        with cr.use_db(str(db), cr.WorkDB.Mode.open) as wdb:
            everything += [(label(m, it), m, it.job_id) for it in wdb.pending_work_items]
    everything.sort(key=lambda row: (row[1], [int(x) for x in row[0].split(" ")[0].split(":")[1:]], row[0]))
    chosen = everything if sample is None else random.Random(seed).sample(everything, min(sample, len(everything)))
    if only is not None:
        missing = only - {name for name, _, _ in chosen}
        if missing:
            raise SystemExit(f"error: --survivors-of names mutants this source and draw do not have: "
                             f"{sorted(missing)[:5]}; allowed: the same --sample/--seed/--module on the same source")
        chosen = [row for row in chosen if row[0] in only]
    chosen = chosen[part[0] - 1::part[1]]
    keep = {job for _, _, job in chosen}
    for m, (_, db) in sessions.items():
        drop = [job for _, mm, job in everything if mm == m and job not in keep]
        if drop:
            with cr.use_db(str(db), cr.WorkDB.Mode.open) as wdb:
                wdb.set_multiple_results(drop, cr.WorkResult(output="not in the sample",
                                                             worker_outcome=cr.WorkerOutcome.SKIPPED))
    return everything, chosen


def outcomes(sessions: dict, cr):
    """The rows of the mutants run: killed (tests failed, errored or timed out), survived, equivalent
    (``EQUIVALENT``), or not run (cosmic-ray could not apply it: counted apart)."""
    rows = []
    for m, (_, db) in sessions.items():
        with cr.use_db(str(db), cr.WorkDB.Mode.open) as wdb:
            done = wdb.completed_work_items
        for item, result in done:
            if result.worker_outcome == cr.WorkerOutcome.SKIPPED:
                continue
            name = label(m, item)
            if name in EQUIVALENT:
                outcome = "equivalent"
            elif result.test_outcome in (cr.TestOutcome.KILLED, cr.TestOutcome.INCOMPETENT):
                outcome = "killed"
            elif result.test_outcome == cr.TestOutcome.SURVIVED:
                outcome = "survived"
            else:
                outcome = f"not run ({result.worker_outcome})"
            rows.append({"mutant": name, "outcome": outcome, "diff": result.diff,
                         "timeout": result.output == "timeout"})
    return sorted(rows, key=lambda r: r["mutant"])


def write_report(work: Path, rows: list, seconds: float, **fields) -> int:
    """``<work>/report.json`` of these mutant rows (per-module tallies: killed, equivalent, not run, out of the
    mutants run; the kill rate over those judged: neither equivalent nor not run), printed; ``fields`` describe the
    run (seed, sample, ...)."""
    per_module = {}
    for row in rows:
        tally = per_module.setdefault(row["mutant"].split(":")[0],
                                      {"mutants": 0, "killed": 0, "equivalent": 0, "not_run": 0})
        tally["mutants"] += 1
        tally["killed"] += row["outcome"] == "killed"
        tally["equivalent"] += row["outcome"] == "equivalent"
        tally["not_run"] += row["outcome"].startswith("not run")
    killed = sum(t["killed"] for t in per_module.values())
    judged = sum(t["mutants"] - t["equivalent"] - t["not_run"] for t in per_module.values())
    report = {**fields, "excluded_tests": sorted(EXCLUDED), "per_module": dict(sorted(per_module.items())),
              "killed": killed, "judged": judged, "kill_rate": killed / judged if judged else None,
              "seconds": round(seconds, 1), "mutants": rows}
    (work / "report.json").write_text(json.dumps(report, indent=1))
    return print_report(report, work / "report.json")


def cosmic_ray():
    """cosmic-ray's API and command (installed beside this Python)."""
    try:
        from cosmic_ray.work_db import WorkDB, use_db
        from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult
    except ImportError:
        raise SystemExit('error: cosmic-ray is not installed; allowed: pip install -e ".[mutation]" (cosmic-ray 8.x)')
    return argparse.Namespace(WorkDB=WorkDB, use_db=use_db, TestOutcome=TestOutcome, WorkerOutcome=WorkerOutcome,
                              WorkResult=WorkResult, cosmic=str(Path(sys.executable).with_name("cosmic-ray")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", help="a core module or folder (repeatable; default: the whole core)")
    ap.add_argument("--sample", type=int, help="run a seeded random sample of this many mutants (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests (then: killed)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/kvstudy_mutation"))
    ap.add_argument("--python", default=sys.executable, help="the Python with kvstudy's test extras")
    ap.add_argument("--exclude-test", action="append", default=[],
                    help="leave this test file out of every module's tests (repeatable): the kill rate without it")
    ap.add_argument("--list", action="store_true", help="print module -> test files and stop")
    ap.add_argument("--draw-only", action="store_true", help="list the sampled mutants and stop")
    ap.add_argument("--survivors-of", type=Path, metavar="REPORT",
                    help="run only the mutants that survived in this report.json (e.g. a run before new tests)")
    ap.add_argument("--coverage", type=Path, metavar="JSON",
                    help="with --survivors-of: run each survivor against the tests that cover its line, from "
                         "`coverage json --show-contexts` of a suite run with `--cov-context=test` on the same source "
                         "(docs/mutation.md), instead of its module's mapped files")
    ap.add_argument("--most-tests", type=int, metavar="N",
                    help="with --coverage: at most N of a line's covering tests (every k-th: a fixed subset)")
    ap.add_argument("--also-test", action="append", default=[], metavar="FILE",
                    help="with --coverage: run this test file too for every mutant (new tests the coverage run did "
                         "not see; repeatable)")
    ap.add_argument("--table", nargs="+", type=Path, metavar="REPORT",
                    help="print per-module kill rates as a Markdown table from a run's report, then reports of "
                         "rechecks of its survivors (each column adds the kills of one more report); runs nothing")
    ap.add_argument("--shard", type=shard, default=(1, 1), metavar="K/N",
                    help="run the K-th of N slices of the drawn mutants (each in its own --workdir, one per core); "
                         "--merge joins their reports")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="REPORT",
                    help="join the report.json files of one draw's shards into one and print it; runs nothing")
    args = ap.parse_args(argv)
    if args.merge:
        return print_report(merge(args.merge), None)
    if args.table:
        return print_table(args.table)
    EXCLUDED.update(args.exclude_test)
    modules = core_modules(args.module)
    if args.list:
        for m in modules:
            print(m, test_command(args.python, m).split(" -p no:cacheprovider ")[1])
        return 0
    cr = cosmic_ray()
    work = args.workdir
    tree, env = prepare(work, args.python)
    sessions = sessions_for(modules, work, tree, args, cr)
    only = None
    if args.survivors_of:
        try:
            only = {r["mutant"] for r in json.loads(args.survivors_of.read_text())["mutants"]
                    if r["outcome"] == "survived"}
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"error: --survivors-of {args.survivors_of}: {err}; allowed: a report.json of this script")
    everything, chosen = draw(sessions, args.sample, args.seed, cr, args.shard, only)
    if args.coverage is not None:
        if only is None:
            raise SystemExit("error: --coverage reruns a report's survivors; allowed: with --survivors-of REPORT")
        return recheck(chosen, sessions, tree, env, args, cr)
    print(f"{len(chosen)} of {len(everything)} mutants (seed {args.seed}, shard {args.shard[0]}/{args.shard[1]}) in "
          f"{len(modules)} module(s)", flush=True)
    if args.draw_only:
        print("\n".join(sorted(name for name, _, _ in chosen)))
        return 0
    # the tests of each module sampled pass unmutated first: a failure there is the suite's, not a mutant's
    for command in sorted({test_command(args.python, m) for _, m, _ in chosen}):
        run = subprocess.run(command, shell=True, cwd=tree, env=env, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"error: the tests fail without a mutant ({command}):\n{run.stdout[-2000:]}")
    t0 = time.time()
    for m, (cfg, db) in sessions.items():
        if any(mm == m for _, mm, _ in chosen):
            subprocess.run([cr.cosmic, "exec", str(cfg), str(db)], cwd=tree, env=env, check=True)
    return write_report(work, outcomes(sessions, cr), time.time() - t0, seed=args.seed, sample=args.sample,
                        shard=list(args.shard), modules=modules, mutants_total=len(everything))


def covering(coverage: dict, module: str, line: int) -> list:
    """The test node ids that ran ``module``'s ``line`` (coverage's per-test contexts), the excluded files' left out."""
    for path, data in coverage["files"].items():
        if path.replace("\\", "/").endswith(module):
            ids = {c.split("|")[0] for c in data.get("contexts", {}).get(str(line), ()) if c}
            return sorted(i for i in ids if i.split("::")[0] not in EXCLUDED)
    return []


def recheck(chosen, sessions, tree: Path, env: dict, args, cr) -> int:
    """Each chosen mutant applied alone (cosmic-ray's ``use_mutation``) and the tests covering its line run (``-x``):
    killed (they fail), survived (they pass), or not covered (no test runs the line: survived). Writes
    ``<workdir>/report.json`` as a run does."""
    from cosmic_ray.mutating import use_mutation
    from cosmic_ray.plugins import get_operator

    coverage = json.loads(args.coverage.read_text())
    rows, t0 = [], time.time()
    for name, m, job in chosen:
        with cr.use_db(str(sessions[m][1]), cr.WorkDB.Mode.open) as wdb:
            item = next(it for it in wdb.work_items if it.job_id == job)
        mut = item.mutations[0]
        tests = covering(coverage, m, mut.start_pos[0])
        if args.most_tests and len(tests) > args.most_tests:  # every k-th, a fixed subset (a lower bound on kills)
            tests = tests[::-(-len(tests) // args.most_tests)]
        tests += [f for f in args.also_test if f not in EXCLUDED]
        outcome, seconds = "survived (no test covers the line)", 0.0
        if name in EQUIVALENT:  # listed with its reason: not run
            outcome, tests = "equivalent", []
        if tests:
            with use_mutation(Path(mut.module_path), get_operator(mut.operator_name)(), mut.occurrence) as (_, code):
                if code is None:
                    outcome = "not run (cosmic-ray could not apply it)"
                else:
                    t = time.time()
                    try:
                        run = subprocess.run(["nice", "-n", "19", args.python, "-m", "pytest", "-n", "0", "-x", "-q",
                                              "-p", "no:cacheprovider", *tests], cwd=tree, env=env,
                                             capture_output=True, text=True, timeout=args.timeout)
                        status = run.returncode
                    except subprocess.TimeoutExpired:
                        status = "timeout"
                    seconds = time.time() - t
                    if status == 0:
                        outcome = "survived"
                    elif status in (4, 5):  # usage error (a node id not found) or nothing collected
                        outcome = f"not run (pytest exit {status}: {run.stdout[-300:]!r})"
                    else:
                        outcome = "killed"
        print(f"{outcome.split(' (')[0]:>9} {name} ({len(tests)} tests, {seconds:.0f} s)", flush=True)
        rows.append({"mutant": name, "outcome": outcome.split(" (")[0], "detail": outcome, "tests": len(tests),
                     "seconds": round(seconds, 1)})
    return write_report(args.workdir, rows, time.time() - t0, seed=args.seed, sample=args.sample,
                        shard=list(args.shard), modules=sorted({m for _, m, _ in chosen}),
                        rechecked=str(args.survivors_of), coverage=str(args.coverage))


def print_table(paths: list) -> int:
    """Per-module kill rates of a run (the first report) and after each recheck of its survivors (the next reports,
    cumulative): killed / (mutants - equivalent), equivalent as ``EQUIVALENT`` lists them now."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    outcome = {r["mutant"]: r["outcome"] for r in reports[0]["mutants"]}
    columns = []
    for rep in reports[1:] + [None]:
        tally = {}
        for name, out in outcome.items():
            module = name.split(":")[0]
            t = tally.setdefault(module, [0, 0, 0])  # killed, judged, equivalent
            if name in EQUIVALENT:
                t[2] += 1
                continue
            t[1] += 1
            t[0] += out == "killed"
        columns.append(tally)
        if rep is not None:
            for row in rep["mutants"]:
                if row["outcome"] == "killed":
                    outcome[row["mutant"]] = "killed"
    names = ["first run"] + [Path(p).parent.name for p in paths[1:]]
    print("| module | mutants | equivalent | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for module in sorted(columns[0]):
        k0, j0, e0 = columns[0][module]
        cells = [f"{c[module][0]}/{c[module][1]} ({c[module][0] / max(1, c[module][1]):.0%})" for c in columns]
        print(f"| {module} | {j0 + e0} | {e0} | " + " | ".join(cells) + " |")
    totals = [(sum(c[m][0] for m in c), sum(c[m][1] for m in c)) for c in columns]
    eq = sum(c[2] for c in columns[0].values())
    print(f"| all | {sum(c[1] + c[2] for c in columns[0].values())} | {eq} | "
          + " | ".join(f"{k}/{j} ({k / max(1, j):.1%})" for k, j in totals) + " |")
    left = [name for name, out in outcome.items() if out != "killed" and name not in EQUIVALENT]
    print(f"\nnot killed and not listed equivalent ({len(left)}):" + "".join(f"\n  {name}" for name in sorted(left)))
    return 0


def merge(paths: list) -> dict:
    """One report from the shards of one draw (same seed, sample, modules and exclusions; every shard once)."""
    reports = []
    for p in paths:
        try:
            reports.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: --merge {p}: {err}; allowed: a report.json this script wrote")
    keys = ("seed", "sample", "modules", "excluded_tests")
    for p, r in zip(paths, reports):
        if any(r.get(k) != reports[0].get(k) for k in keys):
            raise SystemExit(f"error: --merge {p} is from another draw than {paths[0]} (its {', '.join(keys)} differ)")
    shards = sorted(tuple(r.get("shard", (1, 1))) for r in reports)
    if shards != [(k, shards[0][1]) for k in range(1, shards[0][1] + 1)]:
        raise SystemExit(f"error: --merge: shards {shards}; allowed: each of 1/N .. N/N once")
    per_module = {}
    for r in reports:
        for m, t in r["per_module"].items():
            acc = per_module.setdefault(m, dict.fromkeys(t, 0))
            for k, v in t.items():
                acc[k] += v
    killed = sum(r["killed"] for r in reports)
    judged = sum(r["judged"] for r in reports)
    return {**{k: reports[0][k] for k in keys}, "shards": len(reports), "mutants_total": reports[0]["mutants_total"],
            "per_module": dict(sorted(per_module.items())), "killed": killed, "judged": judged,
            "kill_rate": killed / judged if judged else None, "seconds": max(r["seconds"] for r in reports),
            "mutants": sorted((row for r in reports for row in r["mutants"]), key=lambda row: row["mutant"])}


def print_report(report: dict, where) -> int:
    per_module, rows, killed, judged = report["per_module"], report["mutants"], report["killed"], report["judged"]
    for m, t in per_module.items():
        n = t["mutants"] - t["equivalent"] - t["not_run"]
        print(f"{m}: {t['killed']}/{n} killed ({t['killed'] / max(1, n):.0%}), {t['equivalent']} equivalent, "
              f"{t['not_run']} not run")
    print(f"all: {killed}/{judged} killed ({report['kill_rate'] or 0:.1%}) in {report['seconds']} s"
          + (f"; report: {where}" if where else ""))
    for r in rows:
        if r["outcome"] not in ("killed", "equivalent"):
            print(f"\n{r['outcome'].upper()} {r['mutant']}\n{r.get('diff') or r.get('detail', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
