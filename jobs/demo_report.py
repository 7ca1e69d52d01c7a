"""The picture of a ``make demo`` run: one self-contained HTML file (``.cache/demo/report.html``).

Three charts, PNGs drawn by matplotlib and embedded as base64 ``<img>`` (no external assets, no
JavaScript, nothing fetched from the network, so the file opens anywhere, also offline):

* **Sink: records/s per micro-batch** -- the query that writes to llog
  (``writeStream.format("llog")``): one bar per micro-batch, ``numInputRows`` divided by the
  batch's ``durationMs.triggerExecution`` in seconds (the whole trigger: planning, reading the
  input and committing to llog), so a slow commit shows as a short bar. Spark's own
  ``processedRowsPerSecond`` is the same quotient; ``inputRowsPerSecond`` is not (it divides by
  the time since the previous batch, which includes idle time between triggers).
* **Source: records/s per micro-batch** -- the query that reads from llog
  (``readStream.format("llog")``, the llog -> Delta job), computed the same way.
* **Consumer group lag over time** -- the group's total lag (records committed to llog and not
  yet committed by the group) at each sample taken during the run, with the lag of each
  partition as thin lines when the samples carry it.

Below the charts, ``summary`` (records written, rows in Delta, quarantined rows, ...) as a table.
Empty inputs still give a chart, one that says "no batches" or "no lag samples".

matplotlib is used through ``matplotlib.figure.Figure`` alone (no pyplot), so nothing opens a
display or changes the process's global backend.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

# The colours of the charts' data: fixed, so a test can find each chart in a screenshot.
SINK_COLOR = "#1f6fd1"      # blue bars
SOURCE_COLOR = "#e0701b"    # orange bars
LAG_COLOR = "#c0143c"       # crimson line of the total lag
PARTITION_COLORS = ("#8fb9a8", "#b7a3d8", "#d8c46c", "#88b4d8", "#d89ab0", "#a7c66b")  # pale per-partition lines

FIGSIZE, DPI = (10.0, 3.4), 100  # 1000 x 340 pixels: shown at their own size, not scaled by the browser


def write_report(path: str | Path, sink_batches: Sequence[Mapping], source_batches: Sequence[Mapping],
                 lag_samples: Sequence[Sequence], summary: Mapping[str, object] | None = None,
                 title: str = "llog demo") -> Path:
    """Write the report to ``path`` (parent directories created) and return its path.

    ``sink_batches`` / ``source_batches``: Spark ``StreamingQueryProgress`` dicts
    (``query.recentProgress`` items) of the query writing to llog and of the one reading from it.
    ``lag_samples``: ``(when, total_lag)`` or ``(when, total_lag, {partition: lag})`` tuples, ``when``
    in seconds since the start of the run or a ``datetime`` (all samples alike). ``summary``: the
    key facts of the run, shown as a table in the given order.
    """
    charts = [
        _rate_chart(sink_batches, "Sink (writeStream.format('llog'))", SINK_COLOR),
        _rate_chart(source_batches, "Source (readStream.format('llog'), llog -> Delta)", SOURCE_COLOR),
        _lag_chart(lag_samples),
    ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_html(title, charts, summary or {}), encoding="utf-8")
    return path


def batch_rates(batches: Iterable[Mapping]) -> list[tuple[int, float]]:
    """``(batchId, records/s)`` of every micro-batch: ``numInputRows`` / ``triggerExecution`` seconds.

    A batch whose trigger took 0 ms (an empty batch Spark finished within the millisecond) has no
    meaningful rate and is left out rather than drawn as infinite."""
    rates = []
    for i, progress in enumerate(batches):
        try:
            batch_id, rows = int(progress["batchId"]), int(progress["numInputRows"])
            millis = float(progress["durationMs"]["triggerExecution"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"batch progress #{i} is not a StreamingQueryProgress dict with batchId, numInputRows "
                             f"and durationMs.triggerExecution: {e!r} in {progress!r:.300}") from e
        if millis > 0:
            rates.append((batch_id, rows / (millis / 1000)))
    return rates


def lag_series(samples: Sequence[Sequence]) -> tuple[list[float], list[int], dict[str, list[float]]]:
    """The lag samples as ``(seconds since the first sample, total lags, {partition: lags})``;
    a partition missing from a sample counts as lag 0 there, as the group has nothing to read in
    it (or it did not exist yet)."""
    whens, totals, per_partition = [], [], []
    for i, sample in enumerate(samples):
        try:
            if isinstance(sample, (str, bytes)) or len(sample) not in (2, 3):
                raise ValueError(f"{len(sample)} items")
            lags = sample[2] if len(sample) == 3 and sample[2] is not None else {}
            per_partition.append({_partition_name(p): float(lag) for p, lag in lags.items()})
            totals.append(int(sample[1]))
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"lag sample #{i} is not (when, total_lag) or (when, total_lag, {{partition: lag}}): "
                             f"{sample!r:.200} ({e})") from e
        whens.append(sample[0])
    if all(isinstance(w, datetime) for w in whens):
        seconds = [(w - whens[0]).total_seconds() for w in whens]
    elif all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in whens):
        seconds = [float(w) for w in whens]
    else:
        raise ValueError("lag sample times must be all seconds or all datetimes, not a mix of "
                         f"{sorted({type(w).__name__ for w in whens})}")
    partitions = sorted({p for lags in per_partition for p in lags}, key=_natural)
    return seconds, totals, {p: [lags.get(p, 0.0) for lags in per_partition] for p in partitions}


def _rate_chart(batches: Sequence[Mapping], name: str, color: str) -> tuple[str, bytes]:
    from matplotlib.ticker import MaxNLocator

    rates = batch_rates(batches)
    fig, ax = _figure()
    heading = f"{name}: records/s per micro-batch"
    if not rates:
        _empty(ax, "no batches")
    else:
        ids, values = zip(*rates)
        ax.bar(ids, values, color=color, width=0.8)
        rows = sum(int(p["numInputRows"]) for p in batches)
        heading += f" ({len(batches)} batches, {rows:,} records)"
        ax.set_ylabel("records/s")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(_thousands())
    ax.set_title(heading, loc="left", fontsize=11)
    ax.set_xlabel("micro-batch (batchId)\nrecords/s = numInputRows / durationMs.triggerExecution "
                  "(the whole trigger, in seconds)" if rates else "", fontsize=9)
    return heading, _png(fig)


def _lag_chart(samples: Sequence[Sequence]) -> tuple[str, bytes]:
    seconds, totals, partitions = lag_series(samples)
    fig, ax = _figure()
    heading = "Consumer group lag over time"
    if not seconds:
        _empty(ax, "no lag samples")
    else:
        for i, (partition, lags) in enumerate(partitions.items()):
            ax.plot(seconds, lags, color=PARTITION_COLORS[i % len(PARTITION_COLORS)], linewidth=1,
                    label=partition if len(partitions) <= 12 else None)
        ax.plot(seconds, totals, color=LAG_COLOR, linewidth=2.5, marker="o" if len(seconds) <= 30 else None,
                markersize=4, label="total")
        ax.set_ylim(bottom=0)
        heading += f" (max {max(totals):,}, last {totals[-1]:,} records)"
        ax.set_xlabel("seconds since the first sample")
        ax.set_ylabel("lag (records)")
        ax.yaxis.set_major_formatter(_thousands())
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # hides no line
    ax.set_title(heading, loc="left", fontsize=11)
    return heading, _png(fig)


def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")  # room for labels of any width, and the legend
    ax = fig.add_subplot()
    ax.grid(axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=16, color="#777777", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _partition_name(key: object) -> str:
    """``events[3]`` for a ``(topic, partition)`` key, else the key as text."""
    if isinstance(key, tuple) and len(key) == 2:
        return f"{key[0]}[{key[1]}]"
    return str(key)


def _natural(name: str) -> list:
    """Partition names with their numbers in numeric order (events[2] before events[10])."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _cell(value: object) -> str:
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:,.2f}" if math.isfinite(value) else str(value)
    else:
        text = str(value)
    return html.escape(text)


def _html(title: str, charts: list[tuple[str, bytes]], summary: Mapping[str, object]) -> str:
    figures = "\n".join(
        f'<figure><img alt="{html.escape(heading)}" width="{int(FIGSIZE[0] * DPI)}" height="{int(FIGSIZE[1] * DPI)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></figure>'
        for heading, png in charts)
    rows = "\n".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in summary.items())
    table = f"<table>\n{rows}\n</table>" if rows else "<p>(no summary)</p>"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; background: #fff; }}
figure {{ margin: 0 0 16px 0; }}
img {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; margin-top: 8px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 12px; text-align: left; }}
td {{ text-align: right; font-variant-numeric: tabular-nums; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
{figures}
<h2>Summary</h2>
{table}
</body>
</html>
"""
