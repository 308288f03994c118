"""Read a folder of GPUPolicy files into a PolicySet (the file edge around ``parsing``).

One home for "which files of a folder are policies": the loader and the server's reload
watcher (``store.folder_digest``) both call ``policy_files``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from webhook.errors import PolicyLoadError
from webhook.policy import parsing
from webhook.policy.model import PolicySet

SUFFIXES = (".yaml", ".yml")
IGNORED_FILES = frozenset({"kustomization.yaml", "kustomization.yml"})


def is_policy_file(path: Path) -> bool:
    """Top-level ``*.yaml``/``*.yml``, not hidden (ConfigMap volumes keep ``..data`` there), not kustomize's."""
    return path.suffix in SUFFIXES and not path.name.startswith(".") and path.name not in IGNORED_FILES


def policy_files(folder: Path) -> list[Path]:
    """The files a folder's policy set is made of, in a stable order (symlinks followed)."""
    return sorted(entry for entry in Path(folder).iterdir() if is_policy_file(entry) and entry.is_file())


Texts = list[tuple[str, bytes]]
"""(name shown in messages, file content) of each policy file, in order."""


def load_dir(path: Path | str) -> PolicySet:
    """Every policy file at the top of ``path`` (tests/, hidden and kustomization files skipped)."""
    return parsing.parse(read_dir(path))


EMPTY_SET = ("{directory} holds no GPUPolicy; an empty set would lift every deny rule, so gpugate serve "
             "refuses it (start it with --allow-empty-policies if that is what you want)")


def require_servable(policies: PolicySet, directory: Path | str, *, allow_empty: bool = False) -> PolicySet:
    """``policies`` if ``gpugate serve`` would answer with them, else PolicyLoadError saying why.

    The one rule for "servable", used by the server's store and by ``gpugate policy check``, so a
    check that passes is a set the server loads.
    """
    if not policies.policies and not allow_empty:
        raise PolicyLoadError([EMPTY_SET.format(directory=directory)])
    return policies


def load_servable(path: Path | str, *, allow_empty: bool = False) -> PolicySet:
    """``load_dir``, then ``require_servable``: what ``gpugate serve`` would load from ``path``."""
    return require_servable(load_dir(path), path, allow_empty=allow_empty)


def read_dir(path: Path | str) -> Texts:
    """The policy files of ``path`` as (name, bytes); PolicyLoadError when the folder is unusable."""
    folder = Path(path)
    if not folder.exists():
        raise PolicyLoadError([f"{folder}: no such folder; pass the folder of GPUPolicy files"])
    if not folder.is_dir():
        raise PolicyLoadError([f"{folder}: not a folder; pass the folder of GPUPolicy files"])
    texts = []
    for file in policy_files(folder):
        try:
            texts.append((_display(file), file.read_bytes()))
        except OSError as err:
            raise PolicyLoadError([f"{_display(file)}: cannot read: {err.strerror}"]) from err
    return texts


def _display(file: Path) -> str:
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def unlisted_in_kustomization(path: Path | str) -> list[str]:
    """Problems with a folder's ``kustomization.yaml``, when it has one: each policy file it does
    not list (kustomize builds the ConfigMap the webhook mounts from the listed files only, so an
    unlisted policy passes every check here and never reaches the cluster), and each listed file
    that is missing. Empty without a kustomization file."""
    folder = Path(path)
    found = next((folder / name for name in sorted(IGNORED_FILES) if (folder / name).is_file()), None)
    if found is None:
        return []
    try:
        document = yaml.safe_load(found.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        return [f"{_display(found)}: cannot read it ({type(err).__name__})"]
    listed: set[str] = set()
    generators = document.get("configMapGenerator") if isinstance(document, dict) else None
    for generator in generators if isinstance(generators, list) else []:
        files = generator.get("files") if isinstance(generator, dict) else None
        for entry in files if isinstance(files, list) else []:
            listed.add(str(entry).rpartition("=")[2])  # "key=path" names the file after "="
    problems = [f"{_display(file)}: not listed in {found.name}'s configMapGenerator files, so kustomize leaves it "
                f"out of the ConfigMap the webhook mounts; add it there (or move it out of {_display(folder)})"
                for file in policy_files(folder) if file.name not in listed]
    problems += [f"{_display(found)}: lists {name}, which is not in {_display(folder)}"
                 for name in sorted(listed) if not (folder / name).is_file()]
    return problems
