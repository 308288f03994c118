-- Argo CD health for nvidia.com/ClusterPolicy (installed through argocd-cm, so it may use
-- only base Lua, table and os.time/os.date: no string or math library, no s:method() calls).
--
-- The GPU Operator writes status.state (ready | notReady | ignored) and a Ready/Error
-- condition pair; the condition that is True carries the reason and message
-- (gpu-operator internal/conditions). Mapping:
--   no status yet                          -> Progressing
--   ready + Ready=True                     -> Healthy
--   ready + reason NoGPUNodes/NFDLabelsMissing -> Degraded: nothing can use a GPU
--   notReady                               -> Progressing (a driver rollout is notReady for
--                                             a long time; Degraded would page and fail waves)
--   notReady + Error=True/ReconcileFailed  -> Degraded
--   ignored                                -> Degraded: a second ClusterPolicy, never reconciled
local function condition(ctype)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function detail(c)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return ": " .. c.message
  end
  return ""
end

if obj.status == nil or obj.status.state == nil then
  return {status = "Progressing", message = "Waiting for the GPU Operator to report the ClusterPolicy state"}
end

local state = obj.status.state
local ready = condition("Ready")
local failed = condition("Error")
if failed ~= nil and failed.status ~= "True" then
  failed = nil
end

if state == "ignored" then
  return {status = "Degraded", message = "ClusterPolicy is ignored: another ClusterPolicy is already active and only one is reconciled; delete the duplicate"}
end

if state == "ready" then
  if ready ~= nil and ready.status == "True" and (ready.reason == "NoGPUNodes" or ready.reason == "NFDLabelsMissing") then
    return {status = "Degraded", message = "No GPU is usable: ClusterPolicy is ready but reports " .. ready.reason .. detail(ready)}
  end
  if ready ~= nil and ready.status == "True" then
    return {status = "Healthy", message = "ClusterPolicy is ready" .. detail(ready)}
  end
  return {status = "Progressing", message = "ClusterPolicy state is ready but its Ready condition is not True yet"}
end

if state == "notReady" then
  if failed ~= nil and failed.reason == "ReconcileFailed" then
    return {status = "Degraded", message = "ClusterPolicy reconcile failed" .. detail(failed)}
  end
  if failed ~= nil and failed.reason ~= nil then
    return {status = "Progressing", message = "ClusterPolicy is not ready (" .. failed.reason .. ")" .. detail(failed)}
  end
  return {status = "Progressing", message = "ClusterPolicy is not ready yet"}
end

return {status = "Unknown", message = "ClusterPolicy reports an unexpected state: " .. tostring(state)}
