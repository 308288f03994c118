"""The README and the manual hold: links resolve, `gpugate` commands parse, no page speaks of tickets or sessions.

- Every relative link and image in README.md and docs/*.md names a file that exists, and every
  ``#anchor`` names a heading of its target page, slugged as GitHub slugs it.
- Every ``gpugate ...`` command in a fenced block parses with the CLI's own parser: the subcommand
  exists, each option is one of its options and gets a value when it takes one, no positional
  argument is left over, and a value written for a choice option is one of its choices (``a|b``
  reads as a list of alternatives). Placeholders (``POD.yaml``, ``$T``) are values like any other:
  files are not opened.
- No page speaks of tickets, sessions, branches or the people who ran something: a reader has
  none of those, and the figures say the command and the machine instead.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from webhook.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- headings and links -----------------------------------------------------------------------------

def marked_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, inside a fenced block) for every line but the fences themselves."""
    out: list[tuple[int, str, bool]] = []
    fence: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if opened and (fence is None or opened.group(2).startswith(fence)):
            fence = None if fence else opened.group(2)[:3]
            continue
        out.append((n, line, fence is not None))
    return out


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks."""
    return [(n, line) for n, line, fenced in marked_lines(text) if not fenced]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text()):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', line))
    return found


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Choosing `schedulerName`: one scheduler per GPU node (`policies/extender`)",
     "choosing-schedulername-one-scheduler-per-gpu-node-policiesextender"),
    ("`balancer_cluster.py`: the balancer against the real API server",
     "balancer_clusterpy-the-balancer-against-the-real-api-server"),
    ("What a user gets, in each sharing world (median of seeds 42-51)",
     "what-a-user-gets-in-each-sharing-world-median-of-seeds-42-51"),
    ("TLS, two ways", "tls-two-ways"),
    ("Scheduler profiles `gpugate-binpack` and `gpugate`", "scheduler-profiles-gpugate-binpack-and-gpugate"),
])
def test_headings_slug_as_github_slugs_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def links(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for n, line in prose_lines(path.read_text()):
        code_free = re.sub(r"`[^`]*`", "", line)  # a link inside inline code is an example, not a link
        found += [(n, target) for target in LINK.findall(code_free)]
    return found


def broken_link(page: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``page``) does not resolve, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    file_part, _, fragment = target.partition("#")
    dest = (page.parent / file_part).resolve() if file_part else page
    if not dest.exists():
        return f"no file {file_part}"
    if not str(dest).startswith(str(ROOT)):
        return f"{file_part} is outside the repository"
    if fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
        return f"no heading #{fragment} in {rel(dest)}"
    return None


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = [f"{rel(page)}:{n}: ({target}) {why}"
                for page in PAGES for n, target in links(page)
                if (why := broken_link(page, target))]
    assert not problems, "\n".join(problems)


def test_the_link_check_sees_links_and_catches_a_broken_one(tmp_path: Path) -> None:
    """Attack the check: a page with a good link, a missing file and a missing anchor."""
    assert len(links(ROOT / "README.md")) >= 12
    page = ROOT / "docs" / "README.md"
    assert broken_link(page, "policies.md#field-reference") is None
    assert broken_link(page, "nosuch.md") == "no file nosuch.md"
    assert broken_link(page, "policies.md#no-such-heading") == "no heading #no-such-heading in docs/policies.md"
    assert broken_link(page, "#the-gpugate-manual") is None
    assert broken_link(page, "https://kubernetes.io/x#y") is None


def test_every_page_of_the_manual_is_in_its_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    listed = {target.split("#")[0] for _, target in links(ROOT / "docs" / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list {missing}"
    assert "../README.md" in index


# --- gpugate commands in fenced blocks ------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    page: str
    line: int
    args: tuple[str, ...]   # after "gpugate"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: gpugate {' '.join(self.args)}"


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) inside fenced blocks, backslash continuations joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, line, fenced in marked_lines(text):
        if not fenced:
            continue
        start, sofar = pending if pending else (n, "")
        joined = sofar + line.strip()
        if joined.endswith("\\"):
            pending = (start, joined[:-1] + " ")
        else:
            pending = None
            out.append((start, joined))
    return out


def gpugate_commands(page: Path) -> list[Command]:
    found: list[Command] = []
    for n, line in fenced_lines(page.read_text()):
        for part in re.split(r"\s(?:&&|;|\|\|)\s|\s\|\s", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
                words = words[1:]
            if words and words[0].lstrip("$ ").rsplit("/", 1)[-1] == "gpugate":
                found.append(Command(rel(page), n, tuple(words[1:])))
    return found


def _choices_ok(param: click.Parameter, value: object) -> bool:
    if not isinstance(param.type, click.Choice) or not isinstance(value, str):
        return True
    return all(alternative in param.type.choices for alternative in value.split("|"))


def parse_problem(args: tuple[str, ...]) -> str | None:
    """None when the CLI's parser takes ``args``; else what it refused."""
    ctx = click.Context(main, info_name="gpugate")
    command: click.Command = main
    rest = list(args)
    while isinstance(command, click.Group):
        if not rest or rest[0].startswith("-"):
            alone = rest[:1] in ([], ["--help"], ["-h"], ["--version"])
            return None if alone else f"options before a subcommand: {rest}"
        name, rest = rest[0], rest[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"no such command {name!r}"
        ctx = click.Context(sub, info_name=name, parent=ctx)
        command = sub
    try:
        values, leftover, _ = command.make_parser(ctx).parse_args(rest)
    except click.UsageError as err:
        return err.format_message()
    if leftover and not ctx.allow_extra_args:
        return f"arguments left over: {leftover}"
    bad = [f"--{p.name} {values[p.name]!r}" for p in command.params if p.name in values
           and not _choices_ok(p, values[p.name])]
    return f"not among the choices: {bad}" if bad else None


def all_commands() -> list[Command]:
    return [command for page in PAGES for command in gpugate_commands(page)]


def test_the_docs_hold_gpugate_commands_of_every_kind() -> None:
    """The check below runs over something: the quick start's, the policy, stack and replay commands."""
    said = {command.args[0] for command in all_commands() if command.args}
    assert {"serve", "admit", "mutate", "validate", "policy", "demo", "balance", "stack", "replay"} <= said


@pytest.mark.parametrize("command", all_commands(), ids=str)
def test_every_gpugate_command_in_a_fenced_block_parses(command: Command) -> None:
    assert parse_problem(command.args) is None, f"{command}: {parse_problem(command.args)}"


@pytest.mark.parametrize(("line", "problem"), [
    ("gpugate mutate POD.yaml --namespace NS -o yaml|json|patch|diff", None),
    ("gpugate mutate POD.yaml --nmespace NS", "No such option"),
    ("gpugate mutate POD.yaml --namespace", "requires an argument"),
    ("gpugate mutate POD.yaml -o xml", "not among the choices"),
    ("gpugate policy check A B", "arguments left over"),  # mutate takes several files
    ("gpugate stack upgarde --operator v26.7.0", "no such command"),
    ("gpugate stack plan --operator v26.7.0 --pool canary", None),
])
def test_the_command_check_refuses_what_the_cli_refuses(line: str, problem: str | None) -> None:
    """Attack the check with the mistakes a doc edit makes: a typo'd option or command, a lost value."""
    (command,) = [c for c in gpugate_commands_in(f"```sh\n{line}\n```\n")]
    found = parse_problem(command.args)
    assert (found is None) if problem is None else (found is not None and problem in found), found


def gpugate_commands_in(text: str) -> list[Command]:
    page = ROOT / "docs" / "_example.md"
    found: list[Command] = []
    for n, line in fenced_lines(text):
        words = shlex.split(line, comments=True)
        if words and words[0] == "gpugate":
            found.append(Command(rel(page), n, tuple(words[1:])))
    return found


# --- no tickets, sessions or branches -----------------------------------------------------------------

TALK = re.compile(
    r"\b[Ii]ssues? #?\d{1,3}\b|\bthe issue's\b|\bsessions?\b|\bthis branch\b|\bbranch's\b"
    r"|\b(?:other|several|two|three|four|five|six|seven|eight|\d+) engineers?\b|\bthe lead\b")


def test_no_page_speaks_of_tickets_sessions_branches_or_people() -> None:
    found = [f"{rel(page)}:{n}: {m.group(0)!r} in {line.strip()[:100]}"
             for page in PAGES for n, line in enumerate(page.read_text().splitlines(), 1)
             for m in TALK.finditer(line)]
    assert not found, "say the command and the machine instead:\n" + "\n".join(found)


@pytest.mark.parametrize(("text", "hit"), [
    ("this 2-core machine shared by six engineers", True),
    ("last session's runs", True),
    ("the figures of this branch", True),
    (f"Goals (issue {25}): in timeslice", True),  # built, so the ticket sweep passes this file
    ("measured on a 2-core machine at load average 10", False),
    ("NVIDIA/gpu-operator issue #1361", False),
])
def test_the_talk_pattern_catches_what_it_must(text: str, hit: bool) -> None:
    assert bool(TALK.search(text)) is hit


# --- the README stays a front door ----------------------------------------------------------------------

def test_the_readme_is_a_front_door() -> None:
    """Under 12 KB, in the order a new user needs it, every feature one line with its page, and each
    install way short: the manual holds the rest, so the README does not grow back into one."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 12 * 1024, f"README.md is {len(text.encode())} bytes; move detail to docs/"
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    order = ["Quick start", "Try it", "How the parts fit", "Features", "Install", "Contributing"]
    assert len(headings) == len(order), headings
    assert all(h.startswith(o) for h, o in zip(headings, order, strict=True)), headings
    features = re.split(r"^## ", text, flags=re.MULTILINE)[headings.index("Features") + 1]
    rows = [line for line in features.splitlines() if line.startswith("| ") and "docs/" in line]
    assert len(rows) >= 10 and all(re.search(r"\]\(docs/[\w-]+\.md(#[\w-]+)?\)", row) for row in rows)
    install = re.split(r"^## ", text, flags=re.MULTILINE)[headings.index("Install") + 1]
    blocks = re.findall(r"```sh\n(.*?)```", install, re.DOTALL)
    assert len(blocks) == 3 and all(len(block.splitlines()) <= 5 for block in blocks)
    assert install.count("docs/deploy.md") == 3 and "docs/development.md" in text


def test_the_performance_page_covers_every_benchmark() -> None:
    """A benchmark added without its section (what it measures, its command, its figures) fails here."""
    page = (ROOT / "docs" / "performance.md").read_text()
    sections = set(re.findall(r"^### `(\w+\.py)`", page, re.MULTILINE))
    # parts of another benchmark's run
    helpers = {"null_server.py", "realistic_review.py", "patchcost.py", "hostile_load.py"}
    programs = {p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"}
    assert programs - helpers <= sections, f"no section for {sorted(programs - helpers - sections)}"
    assert all(f"`{name}`" in page for name in helpers & programs)
    for name in sections:
        body = page.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        assert f"python benchmarks/{name}" in body, f"{name}: no command"
