"""classify on hostile input: user rules that would backtrack forever, FIFOs, links out of a folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainguard.classify import classify_paths, load_rules


def _classify(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    # generous timeout: the point is that it finishes at all (backtracking would take ~forever)
    return subprocess.run([sys.executable, "-m", "trainguard", "classify", *args], capture_output=True,
                          text=True, timeout=timeout)


def _one_line(err: str) -> bool:
    return len([line for line in err.splitlines() if line.strip()]) == 1 and "Traceback" not in err


def test_catastrophic_user_rule_finishes(tmp_path: Path) -> None:
    rules = tmp_path / "evil.toml"
    rules.write_text(
        "[[rule]]\nid = 'evil-kw'\ncategory = 'CPU'\nconfidence = 0.9\nkeywords = ['a']\npattern = '^(a+)+$'\n"
        "[[rule]]\nid = 'evil-nokw'\ncategory = 'CPU'\nconfidence = 0.9\npattern = '(x+x+)+y'\n")
    log = tmp_path / "x.log"
    log.write_text("a" * 45 + "!\n" + "x" * 60 + "\n" + "a" * 50 + "\n")
    r = _classify("--rules", str(rules), "--json", str(log))
    assert r.returncode == 0, r.stderr
    assert '"evil-kw"' in r.stdout  # the last line (all a's) does match


def test_unsupported_user_pattern_is_a_one_line_input_error(tmp_path: Path) -> None:
    rules = tmp_path / "backref.toml"
    rules.write_text("[[rule]]\nid = 'twice'\ncategory = 'CPU'\nconfidence = 0.9\nkeywords = ['a']\n"
                     "pattern = '(a)\\1'\n")
    log = tmp_path / "x.log"
    log.write_text("aa\n")
    r = _classify("--rules", str(rules), str(log))
    assert r.returncode == 3 and _one_line(r.stderr), r.stderr
    assert "'twice'" in r.stderr and "RE2" in r.stderr


def test_builtin_rules_still_use_python_re() -> None:
    import re

    assert all(isinstance(r.pattern, re.Pattern) for r in load_rules().rules)


def test_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    r = _classify(str(fifo))
    assert r.returncode == 3 and _one_line(r.stderr) and "not a regular file" in r.stderr
    (tmp_path / "ok.log").write_text("hello\n")
    r = _classify("--json", str(tmp_path))
    assert r.returncode == 0 and "not a regular file" in r.stdout


def test_links_out_of_a_folder_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("hello\n")
    (logs / "b.log").symlink_to(secret)
    (logs / "inside.log").symlink_to(logs / "a.log")
    (c,) = classify_paths([logs])
    assert c.category == "Unknown" and not any("TOPSECRET" in e.text for e in c.evidence)
    assert any("symbolic link to outside" in s for s in c.skipped) and c.files == 2
    # a link the user names explicitly is followed
    (c,) = classify_paths([logs / "b.log"])
    assert c.category == "Faulty GPU"
