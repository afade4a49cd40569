"""Fit the analytical GPU model's efficiencies to a GPU's real Vidur measurements and report its error.

For a calibrated device (``devices.CALIBRATED``: a100, h100; H100's GEMMs with the overlap term phi, ``OVERLAP_FITTED``)
reads (never copies)
``<vidur-data>/profiling/compute/<device>/*/*/mlp.csv`` and ``<vidur-data>/profiling/network/<device>_*/{all_reduce,
send_recv}.csv``; writes the fitted constants to ``profiles/calibration.json`` (A100) or
``profiles/calibration_<device>.json`` (``calibration_file``), which the profile builder reads. Errors are absolute percentage errors
of the fitted model against every measured row (per operator: median and p90 over num_tokens, all
models and TP sizes pooled), the numbers profiles/README.md reports.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from kvstudy.costs.arch import ModelArch
from kvstudy.errors import DataError
from kvstudy.profiles.devices import CALIBRATED
from kvstudy.profiles.gpu_model import DEVICES, GEMM_OPS, MLP_OPS, collective_ms, mlp_op_times, op_work, roofline_ms

_ARCH_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]


def _arch_from_row(row: pd.Series, name: str) -> ModelArch:
    return ModelArch(
        name=name, num_layers=1, num_q_heads=int(row.n_head), num_kv_heads=int(row.n_kv_head),
        embedding_dim=int(row.n_embd), mlp_hidden_dim=int(row.n_expanded_embd), max_model_len=4096,
        vocab_size=int(row.vocab_size), use_gated_mlp=bool(row.use_gated_mlp), use_bias=False,
        use_qkv_bias=False, post_attn_norm=True, activation="silu", norm="rms_norm", uses_rope=True,
        num_params=1.0,
    )


def calibration_file(device: str) -> Path:
    """Where a calibrated device's fit lives: profiles/calibration.json for A100 (the first, kept where it was),
    profiles/calibration_<device>.json for the others."""
    from kvstudy.running.paths import CALIBRATION_FILE

    return CALIBRATION_FILE if device == "a100" else CALIBRATION_FILE.with_name(f"calibration_{device}.json")


def _read_measured(path: Path, required, optional=()) -> pd.DataFrame:
    """A measured Vidur CSV, its ``required`` columns present and every cell of them and of the ``optional`` ones
    present a finite number (a cell of text or an empty one named by file, column and row, in one line, before the fit
    reads it as NaN or fails on a string)."""
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DataError(f"{path}: not a readable CSV ({first}); allowed: a Vidur profiling CSV") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(f"{path}: no column(s) {', '.join(missing)}; allowed: a Vidur profiling CSV with them")
    for col in list(required) + [c for c in optional if c in df.columns]:
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = np.flatnonzero(~np.isfinite(numbers.to_numpy(dtype=float)))
        if len(bad):
            row = int(bad[0])
            raise DataError(f"{path}: column {col} has {df[col].iloc[row]!r} on line {row + 2}; "
                            f"allowed: finite numbers ({len(bad)} of {len(df)} rows are not)")
        df[col] = numbers
    return df


def load_measured_mlp(vidur_data: Path, device: str = "a100") -> pd.DataFrame:
    """Every measured MLP row of ``device`` with its model's name: columns num_tokens, tp, model, op, ms."""
    files = sorted((Path(vidur_data) / "profiling" / "compute" / device).glob("*/*/mlp.csv"))
    if not files:
        raise DataError(f"no measured profiles under {vidur_data}/profiling/compute/{device}/*/*/mlp.csv")
    frames = []
    for path in files:
        df = _read_measured(path, _ARCH_COLUMNS + ["num_tokens", "num_tensor_parallel_workers"],
                            [f"time_stats.{op}.median" for op in MLP_OPS])
        model = f"{path.parent.parent.name}/{path.parent.name}"
        for op in MLP_OPS:
            col = f"time_stats.{op}.median"
            if col not in df.columns:
                continue
            part = df[_ARCH_COLUMNS + ["num_tokens", "num_tensor_parallel_workers", col]].rename(
                columns={col: "ms", "num_tensor_parallel_workers": "tp"})
            part = part[part["ms"] > 0].assign(op=op, model=model)
            frames.append(part)
    return pd.concat(frames, ignore_index=True)


def _predict(df: pd.DataFrame, op: str, params: Dict[str, float], device: str = "a100") -> np.ndarray:
    device = DEVICES[device]
    out = np.empty(len(df))
    for (model, tp), idx in df.groupby(["model", "tp"]).groups.items():
        rows = df.loc[idx]
        arch = _arch_from_row(rows.iloc[0], model)
        flops, nbytes = op_work(arch, int(tp), rows["num_tokens"].to_numpy())[op]
        pos = df.index.get_indexer(idx)
        out[pos] = roofline_ms(flops, nbytes, device, params["c0"], params.get("eta", 0.0), params["mu"],
                               params.get("phi"))
    return out


