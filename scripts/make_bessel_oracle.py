"""Generate the mpmath oracle table used by tests/test_special.py and benchmarks/vmf.py.

    python scripts/make_bessel_oracle.py            # writes tests/data/bessel_oracle.json

Every row holds nu, z, log I_nu(z) and log I_{nu-1}(z) computed by mpmath at 40 significant digits and
rounded to 20. The grid is log-uniform over nu in [0.5, 1e4] and z in [1e-4, 1e5] plus hand-picked points
(nu = 0, half-integers, z = 1e-6 and 1e6 where mpmath is fast enough). A second table, "vmf", holds
log I_{d/2-1}(kappa) and log I_{d/2}(kappa) for the (d, kappa) grid of tests/test_vmf.py. It takes a few minutes: mpmath sums
about z terms of a hypergeometric series when z >> nu.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mpmath
import numpy as np

mpmath.mp.dps = 40
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "bessel_oracle.json"


def log_iv(nu: float, z: float) -> str:
    value = mpmath.besseli(mpmath.mpf(nu), mpmath.mpf(z), maxterms=10**7)
    return mpmath.nstr(mpmath.log(value), 20)


def grid() -> list[tuple[float, float]]:
    nus = sorted(set(np.round(np.logspace(np.log10(0.5), 4, 29), 6).tolist() + [1.0, 1.5, 2.0, 49.5, 4999.0, 5000.0]))
    zs = sorted(set(np.round(np.logspace(-4, 5, 37), 10).tolist()))
    points = [(nu, z) for nu in nus for z in zs]
    points += [(nu, z) for nu in (0.5, 1.0, 7.5, 100.0) for z in (1e-6, 1e6)]
    points += [(nu, 1e-6) for nu in (1000.0, 1e4)]
    return points


def main() -> None:
    rows = []
    start = time.time()
    points = grid()
    for i, (nu, z) in enumerate(points):
        rows.append({"nu": nu, "z": z, "log_iv": log_iv(nu, z), "log_iv_minus_1": log_iv(nu - 1.0, z)})
        if i % 50 == 0:
            print(f"{i}/{len(points)} {time.time() - start:.0f}s", file=sys.stderr, flush=True)
    rows += [
        {"nu": 0.0, "z": z, "log_iv": log_iv(0.0, z), "log_iv_minus_1": log_iv(-1.0, z)} for z in (1e-6, 1e-2, 1.0, 30.0, 1e4)
    ]
    # von Mises-Fisher: log I_{d/2-1}(kappa) (the normaliser) and log I_{d/2}(kappa) (for A_d = I_{d/2} / I_{d/2-1})
    vmf = []
    for d in (2, 3, 10, 100, 1000, 10000):
        for kappa in (1e-3, 1.0, 100.0, 1e5):
            vmf.append({"d": d, "kappa": kappa, "log_iv_d2m1": log_iv(d / 2 - 1, kappa), "log_iv_d2": log_iv(d / 2, kappa)})
        print(f"vmf d={d} {time.time() - start:.0f}s", file=sys.stderr, flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "generator": "scripts/make_bessel_oracle.py",
        "mpmath": mpmath.__version__,
        "dps": mpmath.mp.dps,
        "seconds": round(time.time() - start, 1),
    }
    OUT.write_text(json.dumps({"meta": meta, "rows": rows, "vmf": vmf}, indent=0) + "\n")
    print(f"wrote {len(rows)} rows to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
