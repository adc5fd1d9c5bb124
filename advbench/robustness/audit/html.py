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
.ok{background:#e8f5e9;border-left:5px solid #2e7d32}.weak{background:#e3f2fd;border-left:5px solid #1565c0}
.remedied{background:#fff8e1;border-left:5px solid #f9a825}.measured{background:#f3f3f3;border-left:5px solid #757575}
.sign{margin:.6em 0;padding:.5em .8em;border-radius:4px}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;
font-size:.8em}img{max-width:100%;height:auto}code{font-size:.9em}
"""


OPTIMALITY_NOTE = (
    "<h4>Optimality and cost</h4><p><b>AttackBench optimality</b> (Cinà et al. 2024) = 1 − (A<sub>attack</sub> − "
    "A<sub>best</sub>) / (clean accuracy · max ε − A<sub>best</sub>), A the trapezoid area over the sorted distinct "
    "break ε (the attack's clipped at the worst case's largest); 1 matches the worst case. <b>Area gap</b>: the "
    "exact area between the attack's step curve and the worst case's, ε from 0 to {limit}, over clean accuracy "
    "× {limit}; 0 matches it. A <b>gradient</b> is one forward and backward pass for one sample; a <b>forward-only "
    "query</b> is one forward pass for one sample without a gradient: for a white-box attack the predictions it "
    "checks (its verdicts, votes and the minimum-ε search), for a score- or decision-based attack every answer it "
    "asks the model for.</p>")


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


def _verdict_class(model: dict[str, Any], threat: dict[str, Any]) -> str:
    """Red when the threat's number may be too optimistic, amber when it stands but signs name weak attacks or
    remedied masking, green otherwise."""
    if not threat["verified"]:
        return "fail"
    return "remedied" if any(s["threat"] == threat["threat"] for s in model["signs"]) else "ok"


def _verdicts(model: dict[str, Any], linked: bool) -> str:
    """One coloured line per threat (the row's name linking to its section in the summary), a randomized
    row's re-judged worst case grey beneath it."""
    name = (f'<a href="#{_slug(model["row"])}"><b>{escape(model["row"])}</b></a> · ' if linked else "")
    lines = "".join(f'<div class="verdict {_verdict_class(model, t)}">{name}{escape(t["verdict"])}</div>'
                    + (f'<div class="verdict measured">{name}{escape(t["rejudged"]["line"])}</div>' if t["rejudged"] else "")
                    for t in model["threats"])
    corruption = model.get("corruption")
    return lines + (f'<div class="verdict measured">{name}{escape(corruption["line"])}</div>' if corruption else "")


def corruption_board(entries: list[dict[str, Any]]) -> str:
    """Every model's common-corruptions aggregate, as measured (no attack, so no verdict), and per corruption."""
    if not entries:
        return ""
    names = sorted({c for e in entries for c in e["corruptions"]})
    rows = [(e["dataset"], e["row"], _pct(e["clean_accuracy"]), _pct(e["mean_accuracy"]),
             *(_pct(e["corruptions"].get(c)) for c in names)) for e in entries]
    return ("<h2>Common corruptions</h2><p>Accuracy on corrupted copies of the clean inputs (<code>threat=corruptions"
            "</code>): per corruption the mean over severities 1–5, and their mean, RobustBench's common-corruptions "
            "number. No attack runs, so these are measured numbers with no verdict.</p>"
            + table(["data set", "model row", "clean accuracy", "mean over corruptions × severities", *names], rows,
                    numeric=tuple(range(2, 4 + len(names)))))


def _measure(threat: dict[str, Any]) -> str:
    return f"best-known {threat['measure']}"


def _shown(goal: str, robust: Any) -> Any:
    """An attack's share of samples left robust as the threat's number: itself, or 1 − it (the targeted ASR)."""
    return robust if robust is None or goal == "untargeted" else 1.0 - robust


def _slug(text: str) -> str:
    return "m-" + "".join(c if c.isalnum() else "-" for c in text)


def _board(threat: str, rows: list[dict[str, Any]]) -> str:
    """One threat's leaderboard: the verified rows ranked, then the flagged ones apart, marked and unranked."""
    headers = ["rank", "model row", f"best-known {rows[0]['measure']}", "clean accuracy", "attacks"]
    ranked = [(r["rank"], r["row"], _pct(r["at_budget"]), _pct(r["clean_accuracy"]), r["attacks"])
              for r in rows if r["verified"]]
    flagged = [("–", f"⚠ {r['row']}", _pct(r["at_budget"]), _pct(r["clean_accuracy"]), r["attacks"], r["failures"])
               for r in rows if not r["verified"]]
    parts = [f"<h3>{escape(threat)}</h3>",
             table(headers, ranked, numeric=(0, 2, 3, 4)) if ranked else "<p>No verified row.</p>"]
    if flagged:
        parts.append("<p><b>Not ranked</b> (⚠): rows with a sign that their number may be too optimistic, listed "
                     "apart and below every verified row.</p>")
        parts.append(table([*headers, "signs it may be too optimistic"], flagged, numeric=(2, 3, 4, 5)))
    return "".join(parts)


def summary(report: dict[str, Any]) -> str:
    """The verdicts of every model row and threat, then the leaderboards."""
    parts = ["<h2>Verdicts</h2>", *(_verdicts(m, linked=True) for m in report["models"]),
             "<h2>Leaderboard</h2><p>Per threat, the verified model rows ranked by their best-known number at the "
             "budget (the worst case over every attack run on them), most robust first; rows with a sign that "
             "the number may be too optimistic are listed apart, unranked.</p>"]
    parts += [_board(threat, rows) for threat, rows in report["leaderboard"].items()]
    return "".join(parts) + corruption_board(report.get("corruptions", []))


def _threat_section(threat: dict[str, Any], figure: str) -> str:
    worst = threat["worst_case"]
    left_out = f", {threat['samples_left_out']} left out: not run by every attack" if threat["samples_left_out"] else ""
    parts = [f"<h3>{escape(threat['threat'])}</h3>",
             f'<img alt="{escape(threat["measure"])} vs epsilon, {escape(threat["threat"])}" src="{figure}">',
             f"<p>{threat['n_samples']} samples (ids {threat['sample_ids']['first']}–{threat['sample_ids']['last']}"
             f"{left_out}), clean accuracy {_pct(threat['clean_accuracy'])}. {_measure(threat).capitalize()} at the "
             f"budget: <b>{_pct(threat['at_budget'])}</b>.</p>",
             "<h4>Worst case: who set each sample's value</h4>",
             table(["attack", "samples"], list(worst["set_by"].items()), numeric=(1,)),
             OPTIMALITY_NOTE.format(limit=_num(worst["area_limit"])),
             table(["attack", "knowledge", f"{threat['measure']} at budget", "AttackBench optimality", "area gap",
                    "samples at the worst case", "gradients / sample", "forward-only queries / sample", "wall s",
                    "weak where others covered it"],
                   [("worst case", "all", _pct(threat["at_budget"]), "1", "0", threat["n_samples"], "", "", "", ""),
                    *((a["name"], a["knowledge"], _pct(_shown(threat["goal"], a["robust_at_budget"])),
                       _num(a["attackbench_optimality"]), _num(a["area_gap"]), a["matches_worst_case"],
                       _num(a["cost"]["grad_evals_per_sample"]), _num(a["cost"]["queries_per_sample"]),
                       _num(a["cost"]["wall_seconds"]), ", ".join(a["weak_signs"]))
                      for a in threat["attacks"])], numeric=(2, 3, 4, 5, 6, 7, 8))]
    return "".join(parts)


LEVELS = {"failure": "the number may be too optimistic", "weak_attack": "an attack weak where others covered it",
          "remedied": "a cause of masking, remedied"}


def _sign(sign: dict[str, Any]) -> str:
    ids = ", ".join(map(str, sign["sample_ids"]))
    more = f" (first {len(sign['sample_ids'])} of {sign['count']})" if sign["count"] > len(sign["sample_ids"]) else ""
    evidence = [f"<li>{escape(sign['detail'])}</li>"]
    if sign["cells"]:
        evidence.append(f"<li>cells: {escape('; '.join(sign['cells']))}</li>")
    if ids:
        evidence.append(f"<li>sample ids{more}: {escape(ids)}</li>")
    level = {"failure": "fail", "weak_attack": "weak"}.get(sign["level"], "remedied")
    what = LEVELS.get(sign["level"], sign["level"])
    return (f'<div class="sign {level}"><b>{escape(sign["title"])}</b> — {escape(what)}, '
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
    return (f'<h2 id="{_slug(model["row"])}">{escape(model["row"])}</h2>' + _verdicts(model, linked=False)
            + "".join(_threat_section(t, f) for t, f in zip(model["threats"], figures))
            + f"<h3>Signs of a failed evaluation</h3>{signs}" + _card(model))


def page(report: dict[str, Any], figures: dict[str, list[str]]) -> str:
    """The whole page: `figures` holds each model row's curve figures (data URIs) in threat order."""
    body = summary(report) + "".join(model_section(m, figures[m["row"]]) for m in report["models"])
    sources = escape(", ".join(map(str, report["records"])))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>advbench report</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
            f"<body><h1>Robustness evaluation report</h1><p>{escape(report['reported_by'])}, from {sources}. "
            f"Each model row's best-known number per threat (robust accuracy untargeted, targeted ASR targeted) is "
            f"the worst case over every attack run on it; the signs say where that number may be too optimistic "
            f"and which attacks were weak where others covered them.</p>{body}</body></html>\n")