#: The calibrated GPUs whose GEMMs are fitted with the ECM overlap term phi (gpu_model's module docstring): H100,
#: where the plain roofline misses Vidur's rows by 8.6/7.0/7.5/9.7% (pooled GEMM medians; with phi 6.6/6.4/5.2/8.1%,
#: profiles/README.md, "Why the H100 fit was weaker"). A100 keeps the roofline so that its profiles, and every A100
#: result, stay byte for byte what they were (with phi its GEMM medians would go 6.6/5.8/5.5/6.3% -> 5.9/5.0/4.7/5.4%:
#: `python bench/hardware_fit.py --device a100 --refit overlap`).
OVERLAP_FITTED = ("h100",)


def fit_mlp_ops(measured: pd.DataFrame, device: str = "a100", overlap: bool = None,
                ops=MLP_OPS) -> Dict[str, Dict[str, float]]:
    """(c0, mu[, eta[, phi]]) per operator of ``ops``; ``overlap`` (default: ``device in OVERLAP_FITTED``) fits the
    GEMMs' phi."""
    fitted = {}
    overlap_fitted = device in OVERLAP_FITTED if overlap is None else overlap
    for op in ops:
        df = measured[measured["op"] == op].reset_index(drop=True)
        gemm = op in GEMM_OPS
        overlap = gemm and overlap_fitted
        y = np.log(df["ms"].to_numpy())

        def unpack(x):
            p = {"c0": float(np.exp(x[0])), "mu": float(1 / (1 + np.exp(-x[1])))}
            if gemm:
                p["eta"] = float(1 / (1 + np.exp(-x[2])))
            if overlap:
                p["phi"] = float(1 / (1 + np.exp(-x[3])))
            return p

        def residual(x):
            return np.log(_predict(df, op, unpack(x), device)) - y

        x0 = [np.log(0.005), 1.0] + ([1.0] if gemm else []) + ([0.0] if overlap else [])
        res = least_squares(residual, x0, loss="soft_l1", f_scale=0.1)
        fitted[op] = {k: round(v, 6) for k, v in unpack(res.x).items()}
    return fitted


def mlp_errors(measured: pd.DataFrame, params: Dict[str, Dict[str, float]], device: str = "a100") -> pd.DataFrame:
    rows = []
    for op in MLP_OPS:
        df = measured[measured["op"] == op].reset_index(drop=True)
        ape = np.abs(_predict(df, op, params[op], device) / df["ms"].to_numpy() - 1) * 100
        rows.append({"op": op, "rows": len(df), "median_ape_pct": float(np.median(ape)),
                     "p90_ape_pct": float(np.percentile(ape, 90))})
    return pd.DataFrame(rows)


def load_measured_network(vidur_data: Path, device: str = "a100") -> pd.DataFrame:
    """The measured collectives of ``device``'s node types (folders ``<device>_*``)."""
    frames = []
    for path in sorted((Path(vidur_data) / "profiling" / "network").glob(f"{device}_*/*.csv")):
        kind = path.stem
        col = f"time_stats.{kind}.median"
        df = _read_measured(path, ["num_workers", "devices_per_node", "size", col])
        frames.append(pd.DataFrame({
            "node": path.parent.name, "collective": kind, "workers": df["num_workers"],
            "devices_per_node": df["devices_per_node"], "size": df["size"], "ms": df[col]}))
    if not frames:
        raise DataError(f"no measured network profiles under {vidur_data}/profiling/network/{device}_*/*.csv")
    return pd.concat(frames, ignore_index=True)


def fit_network(measured: pd.DataFrame) -> List[Dict]:
    """One (alpha, bus bandwidth) per node type, collective, workers and devices per node."""
    out = []
    for (node, kind, w, dpn), df in measured.groupby(["node", "collective", "workers", "devices_per_node"]):
        y = np.log(df["ms"].to_numpy())
        size = df["size"].to_numpy()

        def residual(x):
            return np.log(collective_ms(kind, size, int(w), np.exp(x[0]), np.exp(x[1]))) - y

        res = least_squares(residual, [np.log(0.01), np.log(100.0)], loss="soft_l1", f_scale=0.1)
        pred = collective_ms(kind, size, int(w), np.exp(res.x[0]), np.exp(res.x[1]))
        ape = np.abs(pred / df["ms"].to_numpy() - 1) * 100
        out.append({"node": node, "collective": kind, "workers": int(w), "devices_per_node": int(dpn),
                    "alpha_ms": round(float(np.exp(res.x[0])), 6), "bus_gbps": round(float(np.exp(res.x[1])), 3),
                    "median_ape_pct": round(float(np.median(ape)), 2),
                    "p90_ape_pct": round(float(np.percentile(ape, 90)), 2), "rows": int(len(df))})
    return out


