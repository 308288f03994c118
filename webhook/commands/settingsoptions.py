"""Command options whose defaults are a settings dataclass's: the default is written once, there.

A command that hands its options to a settings object (``RunSpec``, ``BalancerSettings``,
``ServeSettings``) reads each option's default from the field it fills, and builds the object from
its options in one step (``build``), so the CLI and the code that runs without it cannot drift
apart. tests/cli checks that every such option's default is its field's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

T = TypeVar("T")


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (its factory's value for a factory field)."""
    for found in dataclasses.fields(cls):
        if found.name == name:
            if found.default is not dataclasses.MISSING:
                return found.default
            if found.default_factory is not dataclasses.MISSING:
                return found.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name!r}")


def field_option(cls: type, name: str, *decls: str, **attrs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``click.option(*decls, name, default=<cls's default for name>, **attrs)``: the option fills
    field ``name`` (its Python name is the field's, whatever its flag is spelled)."""
    return click.option(*decls, name, default=default_of(cls, name), **attrs)


def build(cls: type[T], options: Mapping[str, Any], **fixed: Any) -> T:
    """``cls`` from the options that name one of its fields (others are left to the command), plus ``fixed``."""
    names = {found.name for found in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: value for key, value in options.items() if key in names and key not in fixed}, **fixed)
