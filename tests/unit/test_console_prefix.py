"""One rank prefix per console line: torch prefixes tracebacks and C++ warnings in the worker, the console again."""

from __future__ import annotations

import io
import sys
import threading

from trainguard.cli.console import RankPrefixFilter, collapse_rank_prefix, single_rank_prefixes


def test_a_doubled_prefix_of_the_same_rank_is_collapsed() -> None:
    assert collapse_rank_prefix("[rank0]: [rank0]: Traceback (most recent call last):\n") == \
        "[rank0]: Traceback (most recent call last):\n"
    assert collapse_rank_prefix("[rank1]: [rank1]:[W1201 23:45:31.597 reducer.cpp:1529] Warning\n") == \
        "[rank1]: [W1201 23:45:31.597 reducer.cpp:1529] Warning\n"
    text = "[rank3]: [rank3]: a\n[rank3]: [rank3]:   File x\n"
    assert collapse_rank_prefix(text) == "[rank3]: a\n[rank3]:   File x\n"


def test_other_lines_are_left_alone() -> None:
    for line in ("[rank0]: loss 2.31\n", "[rank0]: [rank1]: a peer's line quoted\n", "trainguard: summary\n",
                 "[rank0]: see [rank0]: in the middle\n", ""):
        assert collapse_rank_prefix(line) == line


def test_the_filter_wraps_the_streams_while_the_workers_run() -> None:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        with single_rank_prefixes():
            assert isinstance(sys.stderr, RankPrefixFilter)
            threads = [threading.Thread(target=lambda: sys.stderr.write("[rank0]: [rank0]: boom\n"))
                       for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print("[rank1]: [rank1]: x", flush=True)
        assert sys.stdout is out and sys.stderr is err
    finally:
        sys.stdout, sys.stderr = saved
    assert err.getvalue() == "[rank0]: boom\n" * 4
    assert out.getvalue() == "[rank1]: x\n"
