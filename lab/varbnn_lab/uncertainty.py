"""The goals of ``varbnn reproduce uncertainty-mnist`` / ``uncertainty-fmnist`` (issue 26), checked on a result's rows.

All three compare means over the seeds run (the tables give each standard error):

(a) every varbnn family's test NLL and ECE below the plain network's;
(b) the best family (lowest NLL) below plain + temperature scaling and MC dropout on NLL, and above both on OOD AUROC
    (by predictive entropy, the score every method has);
(c) the best family's NLL within 10% of the 5-member deep ensemble's, at no more than half its training time.

Training times compare only between runs of one device: where a result names the devices that trained each variant
(``variant_devices``, e.g. a page assembled from GPU and CPU runs), a row trained elsewhere than the row it is compared
with gets no time ratio, and goal (c) judges only the NLL part (its cost part is then not measured).
"""

from __future__ import annotations

from typing import Any

from varbnn_lab.baselines import BASELINES

__all__ = ["comparable_times", "goals", "goal_lines"]


def _one(rows: list[dict[str, Any]], family: str) -> dict[str, Any] | None:
    found = [r for r in rows if r.get("family") == family]
    return found[0] if found else None


def _devices_by_variant(result: dict[str, Any]) -> dict[str, frozenset[str]]:
    """Each variant label's training devices, from a result's ``variant_devices`` (empty when it has none)."""
    out: dict[str, set[str]] = {}
    for device, labels in (result.get("variant_devices") or {}).items():
        for label in labels:
            out.setdefault(label, set()).add(device)
    return {label: frozenset(devices) for label, devices in out.items()}


def _same_device(a: dict[str, Any], b: dict[str, Any], devices: dict[str, frozenset[str]] | None) -> bool:
    """Whether rows ``a`` and ``b`` were trained on one device (assumed when the result does not say)."""
    if not devices:
        return True
    da, db = devices.get(a["variant"]), devices.get(b["variant"])
    return da is None or db is None or (len(da) == 1 and da == db)


