"""The container image: Dockerfile and .dockerignore rules, and that its context holds the whole package."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

from tests.manifests.helpers import REPO, render_variant

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _base_image() -> str:
    args = dict(re.match(r"(\w+)=(\S+)", rest).groups() for word, rest in _instructions()
                if word == "ARG" and "=" in rest)
    return args["PYTHON_IMAGE"]


def test_build_is_multi_stage_on_a_pinned_python_base() -> None:
    stages = _stages()
    assert len(stages) >= 2
    base = _base_image()
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    for stage in stages:
        source = stage[0][1].split()[0]
        assert source in ("${PYTHON_IMAGE}", base), f"stage FROM {source} is not the pinned base"


def test_runtime_stage_runs_as_the_manifests_non_root_user() -> None:
    final = _stages()[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid (runAsNonRoot can verify it)"
    deployment = next(o for o in render_variant("webhook") if o["kind"] == "Deployment")
    pod_context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_context["runAsUser"] == int(uid)
    assert not gid or pod_context["runAsGroup"] == int(gid)


def test_entrypoint_is_gpugate_serve_and_the_webhook_passes_only_flags() -> None:
    final = _stages()[-1]
    [entrypoint] = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    assert entrypoint == ["gpugate", "serve"]
    deployment = next(o for o in render_variant("webhook") if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and all(arg.startswith("--") for arg in container["args"])


def test_runtime_stage_copies_only_the_built_environment() -> None:
    final = _stages()[-1]
    copies = [rest for word, rest in final if word in ("COPY", "ADD")]
    assert copies and all(rest.startswith("--from=") for rest in copies), copies


def _copied_sources() -> set[str]:
    sources = set()
    for word, rest in _stages()[0]:
        if word == "COPY" and not rest.startswith("--from="):
            *srcs, _dest = rest.split()
            sources.update(s.rstrip("/") for s in srcs)
    return sources


def _glob_regex(pattern: str) -> str:
    """Docker's pattern syntax: ``*`` within one path element, ``**/`` across any number of them."""
    out, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out, index = out + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            out, index = out + ".*", index + 2
        elif pattern[index] == "*":
            out, index = out + "[^/]*", index + 1
        elif pattern[index] == "?":
            out, index = out + "[^/]", index + 1
        else:
            out, index = out + re.escape(pattern[index]), index + 1
    return out


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides; '!' re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!").strip("/"))
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def _repo_files() -> list[str]:
    """Tracked files (git), or every file of an unpacked tarball when there is no .git."""
    proc = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.split()
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file() and ".git" not in p.parts]


def test_dockerignore_lets_through_only_what_the_build_copies() -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "an allow-list keeps tests, manifests and data out of the build context"
    tracked = _repo_files()
    sent = {path for path in tracked if not _ignored(path, patterns)}
    assert sent, "nothing would be sent to the build"
    assert {path.split("/")[0] for path in sent} <= _copied_sources()
    assert not any(part in ("tests", "manifests", "policies") for path in sent for part in path.split("/")[:1])
    assert not any("__pycache__" in path for path in sent)
    assert _ignored("webhook/__pycache__/x.pyc", patterns) and not _ignored("webhook/cli.py", patterns)


def _setuptools_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_python_package_in_the_context_is_listed_for_the_wheel() -> None:
    """pyproject names its packages; a package it does not name is silently missing from the image."""
    listed = set(_setuptools_config()["packages"])
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "webhook").rglob("__init__.py")
               if "__pycache__" not in init.parts}
    modules_outside = [p for p in (REPO / "webhook").rglob("*.py")
                       if not (p.parent / "__init__.py").is_file() and "__pycache__" not in p.parts]
    assert on_disk <= listed, f"packages missing from [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert modules_outside == [], "Python files outside a package never reach the wheel"


def test_package_data_files_are_covered_by_package_data_globs() -> None:
    """Non-Python files inside a package reach the image only through [tool.setuptools.package-data]."""
    package_data = _setuptools_config().get("package-data", {})
    uncovered = []
    for path in (REPO / "webhook").rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package_dir = path.parent
        while not (package_dir / "__init__.py").is_file():
            package_dir = package_dir.parent
        package = ".".join(package_dir.relative_to(REPO).parts)
        relative = str(path.relative_to(package_dir))
        globs = package_data.get(package, []) + package_data.get("*", [])
        # setuptools globs: '*' within one folder, '**' across folders.
        if not any(re.fullmatch(_glob_regex(g), relative) for g in globs):
            uncovered.append(str(path.relative_to(REPO)))
    assert uncovered == [], f"not packaged (add to package-data): {uncovered}"
