"""What ``fit(compile=True)``'s traced step consists of: the operations torch.compile captures in one training step's
graph, per family, counted by the varbnn function that issued them (the innermost ``varbnn`` frame of each node's
stack trace). A graph's size drives the compile time (tracing, autograd's joint graph, inductor's code generation and
the C++ compilation of its kernels: ``step-time/compile_time.md``); the step's run time depends on the fused kernels, not on this.

Usage: python benchmarks/compile_graph.py [--model mlp] [--only SUBSTRING,...] [--top 6]
       [--out benchmarks/results/step-time/studies]

Captured with a counting backend (no code generation: seconds per family), on the CPU, where the weight noise of a
compiled step comes from :mod:`varbnn.philox` (``draws="counter"``), batch 2. Writes OUT/compile_graph[_MODEL].json
and .md.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from report import write_result  # type: ignore[import-not-found]
from step_time import MODELS  # type: ignore[import-not-found]

import varbnn
from varbnn.training.compiled import _compiled_elbo_step
from varbnn_lab.runner import describe_device, git_commit

FAMILIES: dict[str, Callable[[], tuple[varbnn.VariationalFamily, Any]]] = {
    "MeanField-reparam": lambda: (varbnn.MeanField(), None),
    "MeanField-local": lambda: (varbnn.MeanField(estimator="local"), None),
    "KTied(rank=2)-reparam": lambda: (varbnn.KTied(rank=2), None),
    "Radial-reparam (MC cross-entropy)": lambda: (varbnn.Radial(), None),
    "RadialDirectional(row)": lambda: (varbnn.RadialDirectional(grouping="row"), varbnn.RadialDirectionalPrior()),
    "RadialDirectional(double)": lambda: (varbnn.RadialDirectional(grouping="double"), varbnn.RadialDirectionalPrior()),
}
FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def count_ops(model_name: str, family: str) -> tuple[int, collections.Counter[str]]:
    """(captured operations, their count per issuing varbnn module:function) of one compiled training step."""
    spec, prior = FAMILIES[family]()
    builder, shape, _, _ = MODELS[model_name]
    model = varbnn.bayesianize(builder(), spec, prior)
    by_function: collections.Counter[str] = collections.Counter()

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        for node in gm.graph.nodes:
            if node.op in ("call_function", "call_method"):
                frames = [f for f in FRAME.findall(node.meta.get("stack_trace") or "") if "/varbnn/" in f[0]]
                if frames:
                    path, _, function = frames[-1]
                    module = path.split("/varbnn/")[-1].removesuffix(".py").replace("/", ".")
                    by_function[f"{module}.{function}"] += 1
                else:
                    by_function["(outside varbnn: the model's own layers, the loss)"] += 1
        return gm.forward

    torch._dynamo.reset()
    step = _compiled_elbo_step(model, F.cross_entropy, 1000, torch.device("cpu"), True, backend=backend)
    g = torch.Generator().manual_seed(0)
    step(torch.rand(2, *shape, generator=g), torch.randint(0, 10, (2,), generator=g), 1.0, 1)
    return sum(by_function.values()), by_function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--only", default="", help="comma-separated substrings of the family names to keep")
    parser.add_argument("--top", type=int, default=6, help="functions listed per family (default 6)")
    parser.add_argument("--out", default="benchmarks/results/step-time/studies")
    args = parser.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    families = [f for f in FAMILIES if not wanted or any(w in f for w in wanted)]
    if not families or args.top < 1:
        parser.error(f"--only must match a family of {list(FAMILIES)} and --top be >= 1")
    start = time.perf_counter()
    rows = []
    for family in families:
        total, by_function = count_ops(args.model, family)
        philox = sum(n for name, n in by_function.items() if name.startswith("philox."))
        rows.append({"family": family, "ops": total, "philox_ops": philox,
                     "by_function": dict(by_function.most_common())})  # fmt: skip
        print(f"{family}: {total} operations, {philox} of them varbnn.philox's", flush=True)
    result = {
        "name": "compile_graph",
        "command": " ".join(["python benchmarks/compile_graph.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(torch.device("cpu")),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {"model": MODELS[args.model][3], "batch": 2, "draws": "counter (varbnn.philox)", "torch": torch.__version__},
        "rows": rows,
    }
    notes = [
        f"wall time: {result['seconds']} s; {MODELS[args.model][3]}; the operations of one compiled training step's "
        "forward graph (what torch.compile captures; autograd's backward is derived from it), by the varbnn function "
        "that issued each (its innermost varbnn frame)",
    ]
    table = [
        "| family | operations | of them varbnn.philox's | the most frequent issuers |",
        "|---|---:|---:|---|",
        *[f"| {r['family']} | {r['ops']:,} | {r['philox_ops']:,} ({r['philox_ops'] / r['ops']:.0%}) | "
          + ", ".join(f"`{k}` {v}" for k, v in list(r["by_function"].items())[: args.top]) + " |" for r in rows],
    ]  # fmt: skip
    stem = "compile_graph" + ("" if args.model == "mlp" else f"_{args.model}")
    title = f"What a compiled training step's graph holds, {MODELS[args.model][3]}"
    path = write_result(args.out, stem, result, title, notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
