"""A tuning run as one static HTML page (`portkern tune --report FILE.html`), its data beside it.

The page has four sections, each with one figure (a subplot per kernel),
drawn with matplotlib (the `report` extra) and embedded as SVG: the best
time found so far against the candidates evaluated, each candidate's time,
the chosen config against the compiler's default (the whole kernel, timed
side by side), and the per-dispatch profile (`tuner.profile`) of both. Times
are per runtime driver: a search ranks some stages on the one-thread driver,
and those times are not the deployed driver's. The run's data (the `tune
--json` output with the profiles) is written beside the page as
`FILE.json` and embedded in it.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from portkern.base.errors import TuningError, one_line

#: The page's sections: id, heading, what its figure shows.
SECTIONS = (
    ("search", "Best so far", "The fastest candidate found so far against the candidates evaluated, per runtime driver; "
     "dashed: the kernel at the compiler's default (deployed driver)."),
    ("candidates", "Time per candidate", "Each candidate's kernel call time in the order evaluated, per runtime driver; "
     "crosses on the axis: candidates that failed, computed wrong numbers, or were duplicates (not timed)."),
    ("chosen", "Chosen config against the default", "The whole kernel at the compiler's default and at the chosen config, timed side by side."),
    ("profile", "Per-dispatch profile", "Each dispatch timed alone (its time in one kernel call), at the default and at the chosen config, "
     "beside the whole kernel call."),
)
#: Colours per runtime driver and per config role.
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")
_FAILED = "tab:red"


def check(path: Path) -> None:
    """TuningError unless a page can be drawn (matplotlib, the `report` extra, is installed) and
    named `path` (not a `.json` name: the data goes there; not a device or a pipe: the data would
    go to a new file beside it, such as /dev/null.json)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TuningError("--report draws its plots with matplotlib, which is not installed: pip install 'portkern[report]'") from None
    if path.suffix == ".json":
        raise TuningError(f"--report {path}: the page's name must not end in .json (its data is written beside it as .json)")
    if path.exists() and not path.is_file():
        raise TuningError(f"--report {path}: not a regular file: the page is written to a file, its data beside it as .json")


def write(path: Path, data: dict[str, Any]) -> Path:
    """The page for a tuning run's `data` (`tune --json`'s, with `profiles`) written to `path`,
    and the data to `path` with the suffix `.json` (returned); TuningError where they cannot be written."""
    check(path)
    beside = path.with_suffix(".json")
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    page = render(data, text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        beside.write_text(text + "\n", encoding="utf-8")
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise TuningError(f"cannot write the report {path}: {one_line(exc, limit=300)}") from None
    return beside


def render(data: dict[str, Any], text: str | None = None) -> str:
    """The HTML page of a tuning run's data (`text`: the data as JSON, embedded in the page)."""
    kernels = data.get("kernels", [])
    profiles = {p["kernel"]: p for p in data.get("profiles", []) if "configs" in p}
    figures = {
        "search": _search_figure(kernels),
        "candidates": _candidates_figure(kernels),
        "chosen": _chosen_figure(kernels),
        "profile": _profile_figure(kernels, profiles),
    }
    embedded = (text if text is not None else json.dumps(data, sort_keys=True, default=str)).replace("</", "<\\/")
    title = f"portkern tune: {data.get('strategy', '')} on {data.get('device', '')}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}"
        "td.config{font-family:monospace;word-break:break-all}img{max-width:100%}</style>",
        "</head><body>",
        f"<h1>{_e(title)}</h1>",
        _summary(kernels, data.get("errors", [])),
    ]
    for key, heading, caption in SECTIONS:
        parts += [
            f'<section id="{key}"><h2>{_e(heading)}</h2>',
            f'<figure><img alt="{_e(heading)}" src="data:image/svg+xml;base64,{figures[key]}"><figcaption>{_e(caption)}</figcaption></figure>',
        ]
        if key == "candidates":
            parts.append(_candidate_table(kernels))
        if key == "profile":
            parts.append(_profile_table(profiles, data.get("profiles", [])))
        parts.append("</section>")
    parts += [f'<script type="application/json" id="portkern-tune-data">{embedded}</script>', "</body></html>"]
    return "\n".join(parts) + "\n"


