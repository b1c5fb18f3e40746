"""The bench machinery on a tiny scale, writing to a temporary file (never docs/).

Speed itself is never asserted: only that the sections say what they measured and that a
difference smaller than its spread is called "within noise", not "met".
"""

from __future__ import annotations

import argparse

import pytest

from playground.bench import suites, write_section
from playground.bench import overhead
from playground.bench import tests as suite_time
from playground.cli import main


def _result(ratio: float, low: float, high: float) -> dict:
    return {"params_m": 2.6, "ours_s": ratio, "theirs_s": 1.0, "ratio": ratio, "low": low, "high": high,
            "min": low, "max": high, "identical": True}


@pytest.mark.parametrize("median, low, high, target, want", [
    (1.02, 0.95, 1.10, 1.10, "within noise"),  # spread 0.15 > effect 0.02
    (0.80, 0.50, 1.20, 1.25, "within noise"),  # "faster than generate" inside a wide spread
    (1.05, 1.04, 1.06, 1.10, "met"),
    (1.30, 1.28, 1.33, 1.10, "missed"),
    (1.30, 1.00, 1.50, 1.10, "within noise"),
])
def test_verdict_calls_a_difference_inside_its_spread_noise(median, low, high, target, want):
    assert overhead.verdict(median, low, high, target) == want


def test_spread_is_the_interquartile_range_or_min_max_for_few_pairs():
    assert overhead.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert overhead.spread([1.3, 0.9, 1.1]) == (0.9, 1.3)


def test_table_shows_the_paired_ratio_its_spread_and_the_verdict():
    lines = overhead.table([("noisy", _result(1.02, 0.95, 1.10), 1.10), ("clean", _result(1.05, 1.04, 1.06), 1.10)])
    assert "ratio (median of pairs)" in lines[0] and "spread (IQR)" in lines[0] and "verdict" in lines[0]
    assert "| 0.950–1.100 |" in lines[2] and "within noise" in lines[2] and "| met |" not in lines[2]
    assert "| met |" in lines[3]


def test_write_section_replaces_only_its_own_section(tmp_path):
    out = tmp_path / "bench.md"
    write_section(out, "a", "first A")
    write_section(out, "b", "only B")
    write_section(out, "a", "second A")
    text = out.read_text()
    assert "second A" in text and "first A" not in text and "only B" in text
    assert text.count("<!-- bench:a -->") == 1


def test_browser_helpers_are_not_a_suite():
    assert {"overhead", "speculative", "ui"} <= set(suites())
    assert not any(s.startswith("_") for s in suites())