def calibrate(vidur_data: Path, device: str = "a100") -> Dict:
    if device not in CALIBRATED:
        raise DataError(f"--device {device}: no measurements to calibrate on; allowed {', '.join(CALIBRATED)} "
                        f"(the others borrow a calibrated GPU's fit, kvstudy/profiles/devices.py)")
    measured = load_measured_mlp(vidur_data, device)
    params = fit_mlp_ops(measured, device)
    errors = mlp_errors(measured, params, device)
    network = fit_network(load_measured_network(vidur_data, device))
    models = ", ".join(sorted({m.split("/")[-1] for m in measured["model"]}))
    return {
        "device": device,
        "source": f"Vidur public {device.upper()} profiles (mlp.csv of {models}; all_reduce/send_recv)"
        if device != "a100" else
        "Vidur public A100 profiles (mlp.csv of Llama-2-70B, Llama-2-7B, phi-2; all_reduce/send_recv)",
        "mlp_ops": params,
        "mlp_errors": errors.round(2).to_dict(orient="records"),
        "network": network,
    }


def write_calibration(vidur_data: Path, out: Path, device: str = "a100") -> Dict:
    result = calibrate(vidur_data, device)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def load_calibration(path: Path) -> Dict:
    if not Path(path).exists():
        raise DataError(f"calibration file {path} not found; create it with `python -m kvstudy.profiles calibrate`")
    calib = json.loads(Path(path).read_text())
    check_calibration(calib, path)
    return calib


def _calibration_problem(calib) -> str:
    """What makes ``calib`` no calibration the builder can read ('' if none): the keys ``write_calibration`` writes
    and the builder reads (device, mlp_ops per operator, network's fits), each number finite and positive."""
    import math

    from kvstudy.profiles.gpu_model import GEMM_OPS, MLP_OPS

    if not isinstance(calib, dict):
        return f"a JSON {type(calib).__name__}, not an object"
    if not calib:
        return "an empty object"
    if "device" not in calib:
        return f"no 'device' (the measured GPU: {', '.join(CALIBRATED)})"
    if calib.get("device") not in CALIBRATED:
        return f"its 'device' is {calib.get('device')!r}, not one of {', '.join(CALIBRATED)}"
    ops = calib.get("mlp_ops")
    if not isinstance(ops, dict):
        return "no 'mlp_ops' object (the fitted efficiencies per operator)"
    for op in MLP_OPS:
        fit = ops.get(op)
        need = ("c0", "mu") + (("eta",) if op in GEMM_OPS else ())
        if not isinstance(fit, dict):
            return f"mlp_ops has no '{op}'"
        for key in need + tuple(k for k in ("phi",) if k in fit):
            value = fit.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                return f"mlp_ops.{op}.{key} is {value!r}, not a positive number"
    network = calib.get("network")
    if not isinstance(network, list):
        return "no 'network' list (the collectives' fits)"
    for k, fit in enumerate(network):
        fields = ("node", "collective", "workers", "devices_per_node", "alpha_ms", "bus_gbps")
        if not isinstance(fit, dict) or any(f not in fit for f in fields):
            return f"network[{k}] lacks one of {', '.join(fields)}"
        for key in ("alpha_ms", "bus_gbps"):
            value = fit[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                return f"network[{k}].{key} is {value!r}, not a number >= 0"
    return ""


def check_calibration(calib, path) -> None:
    """A calibration file the builder cannot read (an empty ``{}``, a missing operator, a number that is text), named
    in one line before any profile is written."""
    problem = _calibration_problem(calib)
    if problem:
        raise DataError(f"calibration file {path}: {problem}; allowed: the JSON `python -m kvstudy.profiles calibrate` "
                        f"writes (profiles/calibration.json)")


def op_times_from_calibration(arch: ModelArch, tp: int, n: np.ndarray, calib: Dict,
                              device: str = None) -> Dict[str, np.ndarray]:
    """MLP-block operator times from the fitted efficiencies; ``device`` (default: the calibration's own)
    applies them to another GPU's peaks, uncalibrated."""
    return mlp_op_times(arch, tp, n, DEVICES[device or calib["device"]], calib["mlp_ops"])
