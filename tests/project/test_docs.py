"""The README and docs/ stay true: commands written to run as copied after the set-up command,
links that lead somewhere, the README's example runs, and the CLI reference generated from the
parser is the one in docs/."""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.helpers import cache_of_its_own

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SETUP = "python3 -m venv .venv && .venv/bin/python -m pip install -e "


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_readme_is_a_newcomers_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move reference material into docs/"
    head = "\n".join(lines[:80])
    assert head.count(SETUP) >= 2, "both set-up commands belong in the README's first 80 lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_commands_run_as_copied_after_the_setup(page):
    """Every command in a ```sh block runs from the repository's root after the set-up command:
    the venv's programs by their path (a bare `graphc`, `python`, `pip` or `mpiexec` is not on a
    fresh machine's PATH, or is the system's)."""
    for block in _blocks(page.read_text(), "sh"):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if not command:
                continue
            assert command.startswith((".venv/bin/", "python3 -m venv .venv", "PYTHONPATH=. .venv/bin/")), (
                f"{page.name}: {line!r} does not run as copied: write it as .venv/bin/..."
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: link to {target}, which does not exist"


def test_the_readme_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    (code,) = _blocks((ROOT / "README.md").read_text(), "python")
    script = tmp_path / "example.py"
    script.write_text(code)
    exec(compile(code, str(script), "exec"), {"__name__": "__readme__"})


def test_the_cli_reference_is_generated_from_the_parser():
    from graphc.cli.reference import markdown

    assert (ROOT / "docs" / "cli_reference.md").read_text() == markdown(), (
        "docs/cli_reference.md is out of date: .venv/bin/python -m graphc.cli.reference > docs/cli_reference.md"
    )


def test_ci_runs_the_readmes_full_test_command():
    readme = (ROOT / "README.md").read_text()
    tests = [c.strip() for b in _blocks(readme, "sh") for c in b.splitlines() if c.startswith(SETUP) and "pytest" in c]
    assert tests, "the README has no test command"
    assert tests[0] in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README's test command verbatim"


def _measurements() -> dict[str, str]:
    """docs/measurements.md's sections by heading (one claim each; the heading is the anchor)."""
    text = (ROOT / "docs" / "measurements.md").read_text()
    return {s.split("\n", 1)[0].strip(): s for s in re.split(r"^## ", text, flags=re.M)[1:]}


def test_every_measurement_gives_the_command_that_measures_it():
    """Each claim in docs/measurements.md has at least one command, and each runs as copied from
    the repository's root after the set-up: the venv's programs by their path."""
    sections = _measurements()
    assert sections, "docs/measurements.md has no sections"
    for name, section in sections.items():
        commands = [line for b in _blocks(section, "sh") for line in b.splitlines() if line.strip()]
        assert commands, f"docs/measurements.md#{name} gives no command that reproduces its figure"
        for command in commands:
            assert command.startswith(".venv/bin/"), (
                f"docs/measurements.md#{name}: {command[:60]!r} does not run as copied: write it as .venv/bin/..."
            )


def test_the_code_cites_measurements_that_exist():
    sections = _measurements()
    sources = {p.resolve() for d in ("graphc", "passes", "runtime") for p in (ROOT / d).rglob("*.py")}
    assert sources
    for path in sorted(sources):
        for anchor in re.findall(r"docs/measurements\.md#([\w-]+)", path.read_text()):
            assert anchor in sections, (
                f"{path.relative_to(ROOT)} cites docs/measurements.md#{anchor}, which is not there"
            )
