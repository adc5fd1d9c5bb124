"""report.html: the card as one self-contained page a reader opens without advbench.

No script, no network: styles inline, figures as data URIs. Order is what a reader needs
first: each model's verdict and the leaderboard, then per model its curves, the worst-case
table, each attack's optimality and cost, the signs with their evidence and sources, and the
card (identity, data, environment, attacks with their parameters). Every text from the records
is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#1d1d1f;line-height:1.45;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .55em;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{padding:.5em .8em;border-radius:4px;margin:.4em 0}.fail{background:#fde8e8;border-left:5px solid #c62828}
.ok{background:#e8f5e9;border-left:5px solid #2e7d32}.remedied{background:#fff8e1;border-left:5px solid #f9a825}
.sign{margin:.6em 0;padding:.5em .8em;border-radius:4px}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;
font-size:.8em}img{max-width:100%;height:auto}code{font-size:.9em}
"""


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}%"


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return escape(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped text, columns in `numeric` right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{escape(str(c))}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict_class(model: dict[str, Any]) -> str:
    return "fail" if model["failures"] else "remedied" if model["remedied"] else "ok"


def _slug(text: str) -> str:
    return "m-" + "".join(c if c.isalnum() else "-" for c in text)


def summary(report: dict[str, Any]) -> str:
    """The verdicts of every model, then the leaderboards."""
    parts = ["<h2>Verdicts</h2>"]
    for m in report["models"]:
        parts.append(f'<div class="verdict {_verdict_class(m)}"><a href="#{_slug(m["row"])}"><b>{escape(m["row"])}'
                     f'</b></a>: {escape(m["verdict"])}</div>')
    parts.append("<h2>Leaderboard</h2><p>Model rows ranked by best-known robust accuracy at the budget (the worst "
                 "case over every attack run on them), per threat.</p>")
    for threat, rows in report["leaderboard"].items():
        parts.append(f"<h3>{escape(threat)}</h3>")
        parts.append(table(["rank", "model row", "best-known robust accuracy", "clean accuracy", "attacks",
                            "signs of failure"],
                           [(r["rank"], r["row"], _pct(r["robust_at_budget"]), _pct(r["clean_accuracy"]),
                             r["attacks"], r["failures"]) for r in rows], numeric=(0, 2, 3, 4, 5)))
    return "".join(parts)


def _threat_section(threat: dict[str, Any], figure: str) -> str:
    worst = threat["worst_case"]
    left_out = f", {threat['samples_left_out']} left out: not run by every attack" if threat["samples_left_out"] else ""
    parts = [f"<h3>{escape(threat['threat'])}</h3>",
             f'<img alt="robust accuracy vs epsilon, {escape(threat["threat"])}" src="{figure}">',
             f"<p>{threat['n_samples']} samples (ids {threat['sample_ids']['first']}–{threat['sample_ids']['last']}"
             f"{left_out}), clean accuracy {_pct(threat['clean_accuracy'])}. Best-known robust accuracy at the budget: "
             f"<b>{_pct(worst['robust_at_budget'])}</b>.</p>",
             "<h4>Worst case: who set each sample's value</h4>",
             table(["attack", "samples"], list(worst["set_by"].items()), numeric=(1,)),
             f"<h4>Optimality and cost</h4><p>Optimality = 1 − (area between the attack's curve and the worst "
             f"case's) / (area under clean accuracy), ε from 0 to {_num(worst['area_limit'])}.</p>",
             table(["attack", "knowledge", "robust accuracy at budget", "optimality", "samples at the worst case",
                    "grad evals / sample", "queries / sample", "wall s"],
                   [("worst case", "all", _pct(worst["robust_at_budget"]), "1", threat["n_samples"], "", "", ""),
                    *((a["name"], a["knowledge"], _pct(a["robust_at_budget"]), _num(a["optimality"]),
                       a["matches_worst_case"], _num(a["cost"]["grad_evals_per_sample"]),
                       _num(a["cost"]["queries_per_sample"]), _num(a["cost"]["wall_seconds"]))
                      for a in threat["attacks"])], numeric=(2, 3, 4, 5, 6, 7))]
    return "".join(parts)


def _sign(sign: dict[str, Any]) -> str:
    ids = ", ".join(map(str, sign["sample_ids"]))
    more = f" (first {len(sign['sample_ids'])} of {sign['count']})" if sign["count"] > len(sign["sample_ids"]) else ""
    evidence = [f"<li>{escape(sign['detail'])}</li>"]
    if sign["cells"]:
        evidence.append(f"<li>cells: {escape('; '.join(sign['cells']))}</li>")
    if ids:
        evidence.append(f"<li>sample ids{more}: {escape(ids)}</li>")
    level = "fail" if sign["level"] == "failure" else "remedied"
    return (f'<div class="sign {level}"><b>{escape(sign["title"])}</b> — {escape(sign["level"])}, '
            f'{escape(sign["threat"])}<ul>{"".join(evidence)}</ul><p><b>What to do:</b> {escape(sign["action"])}</p>'
            f'<p><small>Source: {escape("; ".join(sign["sources"]))}</small></p></div>')


def _card(model: dict[str, Any]) -> str:
    rows = [(f"{part}.{key}", value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            for part in ("identity", "data", "environment") for key, value in model[part].items()]
    attacks = [(t["threat"], a["name"], a["knowledge"], _num(a["eps_budget"]), a["strength_budget"], a["seed"],
                a["grad_mode"], a["judge_draws"], json.dumps(a["params"], sort_keys=True))
               for t in model["threats"] for a in t["attacks"]]
    return ("<h3>Evaluation card</h3>" + table(["field", "value"], rows) +
            table(["threat", "attack", "knowledge", "ε budget", "strength", "seed", "gradients", "votes",
                   "parameters"], attacks))


def model_section(model: dict[str, Any], figures: Sequence[str]) -> str:
    signs = "".join(_sign(s) for s in model["signs"]) or "<p>No sign of a failed evaluation.</p>"
    return (f'<h2 id="{_slug(model["row"])}">{escape(model["row"])}</h2>'
            f'<div class="verdict {_verdict_class(model)}">{escape(model["verdict"])}</div>'
            + "".join(_threat_section(t, f) for t, f in zip(model["threats"], figures))
            + f"<h3>Signs of a failed evaluation</h3>{signs}" + _card(model))


def page(report: dict[str, Any], figures: dict[str, list[str]]) -> str:
    """The whole page: `figures` holds each model row's curve figures (data URIs) in threat order."""
    body = summary(report) + "".join(model_section(m, figures[m["row"]]) for m in report["models"])
    sources = escape(", ".join(map(str, report["records"])))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>advbench report</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
            f"<body><h1>Robustness evaluation report</h1><p>{escape(report['reported_by'])}, from {sources}. "
            f"Each model row's best-known robust accuracy is the worst case over every attack run on it; "
            f"the signs say where that number should not be trusted.</p>{body}</body></html>\n")
