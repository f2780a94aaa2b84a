"""The command line's progress: where stderr is no terminal (a log file), plain lines, never a bar's redraws."""
import io

from pope_fast.progress import labelled_bars


def test_labelled_bars_write_one_plain_line_per_label_to_a_log():
    """`bench > log 2>&1` had its bars' carriage returns and cursor-up escapes in the file: into a stream that is no
    terminal each label writes one line once its count is done, and nothing before."""
    log = io.StringIO()
    with labelled_bars(log) as progress:
        progress("llava pope-fast", 4, 6)
        assert log.getvalue() == ""
        progress("llava pope-fast", 2, 6)
        progress("llava reference", 6, 6)
    assert log.getvalue() == "llava pope-fast: 6 done\nllava reference: 6 done\n"
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
