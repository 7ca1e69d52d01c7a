"""jobs.demo_report's HTML report, rendered by real headless Chromium: the screenshot shows the
three charts (their data colours are on it, which a broken or missing image would not give) and
is not blank; a blank page's screenshot is detected as blank, so the check can fail."""

from __future__ import annotations

import base64
import io
import re
from datetime import datetime, timedelta, timezone

import pytest
from PIL import Image

from jobs.demo_report import LAG_COLOR, SINK_COLOR, SOURCE_COLOR, batch_rates, lag_series, write_report
from tests.helpers.chromium import ChromiumError, color_pixels, is_blank, measure, screenshot

START = datetime(2025, 11, 25, 17, 0, 0, tzinfo=timezone.utc)
# Per chart, how many pixels of its data colour the screenshot must show: a fraction of what the
# synthetic data below draws (bars of ~70 x 50..250 pixels each; a 2.5-pixel line ~900 wide).
MIN_BAR_PIXELS, MIN_LINE_PIXELS = 5_000, 800


def _progress(batch_id: int, rows: int, trigger_ms: int, at: datetime, source: str, sink: str) -> dict:
    """A StreamingQueryProgress dict as ``query.recentProgress`` gives it (Spark 4)."""
    seconds = trigger_ms / 1000
    return {
        "id": "5c1f8a52-6f5e-4d1b-9a3e-0d7c1e2b3a4f", "runId": "0b7e3c1d-2a4f-4e5b-8c6d-7e8f9a0b1c2d",
        "name": None, "timestamp": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "batchId": batch_id, "batchDuration": trigger_ms, "numInputRows": rows,
        "inputRowsPerSecond": rows / (seconds + 0.35), "processedRowsPerSecond": rows / seconds if seconds else 0.0,
        "durationMs": {"addBatch": int(trigger_ms * 0.8), "commitOffsets": 12, "getBatch": 0, "latestOffset": 3,
                       "queryPlanning": 9, "triggerExecution": trigger_ms, "walCommit": 15},
        "stateOperators": [],
        "sources": [{"description": source, "startOffset": None, "endOffset": None, "numInputRows": rows}],
        "sink": {"description": sink, "numOutputRows": -1},
    }


def _sink_batches() -> list[dict]:
    """10 micro-batches of 20,000 events written to llog, 0.8 to 2.5 s each."""
    millis = [2500, 1400, 1100, 950, 900, 1200, 800, 870, 1000, 930]
    return [_progress(i, 20_000, ms, START + timedelta(seconds=1.2 * i), "RateStreamV2[rowsPerBatch=20000]",
                      "llog[topic=events]") for i, ms in enumerate(millis)]


def _source_batches() -> list[dict]:
    """The llog -> Delta job: 200,000 events in batches of at most 60,000."""
    sizes, millis = [60_000, 60_000, 60_000, 20_000], [4200, 2600, 2400, 1100]
    return [_progress(i, n, ms, START + timedelta(seconds=14 + 3 * i), "llog[events]", "DeltaSink[events-delta]")
            for i, (n, ms) in enumerate(zip(sizes, millis))]


def _lag_samples() -> list[tuple]:
    """Every second for 24 s: the group's lag over 4 partitions grows while the events are written
    (20,000 per 1.2 s), then drains while the Delta job reads them."""
    samples = []
    for second in range(25):
        written = min(200_000, int(second / 1.2 * 20_000))
        consumed = 0 if second < 14 else min(200_000, (second - 14) * 25_000)
        lag = written - consumed
        shares = [lag * w // 100 for w in (31, 27, 23)]  # the partitioner spreads keys unevenly
        per_partition = {("events", p): n for p, n in enumerate([*shares, lag - sum(shares)])}
        samples.append((START + timedelta(seconds=second), lag, per_partition))
    return samples


SUMMARY = {"records written (core writer)": 30_000, "events streamed to llog": 200_000, "rows in Delta": 200_000,
           "quarantined rows": 0, "group": "llog-demo-to-delta", "run time (s)": 41.25}


def _embedded_pngs(html: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(data)))
            for data in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def test_screenshot_shows_every_chart(tmp_path):
    report = write_report(tmp_path / "demo" / "report.html", _sink_batches(), _source_batches(), _lag_samples(),
                          summary=SUMMARY)
    html = report.read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html  # self-contained
    assert [image.size for image in _embedded_pngs(html)] == [(1000, 340)] * 3

    png = screenshot(report, tmp_path / "report.png")

    m = measure(png)
    assert (m.width, m.height) == (1200, 1600)
    assert not is_blank(png), m
    assert color_pixels(png, SINK_COLOR) >= MIN_BAR_PIXELS
    assert color_pixels(png, SOURCE_COLOR) >= MIN_BAR_PIXELS
    assert color_pixels(png, LAG_COLOR) >= MIN_LINE_PIXELS


