"""Count the numpy functions and ndarray methods that saved numpy model files call.

    python docs/numpy_survey.py DIR [--json OUT]

DIR holds copies of third-party files (never committed: only the counts and the list of
repositories and paths go into docs/numpy_coverage.md). A line ``# --- driver (not traced) ---``
starts code that runs outside the traced function (data loading, parameter set-up, sampling
loops); ``# --- traced ---`` starts model code again. Calls are found by pattern, not by running
the files:

- ``np.NAME(`` and ``np.a.b(`` (numpy imported as ``np``, ``numpy`` or ``autograd.numpy``);
- names imported from scipy (``from scipy.special import expit``), counted as ``scipy.special.expit``,
  and ``scipy.x.y(`` written out;
- ``.NAME(`` for every method of ``np.ndarray``, and the attributes ``.T`` and ``.flat``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

DRIVER = "# --- driver (not traced) ---"
TRACED = "# --- traced ---"
_NP_CALL = re.compile(r"\b(?:np|numpy)\.([A-Za-z_][\w.]*)\s*\(")
_METHOD = re.compile(r"\.([A-Za-z_]\w*)\s*\(")
_ATTR = re.compile(r"\.(T|flat)\b(?!\s*\()")
_SCIPY_IMPORT = re.compile(r"from\s+(?:autograd\.)?(scipy\.[\w.]+)\s+import\s+(.+)")
_SCIPY_CALL = re.compile(r"\b(scipy\.[\w.]+)\s*\(")
_SCIPY_MODULE_ALIAS = re.compile(r"^\s*import\s+(?:autograd\.)?(scipy\.[\w.]+)\s+as\s+(\w+)", re.M)
METHODS = {m for m in dir(np.ndarray) if not m.startswith("_")}


def _scipy_names(text: str) -> dict[str, str]:
    """Local name -> scipy's full name, from ``from scipy.x import a, b as c`` lines."""
    names = {}
    for module, imported in _SCIPY_IMPORT.findall(text):
        for part in imported.split(","):
            name, _, alias = part.strip().partition(" as ")
            names[(alias or name).strip()] = f"{module}.{name.strip()}"
    for module, alias in _SCIPY_MODULE_ALIAS.findall(text):  # import scipy.stats.norm as norm: norm.logpdf(
        names[alias] = module
    return names