def comparable_times(
    rows: list[dict[str, Any]], variant_devices: dict[str, list[str]] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """``(rows whose training time compares with the plain row's, labels of the others)``: a row trained on another
    device than the plain network (``variant_devices``: each device's variant labels, as a result records them) is
    not comparable. Every row is, when there is no plain row or no device record."""
    plain = _one(rows, "plain")
    devices = _devices_by_variant({"variant_devices": variant_devices})
    if plain is None:
        return list(rows), []
    shown = [r for r in rows if _same_device(r, plain, devices)]
    return shown, [str(r["variant"]) for r in rows if not _same_device(r, plain, devices)]


def goals(
    rows: list[dict[str, Any]], missing: list[str] | None = None, devices: dict[str, frozenset[str]] | None = None
) -> list[tuple[str, bool | None, str]]:
    """``(goal, met, evidence)`` for goals (a), (b), (c); ``met`` is None when a row the goal needs is missing.
    ``missing``: the labels of family variants of the config without any run yet (a partial result): goal (a) is then
    not judged, and the evidence of (b) and (c) names them (their best family is the best of the rows present).
    ``devices``: each variant label's training devices; when the best family and the ensemble differ, (c) judges the
    NLL alone: ``met`` is False if the NLL misses, else None (the cost is not measured)."""
    plain, temperature = _one(rows, "plain"), _one(rows, "temperature")
    dropout, ensemble = _one(rows, "mc-dropout"), _one(rows, "ensemble")
    families = [r for r in rows if r.get("family") not in ("plain", *BASELINES)]  # the varbnn families
    out: list[tuple[str, bool | None, str]] = []
    goal_a = "(a) every family's NLL and ECE below the plain network's"
    if plain is None or not families:
        out.append((goal_a, None, "the plain row or the family rows are missing"))
    elif missing:
        out.append((goal_a, None, f"no runs yet for {', '.join(missing)}"))
    else:
        misses = [
            f"{r['variant']} (NLL {r['nll']:.4f}, ECE {r['ece']:.4f})"
            for r in families
            if not (r["nll"] < plain["nll"] and r["ece"] < plain["ece"])
        ]
        evidence = f"plain: NLL {plain['nll']:.4f}, ECE {plain['ece']:.4f}; " + (
            f"not below on both: {', '.join(misses)}" if misses else f"all {len(families)} families below on both"
        )
        out.append((goal_a, not misses, evidence))
    best = min(families, key=lambda r: r["nll"]) if families else None
    goal_b = "(b) the best family below temperature scaling and MC dropout on NLL, above both on OOD AUROC (entropy)"
    if best is None or temperature is None or dropout is None or "ood_auroc_entropy" not in best:
        out.append((goal_b, None, "a row or the OOD AUROC is missing"))
    else:
        nll_ok = best["nll"] < min(temperature["nll"], dropout["nll"])
        auroc_ok = best["ood_auroc_entropy"] > max(temperature["ood_auroc_entropy"], dropout["ood_auroc_entropy"])
        evidence = (
            f"best family {best['variant']}: NLL {best['nll']:.4f}, AUROC {best['ood_auroc_entropy']:.4f}; temperature "
            f"scaling {temperature['nll']:.4f} / {temperature['ood_auroc_entropy']:.4f}; MC dropout "
            f"{dropout['nll']:.4f} / {dropout['ood_auroc_entropy']:.4f}"
        )
        out.append((goal_b, nll_ok and auroc_ok, evidence))
    goal_c = "(c) the best family within 10% of the deep ensemble's NLL at <= half its training time"
    if best is None or ensemble is None:
        out.append((goal_c, None, "the ensemble row or the family rows are missing"))
    else:
        ratio = best["nll"] / ensemble["nll"]
        evidence = f"{best['variant']}: NLL {ratio:.2f} x the ensemble's ({best['nll']:.4f} vs {ensemble['nll']:.4f}), "
        if _same_device(best, ensemble, devices):
            cost = best["train_seconds"] / ensemble["train_seconds"]
            out.append((goal_c, ratio <= 1.1 and cost <= 0.5, evidence + f"training time {cost:.2f} x"))
        else:
            evidence += "training time not compared: the two were trained on different devices"
            out.append((goal_c, False if ratio > 1.1 else None, evidence))
    if missing:
        out = [(g, met, f"{evidence}; judged without {', '.join(missing)}") if g != goal_a else (g, met, evidence)
               for g, met, evidence in out]  # fmt: skip
    return out


def goal_lines(result: dict[str, Any]) -> list[str]:
    """The page section: the cost of every row relative to the plain network, then the goals with their verdicts."""
    rows = result["rows"]
    plain = _one(rows, "plain")
    devices = _devices_by_variant(result)
    _, other = comparable_times(rows, result.get("variant_devices"))
    lines = ["## Against the goals", ""]
    if plain is not None:
        lines += [
            "| variant | NLL | ECE | OOD AUROC (entropy) | OOD AUROC (MI) | training time / plain | prediction s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            cost = f"{r['train_seconds'] / plain['train_seconds']:.2f}" if _same_device(r, plain, devices) else "–"
            lines.append(
                f"| {r['variant']} | {r['nll']:.4f} | {r['ece']:.4f} | {r.get('ood_auroc_entropy', float('nan')):.4f} | "
                f"{r.get('ood_auroc_mi', float('nan')):.4f} | {cost} | {r.get('predict_seconds', float('nan')):.2f} |"
            )
        lines.append("")
        if other:
            lines += [
                "–: trained on another device than the plain network (see the devices above); the cost figure leaves "
                "these rows out.",
                "",
            ]
    verdict = {True: "**met**", False: "**not met**", None: "not measured"}
    present = {r.get("variant") for r in rows}
    expected = [v for v in result.get("config", {}).get("variants", []) if v.get("family") not in ("plain", *BASELINES)]
    missing = [str(v["label"]) for v in expected if v.get("label") not in present]
    lines += [f"- {goal}: {verdict[met]} ({evidence})" for goal, met, evidence in goals(rows, missing, devices)]
    lines += ["", "Means over the seeds run; the standard errors are in the table above."]
    return lines
