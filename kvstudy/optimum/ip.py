"""The hindsight-optimal integer program of Jaillet et al., eqs. (1)-(4), exactly as written, solved with HiGHS.

    min  sum_i ( sum_{t >= a_i} t x_{i,t} + o_i - a_i )                                   (1)
    s.t. sum_{t >= a_i} x_{i,t} = 1                                    for every i         (2)
         sum_i sum_{k = max(a_i, t - o_i)}^{t - 1} (s_i + t - k) x_{i,k} <= M   for every t  (3)
         x_{i,t} in {0, 1}                                                                  (4)

Start variables run from a_i to T - o_i with the provably valid horizon T = max a + sum(o + 1)
(``Instance.horizon``). By default the model also carries valid inequalities that cut off no feasible
schedule: per round t, at most one heavy request's *block* covers t (``block_rows``; the blocks of
``bounds.heavy_completion_bound``: a request's rounds above M/2 and the gap they force before the next such
tail). They lift the LP relaxation far above that of (1)-(4) alone; ``blocks=False`` solves (1)-(4) bare.
Identical requests (same a, s, o) start in index order (``twin_rows``, symmetry breaking: swapping
their starts changes nothing, so no optimum is lost; ``symmetry=False`` drops it). A warm start (MC-SF's or a
better schedule) is given to HiGHS as a starting solution, and its value caps
every request's start (``bounds.latest_starts``: the others' latency is at least a lower bound, so a later
start cannot beat it), which removes variables and shortens the horizon. Optimality is declared at an absolute
gap below 1 (objective (1) takes integer values), never by HiGHS's default relative gap of 1e-4.
``solver="gurobi"`` sends the same model to Gurobi when gurobipy and a licence are present (the paper's
solver). A run stopped by the time limit reports its incumbent, HiGHS's best bound and the gap, and is never
called optimal; every returned schedule goes through the independent checker (``checker.check``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
from scipy import sparse

from kvstudy.errors import ConfigError
from kvstudy.optimum.bounds import best_bound, heavy_blocks, latest_starts
from kvstudy.optimum.checker import check, total_latency
from kvstudy.optimum.instance import Instance


_INTEGER_GAP = 1.0 - 1e-6  # objective (1) takes integer values: a gap below 1 leaves no better schedule


@dataclass
class IPResult:
    status: str  # optimal | time_limit | error
    objective: Optional[int]  # total latency of the incumbent (checked)
    bound: float  # best lower bound known: HiGHS's dual bound or bounds.best_bound, the larger
    gap: float  # (objective - bound) / objective
    start: Optional[np.ndarray]
    seconds: float
    num_vars: int
    num_nonzeros: int

    @property
    def proven_optimal(self) -> bool:
        return self.status == "optimal"


def build(inst: Instance, horizon: Optional[int] = None, latest: Optional[np.ndarray] = None):
    """Sparse model: (cost, A_eq rows (2), A_mem rows (3), var_request, var_start, constant). ``latest``:
    optional per-request last start (``bounds.latest_starts``); the horizon shrinks to what it leaves."""
    T = horizon or inst.horizon()
    last = T - inst.output
    if latest is not None:
        last = np.minimum(last, latest)
        T = int(min(T, (last + inst.output).max()))
    req, start = [], []
    for i in range(inst.n):
        ks = np.arange(inst.arrival[i], last[i] + 1)
        req.append(np.full(len(ks), i))
        start.append(ks)
    var_req = np.concatenate(req)
    var_start = np.concatenate(start)
    nvar = len(var_req)
    rows, cols, vals = [], [], []
    for v in range(nvar):
        i, k = var_req[v], var_start[v]
        o, s = int(inst.output[i]), int(inst.prompt[i])
        t = np.arange(k + 1, k + o + 1)  # rounds where the request is active if it starts at k
        rows.append(t - 1)
        cols.append(np.full(o, v))
        vals.append(s + t - k)
    mem = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(T, nvar))
    eq = sparse.csr_matrix((np.ones(nvar), (var_req, np.arange(nvar))), shape=(inst.n, nvar))
    constant = float(np.sum(inst.output - inst.arrival))
    return var_start.astype(float), eq, mem, var_req, var_start, constant


def block_rows(inst: Instance, var_req, k_min, k_max, rounds) -> sparse.csr_matrix:
    """0/1 rows, one per round in ``rounds``: variable v (request var_req[v], starting somewhere in
    [k_min[v], k_max[v]]) has a 1 in the rounds its heavy block covers for *every* such start,
    k_max + o - L + 1 .. k_min + o + beta (``bounds.heavy_blocks``). Blocks of two heavy requests never
    overlap, so each row's sum is at most 1 in every feasible schedule."""
    heavy, tail, beta = heavy_blocks(inst.prompt, inst.output, inst.capacity)
    var_req, k_min, k_max = (np.asarray(x, dtype=np.int64) for x in (var_req, k_min, k_max))
    rounds = np.asarray(rounds, dtype=np.int64)
    rows, cols = [], []
    for v in np.flatnonzero(heavy[var_req]):
        i = var_req[v]
        first = np.searchsorted(rounds, k_max[v] + inst.output[i] - tail[i] + 1)
        stop = np.searchsorted(rounds, k_min[v] + inst.output[i] + beta[i], side="right")
        if first < stop:
            rows.append(np.arange(first, stop))
            cols.append(np.full(stop - first, v))
    if not rows:
        return sparse.csr_matrix((len(rounds), len(var_req)))
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    return sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(rounds), len(var_req)))