def test_broken_images_do_not_pass_for_charts(tmp_path):
    """The colour check sees the decoded images: the same page with their data corrupted shows
    none of the charts' colours (while its title and table still make it non-blank)."""
    report = write_report(tmp_path / "report.html", _sink_batches(), _source_batches(), _lag_samples(),
                          summary=SUMMARY)
    broken = tmp_path / "broken.html"
    broken.write_text(re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,bm90IGEgcG5n", report.read_text()))

    png = screenshot(broken, tmp_path / "broken.png")

    assert not is_blank(png)
    assert [color_pixels(png, c) for c in (SINK_COLOR, SOURCE_COLOR, LAG_COLOR)] == [0, 0, 0]


def test_blank_page_is_detected_as_blank(tmp_path):
    page = tmp_path / "blank.html"
    page.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")

    png = screenshot(page, tmp_path / "blank.png", width=800, height=600)

    assert is_blank(png)
    assert measure(png).top_color == (255, 255, 255)


def test_empty_inputs_give_charts_that_say_so(tmp_path):
    report = write_report(tmp_path / "report.html", [], [], [])
    html = report.read_text()
    images = _embedded_pngs(html)
    assert len(images) == 3 and all(image.size == (1000, 340) for image in images)
    assert html.count('alt="Sink') == 1 and "no summary" in html

    png = screenshot(report, tmp_path / "report.png")

    assert not is_blank(png)  # titles and "no batches" / "no lag samples"
    assert [color_pixels(png, c) for c in (SINK_COLOR, SOURCE_COLOR, LAG_COLOR)] == [0, 0, 0]


def test_summary_table_is_escaped_and_formatted(tmp_path):
    html = write_report(tmp_path / "r.html", [], [], [], summary={"rows <in> Delta": 1234567, "ratio": 0.5,
                                                                  "note": "a & b"},
                        title="run <1>").read_text()
    assert "<title>run &lt;1&gt;</title>" in html
    assert "<th>rows &lt;in&gt; Delta</th><td>1,234,567</td>" in html
    assert "<td>0.50</td>" in html and "<td>a &amp; b</td>" in html


def test_records_per_second_is_rows_over_trigger_execution():
    batches = [_progress(0, 20_000, 2500, START, "s", "k"), _progress(1, 0, 0, START, "s", "k"),
               _progress(2, 30_000, 1500, START, "s", "k")]
    assert batch_rates(batches) == [(0, 8_000.0), (2, 20_000.0)]  # the 0 ms batch has no rate


def test_lag_samples_in_datetimes_or_seconds():
    seconds, totals, partitions = lag_series([(START, 10, {0: 4, 1: 6}), (START + timedelta(seconds=2.5), 3, {1: 3})])
    assert seconds == [0.0, 2.5] and totals == [10, 3] and partitions == {"0": [4.0, 0.0], "1": [6.0, 3.0]}
    _, _, named = lag_series([(0, 3, {("events", 10): 1, ("events", 2): 2}), (1, 0, {})])
    assert list(named) == ["events[2]", "events[10]"] and named["events[10]"] == [1.0, 0.0]
    assert lag_series([(0, 5), (1.5, 2)]) == ([0.0, 1.5], [5, 2], {})


@pytest.mark.parametrize("sink, lag, message", [
    ([{"batchId": 0, "numInputRows": 5}], [], "durationMs.triggerExecution"),
    ([None], [], "batch progress #0"),
    ([], [(0,)], "lag sample #0"),
    ([], [(0, "many")], "lag sample #0"),
    ([], [(START, 1), (2.0, 1)], "all seconds or all datetimes"),
])
def test_bad_input_is_a_clear_error(tmp_path, sink, lag, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        write_report(tmp_path / "r.html", sink, [], lag)
    assert not (tmp_path / "r.html").exists()


def test_screenshot_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no HTML file"):
        screenshot(tmp_path / "missing.html", tmp_path / "x.png")
    page = tmp_path / "p.html"
    page.write_text("<p>hi</p>")
    with pytest.raises(ChromiumError, match="took longer than"):
        screenshot(page, tmp_path / "x.png", timeout_s=0.01)
    monkeypatch.setattr("tests.helpers.chromium.CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ChromiumError, match="make debian-packages"):
        screenshot(page, tmp_path / "x.png")