def count_file(path: str) -> tuple[collections.Counter, collections.Counter]:
    """(calls in model code, calls in driver code) of one saved file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    scipy_names = _scipy_names(text)
    alternatives = "|".join(map(re.escape, sorted(scipy_names, key=len, reverse=True)))
    scipy_call = re.compile(r"(?<![\w.])(" + alternatives + r")((?:\.\w+)*)\s*\(") if scipy_names else None
    model: collections.Counter = collections.Counter()
    driver: collections.Counter = collections.Counter()
    target = model
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == DRIVER:
            target = driver
            continue
        if stripped == TRACED:
            target = model
            continue
        if stripped.startswith(("import ", "from ")):
            continue
        for name in _NP_CALL.findall(line):
            target["np." + name] += 1
        for name in _SCIPY_CALL.findall(line):
            target[name] += 1
        if scipy_call is not None:
            for name, attribute in scipy_call.findall(line):
                target[scipy_names[name] + attribute] += 1
        code = _NP_CALL.sub("(", _SCIPY_CALL.sub("(", line))  # (np.x( is not a method call)
        for name in _METHOD.findall(code):
            if name in METHODS:
                target["ndarray." + name] += 1
        for name in _ATTR.findall(code):
            target["ndarray." + name] += 1
    return model, driver


def survey(folder: str) -> dict:
    """Per function: the files that call it and its calls in model and in driver code."""
    table: dict[str, dict] = {}
    files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    for name in files:
        model, driver = count_file(os.path.join(folder, name))
        for fn in set(model) | set(driver):
            row = table.setdefault(fn, {"files": 0, "model_calls": 0, "driver_calls": 0})
            row["files"] += 1
            row["model_calls"] += model[fn]
            row["driver_calls"] += driver[fn]
    return {"files": files, "functions": table}


# --- what graphc does with each function -----------------------------------------------------------

SUPPORTED, REWRITE, NOT_APPLICABLE = "supported", "error with rewrite", "not applicable"


def _logsumexp_probe(x):  # (scipy's Python functions are replaced in converted code: defs, not lambdas)
    return sys.modules["scipy.special"].logsumexp(x, axis=1, keepdims=True)


def _norm_logpdf_probe(x):
    return sys.modules["scipy.stats"].norm.logpdf(x, 0.5, 2.0)


def _empty_probe(x):  # (np.empty returns a numpy array; the traced values written into it make it traced)
    out = np.empty((3, 4))
    out[:, 1:] = x[:, 1:] * 2
    out[:, 0] = 1.0
    return out


# A probe per supported function: called on a traced float64 array of shape (3, 4) with values in
# [0.5, 1.5) (and on the numpy array itself to compare); ``check_probes`` runs each under graphc.jit.
PROBES: dict[str, Callable[[Any], Any]] = {
    "np.sum": lambda x: np.sum(x, axis=-1, keepdims=True),
    "ndarray.reshape": lambda x: x.reshape(2, -1),
    "np.exp": lambda x: np.exp(x),
    "ndarray.T": lambda x: x.T,
    "np.zeros": lambda x: np.zeros((3, 4)) + x,
    "np.zeros_like": lambda x: np.zeros_like(x),
    "ndarray.astype": lambda x: x.astype(np.float32, copy=False),
    "np.sqrt": lambda x: np.sqrt(x),
    "np.dot": lambda x: np.dot(x, x.T),
    "np.arange": lambda x: np.arange(0, 4, 2) * x[:, :2],
    "np.asarray": lambda x: np.asarray(x) * 2,
    "ndarray.dot": lambda x: x.dot(x.T),
    "ndarray.transpose": lambda x: x.transpose(1, 0),
    "np.tanh": lambda x: np.tanh(x),
    "np.where": lambda x: np.where(x > 1, x, 0.0),
    "np.log": lambda x: np.log(x),
    "np.max": lambda x: np.max(x, axis=1, keepdims=True),
    "np.power": lambda x: np.power(x, 3),
    "np.mean": lambda x: np.mean(x, axis=0),
    "np.matmul": lambda x: np.matmul(x, x.T),
    "np.transpose": lambda x: np.transpose(x, (1, 0)),
    "np.argmax": lambda x: np.argmax(x, axis=1),
    "np.ones": lambda x: np.ones((3, 1)) * x,
    "ndarray.squeeze": lambda x: x[:, :1].squeeze(-1),
    "np.array": lambda x: np.array([x[0], x[1]]),
    "np.var": lambda x: np.var(x, axis=-1, keepdims=True),
    "scipy.special.expit": lambda x: sys.modules["scipy.special"].expit(x),
    "np.maximum": lambda x: np.maximum(0, x - 1),
    "np.prod": lambda x: np.prod(x, axis=1),
    "np.repeat": lambda x: np.repeat(x, 2, axis=0),
    "np.split": lambda x: np.split(x, 2, axis=-1)[1],
    "np.stack": lambda x: np.stack([x, x], axis=-1),
    "ndarray.copy": lambda x: x.copy(),
    "ndarray.ravel": lambda x: x.ravel(),
    "np.cos": lambda x: np.cos(x),
    "np.expand_dims": lambda x: np.expand_dims(x, axis=(0, 2)),
    "np.hstack": lambda x: np.hstack([x, x]),
    "np.sin": lambda x: np.sin(x),
    "np.take_along_axis": lambda x: np.take_along_axis(x, np.argsort(x, axis=1), axis=1),
    "ndarray.sum": lambda x: x.sum(axis=(0, 1)),
    "np.abs": lambda x: np.abs(x - 1),
    "np.ceil": lambda x: np.ceil(x * 3),
    "np.concatenate": lambda x: np.concatenate([np.zeros((3, 2)), x], axis=1),
    "np.copy": lambda x: np.copy(x),
    "np.full": lambda x: np.triu(np.full((3, 4), -np.inf), k=1) + x,
    "np.outer": lambda x: np.outer(x[0], x[1]),
    "np.pad": lambda x: np.pad(x, ((0, 0), (1, 2)), "constant", constant_values=0),
    "np.triu": lambda x: np.triu(x, k=1),
    "ndarray.argmax": lambda x: x.argmax(-1, keepdims=True),
    "ndarray.mean": lambda x: (x**2).mean(-1, keepdims=True),
    "np.append": lambda x: np.append(x, x[0]),
    "np.argsort": lambda x: np.argsort(x, axis=-1),
    "np.broadcast_to": lambda x: np.broadcast_to(x[:, :, None], (3, 4, 2)),
    "np.clip": lambda x: np.clip(x, 0.7, 1.2),
    "np.identity": lambda x: np.identity(4) @ x.T,
    "np.isin": lambda x: np.isin(x, x[0]),
    "np.logaddexp": lambda x: np.logaddexp(0, -x),
    "np.ones_like": lambda x: np.ones_like(x),
    "np.reshape": lambda x: np.reshape(x, (4, 3)),
    "np.shape": lambda x: np.zeros(np.shape(x)[-1]) + x,
    "np.std": lambda x: np.std(x, axis=0, keepdims=True),
    "np.take": lambda x: np.take(x, np.argmax(x, axis=1), axis=1),
    "np.tile": lambda x: np.tile(np.identity(2), (x.shape[0], 1)) @ x[:2],
    "np.tri": lambda x: (1 - np.tri(3, 4)) * x,
    "np.convolve": lambda x: np.convolve(x[0], x[1, :3])[:4],
    "np.empty": _empty_probe,
    "np.eye": lambda x: np.eye(4)[1] * x,
    "np.isneginf": lambda x: np.isneginf(np.where(x > 1, -np.inf, x)),
    "np.isposinf": lambda x: np.isposinf(np.where(x > 1, np.inf, -np.inf)),
    "np.column_stack": lambda x: np.column_stack((x, x[:, 0])),
    "scipy.special.logsumexp": _logsumexp_probe,
    "scipy.stats.norm.logpdf": _norm_logpdf_probe,
}

# Functions without a probe: what happens to them, and why.
OTHERS: dict[str, tuple[str, str]] = {
    "ndarray.tolist": (REWRITE, "Python numbers from a traced array: TraceError naming the rewrite (keep the array)"),
    "np.add.at": (REWRITE, "in-place scatter into a numpy buffer: TraceError naming the rewrite (issue 20 item 1)"),
    "np.argpartition": (REWRITE, "TraceError; np.argsort(x, axis)[..., :k] gives the same k (sorted)"),
    "np.random.randn": (
        NOT_APPLICABLE,
        "random numbers: traced under graphc.rng_seed, else a warning and numpy's numbers (issue 20 item 4)",
    ),
    "np.random.rand": (NOT_APPLICABLE, "as np.random.randn (issue 20 item 4)"),
    "np.random.uniform": (NOT_APPLICABLE, "as np.random.randn (issue 20 item 4)"),
    "np.random.binomial": (NOT_APPLICABLE, "random numbers: a warning and numpy's numbers, frozen (issue 20 item 4)"),
    "np.random.choice": (NOT_APPLICABLE, "sampling in the generation loop, outside the traced function"),
    "np.random.seed": (NOT_APPLICABLE, "numpy's global random state (issue 20 item 4)"),
    "np.random.normal": (NOT_APPLICABLE, "as np.random.randn (issue 20 item 4)"),
    "np.random.standard_normal": (NOT_APPLICABLE, "as np.random.randn (issue 20 item 4)"),
    "np.random.shuffle": (NOT_APPLICABLE, "shuffling the data set between epochs, outside the traced function"),
}


def status(fn: str) -> tuple[str, str]:
    if fn in PROBES:
        return SUPPORTED, ""
    return OTHERS.get(fn, (REWRITE, "TraceError: 'not supported by graphc', at the line"))


def check_probes(names: list[str] | None = None) -> dict[str, str]:
    """Run each probe under graphc.jit against numpy; name -> problem (empty when all agree)."""
    import graphc

    x = np.random.default_rng(0).uniform(0.5, 1.5, (3, 4))
    problems = {}
    for name in names or sorted(PROBES):
        probe = PROBES[name]
        try:
            got, want = graphc.jit(probe)(x), probe(x)
            got, want = np.asarray(got), np.asarray(want)
            if got.shape != want.shape or got.dtype != want.dtype or not np.allclose(got, want, rtol=1e-10, atol=1e-12):
                problems[name] = f"differs: {got.dtype}{got.shape} vs numpy {want.dtype}{want.shape}"
        except Exception as exc:  # (reported, not raised: the table lists every failure)
            problems[name] = f"{type(exc).__name__}: {exc}"
    return problems


def coverage(table: dict[str, dict]) -> dict[str, float]:
    """The share of calls to supported functions: in model code, and over all calls with the driver
    code's not-applicable ones left out."""
    model = sum(r["model_calls"] for r in table.values())
    model_ok = sum(r["model_calls"] for fn, r in table.items() if status(fn)[0] == SUPPORTED)
    everything = sum(r["model_calls"] + r["driver_calls"] for fn, r in table.items() if status(fn)[0] != NOT_APPLICABLE)
    everything_ok = sum(r["model_calls"] + r["driver_calls"] for fn, r in table.items() if status(fn)[0] == SUPPORTED)
    return {"model": model_ok / model if model else 1.0, "all": everything_ok / everything if everything else 1.0}