@pytest.mark.slow
def test_overhead_suite_writes_its_section_to_the_given_file(tmp_path, capsys):
    out = tmp_path / "bench.md"
    write_section(out, "other", "kept as it was")
    assert main(["bench", "--suite", "overhead", "--quick", "--repeats", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "kept as it was" in text
    section = text[text.index("<!-- bench:overhead -->"):text.index("<!-- /bench:overhead -->")]
    assert "ratio (median of pairs)" in section and "spread (IQR)" in section
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "M |" in ln]
    assert len(rows) == 2
    assert all(any(v in r for v in ("| within noise |", "| met |", "| missed |")) for r in rows)
    assert all(r.rstrip().endswith("| yes |") for r in rows)  # traced greedy gives generate's tokens
    assert "load average" in section


def test_why_suite_measures_each_addition_on_against_off(tmp_path):
    out = tmp_path / "bench.md"
    assert main(["bench", "--suite", "why", "--quick", "--repeats", "1", "--out", str(out)]) == 0
    text = out.read_text()
    section = text[text.index("<!-- bench:why -->"):text.index("<!-- /bench:why -->")]
    rows = [ln for ln in section.splitlines() if ln.startswith("| watch") or ln.startswith("| logit lens")
            or ln.startswith("| lens +") or ln.startswith("| sampler chain: top")]
    assert len(rows) == 4
    for r in rows:  # every addition makes the trace larger: off < on
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert float(cells[1]) < float(cells[2].split(" ")[0]), r
    assert "gradient x input" in section and "integrated gradients" in section


def test_ui_section_reports_ratio_targets_and_load_from_given_numbers():
    from playground.bench import ui

    pairs = [({"done_s": 3.0, "first_s": 0.4, "page_says_s": 2.9}, {"total_s": 1.0}),
             ({"done_s": 1.5, "first_s": 0.6, "page_says_s": 1.4}, {"total_s": 1.0})]
    lane = {"rate": 9.0, "updates": 40, "tokens": 128, "span_s": 4.3}
    slow = {"rate": 5.0, "updates": 20, "tokens": 128, "span_s": 4.0}
    streams = {2: [{"lanes": {1: lane, 2: lane}}], 6: [{"lanes": {k: (slow if k == 4 else lane) for k in range(1, 7)}}]}
    text = ui._section(argparse.Namespace(quick=True), {"title": "Speculative showdown: x", "lanes": [{}] * 5,
                                                        "max_new_tokens": 64},
                       pairs, streams, [{"s": 0.3, "took": True}, {"s": 30.0, "took": False}], [{"s": 0.8, "plots": 11, "drawn": 11, "complete": True,
                                                                                          "readable_s": 0.9, "quick": True}],
                       [1.5, 2.5], 128, 2, 60.0, "Machine: test.", cold={"done_s": 6.0},
                       back={"first_s": 2.5, "lanes": {1: {"rate": 3.0}, 2: {"rate": 4.0}}}, plain_loads=[2.0, 3.0])
    assert "**2.25 (1.50–3.00)**" in text  # the median of the paired ratios, with their range
    assert "| ≤ 2.0 | missed |" in text
    assert "Slowest lane with 6 lanes: 5.0 updates/s" in text and "(missed)" in text
    assert "load average during the suite: 1.5–2.5" in text
    # a Stop that the page swallowed (the run went on to "Done") is counted, not timed as a Stop
    assert "| 6.00 (6.0×) |" in text  # the first run after start-up against the CLI's median (1.0 s)
    assert "slowest lane 3.0 updates/s, first token after 2.50 s" in text  # pressed right after Done
    assert "navigation start → ready (s) | 2.50 (2.00–3.00) |" in text  # the page without a session
    assert "in the first HTML in 1 of 1) | 0.90 | ≤ 1.5 (issue 35) | met |" in text  # the share link's quick read
    assert "| 0.30 | ≤ 0.5 | met |" in text and "| 1 of 2 | every one | missed |" in text


def test_first_token_parts_are_differences_of_the_page_and_server_marks():
    """Each part of Run → first token is its end mark minus its start mark, on the page's clock
    (PROFILE_JS has put the server's marks there); a part with a missing mark is left out."""
    from playground.bench import ui

    prof = {"click": 100.0, "join": 180.0, "shown": 460.0, "poll": {"first_byte": 440.0},
            "page": {"flow": 150.0, "poll": 151.0, "answer": 450.0},
            "server": {"event": 200.0, "first_frame": 210.0, "resumed": 230.0, "started": 231.0,
                       "lane_prepared": 250.0, "first_step": 300.0, "published": 301.0, "ready": 420.0,
                       "answered": 425.0}}
    parts = ui.first_token_parts(prof)
    want = {"client event": 50, "request out": 30, "queue": 20, "run opened": 10, "first frame": 20, "runner": 1,
            "lane preparation": 19, "first step": 50, "publish": 1, "poll wakes": 119, "render": 5,
            "answer out": 15, "answer read": 10, "drawn": 10, "total": 360, "first poll": 51}
    assert parts == pytest.approx({k: v / 1000 for k, v in want.items()})
    # consecutive parts tile click → shown exactly
    assert sum(parts[n] for n, *_ in ui.FIRST_PARTS) == pytest.approx(parts["total"])
    del prof["server"]["ready"]
    assert "poll wakes" not in ui.first_token_parts(prof) and "render" not in ui.first_token_parts(prof)
    assert ui.first_token_parts(None) == {}


def test_ui_section_reports_the_parts_of_the_first_token():
    from playground.bench import ui

    runs = [{"total": 0.5, "queue": 0.02, "answer read": 0.2, "first poll": 0.1},
            {"total": 0.3, "queue": 0.04, "answer read": 0.1, "first poll": 0.1}]
    text = "\n".join(ui.first_parts_lines(runs, "Speculative showdown"))
    assert "| queue | the Run handler is entered" in text and "| 30 (20–40) |" in text
    assert "| answer read |" in text and "| 150 (100–200) |" in text
    assert "| **Run → first token shown** | | **400 (300–500)** |" in text
    assert "First token 0.40 s against issue 35's target of ≤ 0.4 s (met)" in text
    assert "| render |" not in text  # not measured: no row
    assert ui.first_parts_lines([{}, {}], "x") == []  # a page without the marks: no table


def test_screenshots_command_has_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["screenshots", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--out" in out and "compare-finished" in out


def test_screenshots_rejects_an_unknown_name(capsys):
    assert main(["screenshots", "--only", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_pages_own_figure_is_read_from_its_status_line():
    from playground.bench._browser import seconds_in_status

    assert seconds_in_status("Done in 4.8 s. Saved — press Share for a link.") == 4.8
    assert seconds_in_status("Stopped in 12.0 s.") == 12.0
    assert seconds_in_status("Running… 3 of 5 lanes still decoding (2.1 s)") is None


def test_the_tests_suite_reads_pytests_counts_seconds_and_slowest_tests():
    out = suite_time.parse_output(
        "....F.\n"
        "============================= slowest 3 durations =============================\n"
        "12.50s call     tests/test_a.py::test_x[1]\n"
        "194.80s call     tests/test_browser.py::test_several_people\n"
        "3.01s setup    tests/test_b.py::test_y\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/test_browser_memory.py::test_the_page - TimeoutError\n"
        "1 failed, 4005 passed, 2 skipped, 83 warnings in 1816.00s (0:30:16)\n")
    assert out["counts"] == {"failed": 1, "passed": 4005, "skipped": 2, "warnings": 83}
    assert out["seconds"] == 1816.0
    assert out["failed"] == [("tests/test_browser_memory.py::test_the_page", "TimeoutError")]
    assert [t for _s, _p, t in out["slowest"]] == ["tests/test_browser.py::test_several_people",
                                                   "tests/test_a.py::test_x[1]", "tests/test_b.py::test_y"]
    assert suite_time._verdict({"counts": out["counts"], "wall": 60.0}, 480.0).startswith("failed")
    assert suite_time._verdict({"counts": {"passed": 3}, "wall": 500.0}, 480.0) == "missed"
    assert suite_time._verdict({"counts": {"passed": 3}, "wall": 400.0}, 480.0) == "met"
    assert "tests" in suites()
