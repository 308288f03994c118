"""Run an Argo CD health script the way argocd-cm runs it: real Lua 5.1, restricted libraries.

Argo CD runs custom (argocd-cm) health scripts in gopher-lua with SkipOpenLibs: only base,
table and a safe os subset are open, plus string and math when
``resource.customizations.useOpenLibs.<group>_<Kind>: "true"`` is set. Its own test harness
opens every library, so a script can pass upstream-style tests and fail in a cluster; this
sandbox closes that gap. We use lupa's Lua 5.1 (the language gopher-lua implements), open
everything, then remove what Argo CD would not have opened, including the string metatable
(otherwise ``s:find(...)`` would still reach the string library through it).
"""

from __future__ import annotations

from typing import Any

from lupa import lua51

VALID_STATUSES = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")

# Argo CD gives each script a 1 s context; an instruction budget is the deterministic analogue.
INSTRUCTION_BUDGET = 5_000_000

_SETUP = """
local open_libs, budget = ...
-- a runaway script fails like Argo's timeout instead of hanging the test run
debug.sethook(function() error("health script exceeded its instruction budget (timeout)") end, "", budget)
if not open_libs then
  debug.setmetatable("", nil)          -- no s:find(): the string library is not opened
  string = nil
  math = nil
end
local safe_os = {time = os.time, date = os.date, clock = os.clock}
os = safe_os
io = nil
debug = nil
package = nil
require = nil
load = nil
loadstring = nil
dofile = nil
loadfile = nil
module = nil
python = nil
"""


class HealthScriptError(Exception):
    """The script raised a Lua error or returned something Argo CD would turn into Unknown."""


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        table = lua.table()
        for key, item in value.items():
            if item is not None:
                table[key] = _to_lua(lua, item)
        return table
    if isinstance(value, list):
        table = lua.table()
        for index, item in enumerate(value, start=1):
            table[index] = _to_lua(lua, item)
        return table
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)  # gopher-lua numbers are float64
    return str(value)


def run_health(script: str, obj: dict[str, Any], *, open_libs: bool) -> dict[str, str]:
    """Return ``{"status": ..., "message": ...}`` as Argo CD would read it from ``script``.

    Raises HealthScriptError for a Lua error (Argo CD: Unknown with the error text) or an
    invalid status string (Argo CD: Unknown, "Lua returned an invalid health status").
    """
    lua = lua51.LuaRuntime(register_eval=False, register_builtins=False, unpack_returned_tuples=True)
    lua.execute(_SETUP, open_libs, INSTRUCTION_BUDGET)
    lua.globals().obj = _to_lua(lua, obj)
    try:
        result = lua.execute(script)
    except lua51.LuaError as err:
        raise HealthScriptError(f"Lua error: {err}") from err
    if result is None:
        return {}
    if lua.globals().type(result) != "table":
        raise HealthScriptError(f"health script returned a {lua.globals().type(result)}, not a table")
    status = result["status"]
    message = result["message"]
    if status is not None and status not in VALID_STATUSES:
        raise HealthScriptError(f"Lua returned an invalid health status: {status!r}")
    out: dict[str, str] = {}
    if status is not None:
        out["status"] = status
    if message is not None and message != "":
        out["message"] = message
    return out
