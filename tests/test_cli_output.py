"""Output that is not a terminal (a pipe, a file) never wraps or folds inside a figure."""

from __future__ import annotations

from portkern.cli.common import console, table


def test_long_lines_and_wide_tables_stay_whole_off_a_terminal(capsys):
    out = console()
    assert not out.is_terminal
    line = "gemm_bias_relu: " + ",".join(f"0=cpu:v1:{i}x128x0,8x32x0,0x0x4" for i in range(8)) + "  (0.386 -> 0.268 ms, 1.44x)"
    out.print(line)
    cells = [f"{'k' * 40}", "cpu:" + "f" * 150, "0.386 -> 0.268 ms"]
    out.print(table("a title longer than the table it names, which must not wrap either", ["kernel", "device", "time"], [cells]))
    text = capsys.readouterr().out
    assert line + "\n" in text
    assert "a title longer than the table it names, which must not wrap either\n" in text
    assert any(all(cell in row for cell in cells) for row in text.splitlines())