def _model_block_rows(inst: Instance, var_req, var_start, num_rounds: int, blocks: bool) -> sparse.csr_matrix:
    """``block_rows`` for ``build``'s variables (one start each, rows = rounds 1..num_rounds); none if off."""
    if not blocks:
        return sparse.csr_matrix((0, len(var_req)))
    return block_rows(inst, var_req, var_start, var_start, np.arange(1, num_rounds + 1))


def indicator(var_req, var_start, start) -> np.ndarray:
    """The 0/1 vector x of ``build``'s variables that encodes a start vector."""
    index = {(int(r), int(k)): v for v, (r, k) in enumerate(zip(var_req, var_start))}
    x = np.zeros(len(var_req))
    for i, k in enumerate(start):
        x[index[(i, int(k))]] = 1.0
    return x


def _identical_groups(inst: Instance) -> list:
    """Indices of requests with the same (a, s, o), one ascending list per distinct request."""
    groups = {}
    for i, key in enumerate(zip(inst.arrival.tolist(), inst.prompt.tolist(), inst.output.tolist())):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def twins(inst: Instance) -> list:
    """Pairs (i, j), i < j, of identical requests (same a, s, o), each request paired with the next identical one."""
    return [(g[k], g[k + 1]) for g in _identical_groups(inst) for k in range(len(g) - 1)]


def twin_rows(inst: Instance, var_req, var_start) -> sparse.csr_matrix:
    """Symmetry breaking among identical requests: one row per ``twins`` pair, S_i - S_j <= 0 written in the
    start variables. Exchanging the starts of two identical requests changes neither feasibility nor cost, so
    some optimal schedule keeps identical requests in index order (``sort_twins`` puts a warm start there)."""
    pairs = twins(inst)
    rows, cols, vals = [], [], []
    for r, (i, j) in enumerate(pairs):
        for req, sign in ((i, 1.0), (j, -1.0)):
            v = np.flatnonzero(var_req == req)
            rows.append(np.full(len(v), r))
            cols.append(v)
            vals.append(sign * var_start[v])
    if not pairs:
        return sparse.csr_matrix((0, len(var_req)))
    return sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(pairs), len(var_req)))


def sort_twins(inst: Instance, start) -> np.ndarray:
    """The same schedule with the starts of each group of identical requests in index order (same cost)."""
    start = np.asarray(start, dtype=np.int64).copy()
    for members in _identical_groups(inst):
        start[members] = np.sort(start[members])
    return start


def starts_of(values, var_req, var_start, n: int) -> np.ndarray:
    """The start vector a (near-)0/1 solution of ``build``'s variables encodes."""
    chosen = np.asarray(values) > 0.5
    start = np.empty(n, dtype=np.int64)
    start[var_req[chosen]] = var_start[chosen]
    return start