def markdown_table(table: dict[str, dict]) -> str:
    rows = sorted(table.items(), key=lambda kv: (-kv[1]["model_calls"] - kv[1]["driver_calls"], kv[0]))
    lines = [
        "| function | used by N files | calls (model / driver) | status | note |",
        "|---|---:|---:|---|---|",
    ]
    for fn, row in rows:
        state, note = status(fn)
        lines.append(f"| `{fn}` | {row['files']} | {row['model_calls']} / {row['driver_calls']} | {state} | {note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--json", help="write the counts here")
    parser.add_argument("--markdown", action="store_true", help="print the coverage table")
    parser.add_argument("--check", action="store_true", help="run the probes of the supported functions")
    args = parser.parse_args()
    result = survey(args.folder)
    table = result["functions"]
    if args.markdown:
        print(markdown_table(table))
    else:
        for fn, row in sorted(table.items(), key=lambda kv: -kv[1]["model_calls"] - kv[1]["driver_calls"]):
            print(
                f"{fn:40} files={row['files']:3} model={row['model_calls']:4} driver={row['driver_calls']:4}  {status(fn)[0]}"
            )
    share = coverage(table)
    print(
        f"\nsupported: {share['model']:.1%} of model-code calls, {share['all']:.1%} of all calls (not applicable left out)"
    )
    if args.check:
        problems = check_probes()
        for name, problem in problems.items():
            print(f"PROBE FAILS {name}: {problem}")
        print(f"{len(PROBES) - len(problems)} of {len(PROBES)} probes agree with numpy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
