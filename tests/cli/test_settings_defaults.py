"""A command's option defaults are its settings dataclasses' defaults, never a second copy.

``gpugate replay``, ``serve`` and ``balance`` build their settings objects from their options; an
option whose default differed from its field's would make the CLI run something else than the same
settings built in code (a benchmark, a test, the balancer's file).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import click
import pytest

from webhook.balancer.settings import BalancerSettings
from webhook.commands import balance, replay, serve
from webhook.commands.settingsoptions import build, default_of
from webhook.replay.runspec import SHIPPED_DEVICE_POLICY, RunSpec
from webhook.replay.timeline import TimelineSpec
from webhook.server.serverstate import ServerSettings
from webhook.server.workershared import WorkerSettings


def _options(command: click.Command) -> dict[str, click.Option]:
    return {param.name: param for param in command.params if isinstance(param, click.Option) and param.name}


def _field_names(cls: type) -> set[str]:
    return {found.name for found in dataclasses.fields(cls)}


REPLAY_OWN = {"trace_dir", "pods_file", "policies", "arms", "seeds", "out", "workers", "synthetic_nodes", "timeline",
              "load", "device_policy"}
"""replay's options that fill no ``RunSpec`` field with its default: what the command itself reads
(``policies`` goes to the arms that admit pods; ``load`` is ``TimelineSpec``'s; ``device_policy``
is the shipped cluster's, ``SHIPPED_DEVICE_POLICY``)."""


def test_every_replay_option_that_fills_a_run_field_defaults_to_that_field() -> None:
    options = _options(replay.replay)
    filled = set(options) - REPLAY_OWN
    assert filled and filled <= _field_names(RunSpec), f"fill no RunSpec field: {filled - _field_names(RunSpec)}"
    wrong = {name: (options[name].default, default_of(RunSpec, name)) for name in filled
             if options[name].default != default_of(RunSpec, name)}
    assert wrong == {}
    assert options["load"].default == default_of(TimelineSpec, "load")
    assert options["device_policy"].default == SHIPPED_DEVICE_POLICY


SERVE_SOURCES = (serve.ServeSettings, ServerSettings, WorkerSettings)


def test_every_serve_option_defaults_to_the_field_it_fills() -> None:
    options = _options(serve.serve)
    for name, option in options.items():
        owners = [cls for cls in SERVE_SOURCES if name in _field_names(cls)]
        assert len(owners) == 1, f"--{name} fills {len(owners)} settings fields, not one"
        assert option.default == default_of(owners[0], name), f"--{name}: {option.default!r}"


def test_serve_builds_its_three_settings_from_its_options_alone() -> None:
    """Every option lands in exactly one settings object, so none is read around them."""
    given: dict[str, Any] = {name: option.default for name, option in _options(serve.serve).items()}
    built = [build(cls, given) for cls in SERVE_SOURCES]
    assert built == [cls() for cls in SERVE_SOURCES]
    landed = set().union(*(_field_names(cls) & set(given) for cls in SERVE_SOURCES))
    assert landed == set(given)


def _shown_default(help_text: str) -> str | None:
    found = re.search(r"\[default: ([^;,\]]+)", help_text)
    return found.group(1) if found else None


def _as_shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_balance_default_in_the_help_is_the_settings_default() -> None:
    """balance's settings flags default to None (a flag given beats the file, which beats the
    defaults), so what a user reads as the default is the help text's: it must be the field's."""
    options = _options(balance.balance)
    defaults = BalancerSettings()
    checked = 0
    given = balance.balance.make_context("balance", []).params
    for flag, path in balance.FLAG_FIELDS.items():
        assert given[flag] is None, f"--{flag} would override the --config file"
        shown = _shown_default(options[flag].help or "")
        value: Any = defaults
        for part in path.split("__"):
            value = getattr(value, part)
        if shown is None or shown.startswith(("$", "not ", "none", "learned", "in-cluster", "the system")):
            continue
        assert shown == _as_shown(value), f"--{flag} says [default: {shown}], the settings say {value!r}"
        checked += 1
    assert checked >= 8


def test_balance_settings_flags_are_each_a_settings_field() -> None:
    assert set(balance.FLAG_FIELDS) <= set(_options(balance.balance))
    with pytest.raises(TypeError, match="not a balancer settings flag: no_such_flag"):
        balance.settings_from(None, no_such_flag=1)
    built = balance.settings_from(None, write_qps=7.0, lease_name="x", publish_inventory=False, server=None)
    assert (built.write_qps, built.lease.name, built.inventory.enabled) == (7.0, "x", False)