# --- figures ----------------------------------------------------------------------------------


def _figure(rows: int):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 2.8 * max(1, rows)), layout="constrained")
    return figure, [figure.add_subplot(max(1, rows), 1, i + 1) for i in range(max(1, rows))]


def _svg(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _drivers(kernel: dict) -> list[str]:
    return sorted({driver for e in kernel.get("evaluations", []) for driver in e.get("timings", {})})


def _ms(value: float | None) -> float:
    return value * 1e3 if value else math.nan


def _empty(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _search_figure(kernels: list[dict]) -> str:
    from matplotlib.ticker import MaxNLocator

    figure, axes = _figure(len(kernels))
    for kernel, ax in zip(kernels, axes):
        evaluations = kernel.get("evaluations", [])
        ax.set_title(kernel["kernel"], loc="left")
        if not evaluations:
            _empty(ax, f"no candidate evaluated in this run (result from: {kernel.get('source', '')})")
            continue
        for colour, driver in zip(_COLOURS, _drivers(kernel)):
            best, xs, ys = math.inf, [], []
            for number, e in enumerate(evaluations, 1):
                timing = e.get("timings", {}).get(driver)
                if timing:
                    best = min(best, timing["min_s"])
                if best < math.inf:
                    xs.append(number)
                    ys.append(best * 1e3)
            ax.step(xs, ys, where="post", color=colour, label=f"best so far ({driver})")
        if kernel.get("default_s"):
            ax.axhline(_ms(kernel["default_s"]), color="grey", linestyle="--", label="default")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("candidates evaluated")
        ax.set_ylabel("ms per kernel call")
        ax.legend(loc="upper right", fontsize="small")
    return _svg(figure)


def _candidates_figure(kernels: list[dict]) -> str:
    from matplotlib.ticker import MaxNLocator

    figure, axes = _figure(len(kernels))
    for kernel, ax in zip(kernels, axes):
        evaluations = kernel.get("evaluations", [])
        ax.set_title(kernel["kernel"], loc="left")
        if not evaluations:
            _empty(ax, "no candidate evaluated in this run")
            continue
        for colour, driver in zip(_COLOURS, _drivers(kernel)):
            points = [(n, e["timings"][driver]["min_s"] * 1e3) for n, e in enumerate(evaluations, 1) if driver in e.get("timings", {})]
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=14, color=colour, label=driver)
        untimed = [n for n, e in enumerate(evaluations, 1) if not e.get("timings")]
        if untimed:
            ax.scatter(untimed, [0.0] * len(untimed), marker="x", color=_FAILED, label="failed, wrong or duplicate", clip_on=False)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("candidate (order evaluated)")
        ax.set_ylabel("ms per kernel call")
        ax.legend(loc="upper right", fontsize="small")
    return _svg(figure)


def _chosen_figure(kernels: list[dict]) -> str:
    figure, (ax,) = _figure(1)
    names = [k["kernel"] for k in kernels]
    positions = range(len(names))
    ax.bar([p - 0.2 for p in positions], [_ms(k.get("default_s")) for k in kernels], width=0.4, color="grey", label="default")
    ax.bar([p + 0.2 for p in positions], [_ms(k.get("best_s")) for k in kernels], width=0.4, color=_COLOURS[0], label="chosen")
    for position, kernel in zip(positions, kernels):
        if kernel.get("speedup"):
            ax.annotate(f"{kernel['speedup']:.2f}x", (position + 0.2, _ms(kernel.get("best_s"))), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(list(positions), names, rotation=20 if len(names) > 4 else 0)
    ax.set_ylabel("ms per kernel call")
    ax.legend(loc="upper right", fontsize="small")
    if not kernels:
        _empty(ax, "no kernel tuned")
    return _svg(figure)


def _profile_figure(kernels: list[dict], profiles: dict[str, dict]) -> str:
    figure, axes = _figure(len(kernels))
    for kernel, ax in zip(kernels, axes):
        ax.set_title(kernel["kernel"], loc="left")
        profile = profiles.get(kernel["kernel"])
        if profile is None:
            _empty(ax, "not profiled")
            continue
        configs = profile["configs"]
        # dispatches by name: a config with module options (data tiling) may have others, numbered otherwise
        first: dict[str, int] = {}
        for config in configs:
            for d in config["dispatches"]:
                first.setdefault(d["name"], d["index"])
        names = list(first)
        labels = [f"{first[name]}: {_short(name)}" for name in names] + ["sum of dispatches", "whole kernel call"]
        height = 0.8 / max(1, len(configs))
        for offset, (colour, config) in enumerate(zip(("grey", *_COLOURS), configs)):
            by_name = {d["name"]: d for d in config["dispatches"]}
            values = [_ms(by_name[name]["time_s"]) if name in by_name else math.nan for name in names]
            values += [_ms(config.get("sum_s")), _ms(config.get("whole_s"))]
            ax.barh([i + offset * height for i in range(len(labels))], values, height=height, color=colour, label=config["role"])
        ax.set_yticks([i + height * (len(configs) - 1) / 2 for i in range(len(labels))], labels, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("ms per kernel call")
        ax.legend(loc="lower right", fontsize="small")
    return _svg(figure)


def _short(name: str, limit: int = 40) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


# --- tables -----------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def _table(columns: list[str], rows: list[list[object]], config_column: int | None = None) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=config" if i == config_column else ""}>{_e(v)}</td>' for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary(kernels: list[dict], errors: list[dict]) -> str:
    rows = [
        [k["kernel"], k["config"], _fmt(k.get("default_s")), _fmt(k.get("best_s")), f"{k['speedup']:.2f}x" if k.get("speedup") else "-",
         len(k.get("evaluations", [])), k.get("source", ""), k.get("note", "")]
        for k in kernels
    ]
    text = _table(["kernel", "chosen config", "default ms", "chosen ms", "speedup", "candidates", "from", "note"], rows, config_column=1)
    for error in errors:
        text += f"<p>{_e(error.get('kernel'))}: not tuned: {_e(error.get('type'))}: {_e(error.get('message'))}</p>"
    return text


def _candidate_table(kernels: list[dict]) -> str:
    drivers = sorted({d for k in kernels for d in _drivers(k)})
    rows = [
        [k["kernel"], number, e["config"], e["status"], *[_fmt(e.get("timings", {}).get(d, {}).get("min_s")) for d in drivers],
         e.get("error") or e.get("duplicate_of", "")]
        for k in kernels for number, e in enumerate(k.get("evaluations", []), 1)
    ]
    return _table(["kernel", "#", "config", "status", *[f"ms ({d})" for d in drivers], "why"], rows, config_column=2)


def _profile_table(profiles: dict[str, dict], listed: list[dict]) -> str:
    rows = []
    for profile in profiles.values():
        for config in profile["configs"]:
            for d in config["dispatches"]:
                rows.append([profile["kernel"], config["role"], d["index"], d["name"], d["calls"], _fmt(d["time_s"]),
                             f"{d['share']:.1%}" if d.get("share") is not None else "-", d["note"]])
            rows.append([profile["kernel"], config["role"], "", "sum of dispatches / whole call", "", f"{_fmt(config.get('sum_s'))} / {_fmt(config.get('whole_s'))}", "", config["note"]])
    text = _table(["kernel", "config", "dispatch", "name", "calls", "ms in kernel", "share", "note"], rows)
    for failed in listed:
        if "error" in failed:
            text += f"<p>{_e(failed['kernel'])}: not profiled: {_e(failed['error'])}</p>"
    return text