def highs_model(cost, eq, mem, capacity: int, constant: float, upper: float, integer: bool, time_limit: float,
                threads: int = 1, packing=None, order=None):
    """A HiGHS instance holding  min cost.x + constant  s.t.  eq x = 1,  mem x <= capacity,  packing x <= 1,
    order x <= 0,  0 <= x <= upper (binary if ``integer``); returns it with the stacked constraint matrix."""
    import highspy

    nvar = len(cost)
    if packing is None:
        packing = sparse.csr_matrix((0, nvar))
    if order is None:
        order = sparse.csr_matrix((0, nvar))
    A = sparse.vstack([eq, mem, packing, order]).tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = nvar
    lp.num_row_ = A.shape[0]
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_ = np.zeros(nvar)
    lp.col_upper_ = np.full(nvar, upper)
    free_rows = mem.shape[0] + packing.shape[0] + order.shape[0]
    lp.row_lower_ = np.concatenate([np.ones(eq.shape[0]), np.full(free_rows, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(eq.shape[0]), np.full(mem.shape[0], float(capacity)),
                                    np.ones(packing.shape[0]), np.zeros(order.shape[0])])
    lp.offset_ = float(constant)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data.astype(float)
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * nvar
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if integer:
        # HiGHS calls a run optimal at a relative gap of 1e-4 by default: at ~16,000 (a 60-request instance)
        # that is a gap of 1.6 latency units, so a better schedule could remain. Objective (1) is an integer
        # (integer starts, o, a), so an absolute gap below 1 proves optimality and the relative one is off.
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", _INTEGER_GAP)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    h.passModel(lp)
    return h, A


def solve(inst: Instance, warm_start: Optional[np.ndarray] = None, time_limit: float = 60.0,
          threads: int = 1, horizon: Optional[int] = None, relax: bool = False, solver: str = "highs",
          blocks: bool = True, symmetry: bool = True) -> IPResult:
    """Solve (1)-(4) with ``solver`` = "highs" (highspy, the default) or "gurobi" (gurobipy with a licence);
    ``blocks`` adds the valid ``block_rows``, ``symmetry`` the ``twin_rows`` (integer solves only: the
    relaxation stays that of the model without them). A warm start also bounds every start from above
    (``bounds.latest_starts`` with its total latency): no schedule at least as good is cut off."""
    if solver == "gurobi":
        return _solve_gurobi(inst, warm_start, time_limit, threads, horizon, blocks, symmetry)
    if solver != "highs":
        raise ConfigError(f"solver={solver!r}: allowed 'highs' or 'gurobi'")
    import highspy

    started = time.perf_counter()
    warm_start, cost, eq, mem, var_req, var_start, constant, packing, order = _model(
        inst, warm_start, horizon, blocks, symmetry, relax)
    nvar = len(cost)
    # the limit covers building the model too (6-23 s at paper size), not only HiGHS's run
    remaining = max(1e-3, time_limit - (time.perf_counter() - started))
    h, A = highs_model(cost, eq, mem, inst.capacity, constant, upper=1.0, integer=not relax,
                       time_limit=remaining, threads=threads, packing=packing, order=order)
    if warm_start is not None and not relax:
        sol = highspy.HighsSolution()
        sol.col_value = list(indicator(var_req, var_start, warm_start))
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    seconds = time.perf_counter() - started
    if relax:
        value = float(info.objective_function_value)
        return IPResult("optimal" if status == highspy.HighsModelStatus.kOptimal else str(status), None, value, 0.0,
                        None, seconds, nvar, A.nnz)
    values = np.asarray(h.getSolution().col_value)
    start = None
    objective = None
    if len(values) == nvar and info.primal_solution_status >= 1:
        start = starts_of(values, var_req, var_start, inst.n)
        objective = check(inst, start)  # independent check of what the solver returned
        assert objective == round(info.objective_function_value), (objective, info.objective_function_value)
    bound = max(float(info.mip_dual_bound), best_bound(inst))  # HiGHS reports -inf before its root LP
    if status == highspy.HighsModelStatus.kOptimal:
        label = "optimal"
    elif status == highspy.HighsModelStatus.kTimeLimit:
        label = "time_limit"
    else:
        label = f"error:{status}"
    gap = (objective - bound) / objective if objective else float("nan")
    return IPResult(label, objective, bound, gap, start, seconds, nvar, A.nnz)


def _model(inst: Instance, warm_start, horizon, blocks: bool, symmetry: bool, relax: bool):
    """What both solver paths pass on: the checked warm start (twins sorted when ``symmetry``), ``build``'s
    model with every start capped by the warm start's value (``bounds.latest_starts``; the warm start itself
    stays inside), the block rows and the twin rows. The relaxation gets neither caps nor twin rows: its value
    must stay the LP bound of the full model."""
    latest = None
    if warm_start is not None and not relax:
        if symmetry:
            warm_start = sort_twins(inst, warm_start)
        warm_start = np.asarray(warm_start, dtype=np.int64)
        latest = np.maximum(latest_starts(inst, check(inst, warm_start)), warm_start)
    cost, eq, mem, var_req, var_start, constant = build(inst, horizon, latest)
    packing = _model_block_rows(inst, var_req, var_start, mem.shape[0], blocks)
    order = twin_rows(inst, var_req, var_start) if symmetry and not relax else sparse.csr_matrix((0, len(cost)))
    return warm_start, cost, eq, mem, var_req, var_start, constant, packing, order


def _solve_gurobi(inst: Instance, warm_start, time_limit: float, threads: int, horizon, blocks: bool,
                  symmetry: bool) -> IPResult:
    """The same sparse model through gurobipy (optional: ``pip install gurobipy``; its bundled licence only
    takes models of up to 2,000 variables, so paper-size instances need a full licence)."""
    try:
        import gurobipy as gp
        from gurobipy import GRB
    except ImportError:
        raise ConfigError("solver='gurobi' needs the gurobipy package (pip install gurobipy) and a Gurobi licence; "
                          "solver='highs' needs neither") from None
    started = time.perf_counter()
    warm_start, cost, eq, mem, var_req, var_start, constant, packing, order = _model(
        inst, warm_start, horizon, blocks, symmetry, relax=False)
    nvar = len(cost)
    try:
        env = gp.Env(params={"OutputFlag": 0})
        model = gp.Model(env=env)
        model.Params.TimeLimit = max(1e-3, time_limit - (time.perf_counter() - started))
        model.Params.Threads = int(threads)
        model.Params.Seed = 0
        model.Params.MIPGap = 0.0  # as for HiGHS: the default 1e-4 relative gap is over 1 unit at paper sizes
        model.Params.MIPGapAbs = _INTEGER_GAP
        x = model.addMVar(nvar, vtype=GRB.BINARY, obj=cost)
        model.ObjCon = constant
        model.addMConstr(eq, x, "=", np.ones(inst.n))
        model.addMConstr(mem, x, "<", np.full(mem.shape[0], float(inst.capacity)))
        model.addMConstr(packing, x, "<", np.ones(packing.shape[0]))
        model.addMConstr(order, x, "<", np.zeros(order.shape[0]))
        if warm_start is not None:
            x.Start = indicator(var_req, var_start, warm_start)
        model.optimize()
    except gp.GurobiError as exc:
        raise ConfigError(f"Gurobi refused the model of {nvar} variables: {exc} (the pip licence allows 2,000; "
                          f"use solver='highs' or a full licence)") from None
    seconds = time.perf_counter() - started
    start = objective = None
    if model.SolCount > 0:
        start = starts_of(x.X, var_req, var_start, inst.n)
        objective = check(inst, start)  # independent check of what the solver returned
    bound = max(float(model.ObjBound), best_bound(inst))
    label = {GRB.OPTIMAL: "optimal", GRB.TIME_LIMIT: "time_limit"}.get(model.Status, f"error:{model.Status}")
    gap = (objective - bound) / objective if objective else float("nan")
    return IPResult(label, objective, bound, gap, start, seconds, nvar, eq.nnz + mem.nnz + packing.nnz + order.nnz)


def brute_force(inst: Instance, horizon: Optional[int] = None) -> int:
    """Exhaustive search over all start vectors (tiny instances only, for tests)."""
    from itertools import product

    from kvstudy.optimum.checker import InfeasibleSchedule

    T = horizon or inst.horizon()
    ranges = [range(int(inst.arrival[i]), T - int(inst.output[i]) + 1) for i in range(inst.n)]
    best = None
    for start in product(*ranges):
        try:
            value = check(inst, np.array(start))
        except InfeasibleSchedule:
            continue
        best = value if best is None else min(best, value)
    return best


__all__ = ["IPResult", "block_rows", "build", "solve", "sort_twins", "twin_rows", "twins", "brute_force",
           "total_latency"]
