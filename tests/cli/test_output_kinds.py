"""Which existing files a command may write over (graphc/cli/common.py ``check_output_file``): a
file of the kind it writes (a plan over a plan), an empty one, nothing else without --force. The
kind is read from the entries a file starts with when graphc laid it out (a 1,000-layer plan is
over 100 MB), from the whole document otherwise."""

from __future__ import annotations

import json

import pytest

from graphc.cli.common import check_output_file
from graphc.cli.loader import UsageError
from graphc.core.files import dump_document

PLAN = {
    "version": 2,
    "graph": {"name": "f", "hash": "0" * 32, "nodes": 3},
    "mesh": {"axes": {"dp": 2}},
    "nodes": [{"index": k, "op": "add"} for k in range(5000)],  # past the 64 KiB head
}


def _writable(path) -> bool:
    try:
        check_output_file(str(path), "-o", "plan")
    except UsageError as exc:
        assert "refusing to overwrite" in str(exc) and str(path) in str(exc)
        return False
    return True


@pytest.mark.parametrize(
    "text",
    [
        dump_document(PLAN),  # as graphc writes it: decided by its first lines
        json.dumps(PLAN, indent=4),  # reformatted by another tool: parsed whole
        json.dumps(PLAN),  # on one line
        json.dumps({**{f"pad{k}": "x" * 100 for k in range(1000)}, **PLAN}),  # the plan's keys past the head
        dump_document(PLAN)[:100_000],  # cut short after its head: still a plan (an interrupted copy)
        "",
        "  \n",
    ],
    ids=["graphc-layout", "indented", "one-line", "keys-late", "truncated", "empty", "blank"],
)
def test_a_plan_or_an_empty_file_may_be_written_over(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert _writable(path)


@pytest.mark.parametrize(
    "text",
    [
        "my notes, not a plan\n",
        dump_document({"flops": 1e12, "link": {"bandwidth": 1e9}}),  # a machine profile
        dump_document({"version": 2, "mesh": {"axes": {}}, "nodes": [{"a": 1}]}),  # no graph hash
        dump_document({"version": 2, "graph": "f", "mesh": {}}),  # a graph that is not a record
        '{\n "version": 2,\n "graph": {"hash": "0"},\n "nodes": [\n  {"a": 1}\n ]\n}\n',  # no mesh
        dump_document({"data": [1, 2, 3]})[:-3],  # someone's truncated JSON
        "[1, 2, 3]\n",
        "{\n not json\n",
        '{\n "version": 2,,\n "graph": {"hash": "0"},\n "mesh": {}\n}\n',  # two commas: not JSON
        "[" * 100_000 + "]" * 100_000,  # nested past Python's recursion limit
    ],
    ids=[
        "text",
        "profile",
        "no-hash",
        "graph-not-record",
        "no-mesh",
        "truncated-other",
        "list",
        "broken",
        "commas",
        "deep",
    ],
)
def test_any_other_file_is_refused(tmp_path, text):
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert not _writable(path)
    assert path.read_text() == text
