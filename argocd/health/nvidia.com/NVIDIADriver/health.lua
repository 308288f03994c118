-- Argo CD health for nvidia.com/NVIDIADriver (argocd-cm script: base Lua, table and
-- os.time/os.date only; no string or math library).
--
-- Same contract as ClusterPolicy (status.state + a Ready/Error condition pair whose True
-- member carries reason and message), plus two NVIDIADriver specifics:
--   notReady + ConflictingNodeSelector -> Degraded: two pool CRs select the same nodes and
--                                         the operator leaves node ownership unchanged
--   disabled                           -> Suspended: ClusterPolicy
--                                         spec.driver.useNvidiaDriverCRD is false
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
  return {status = "Progressing", message = "Waiting for the GPU Operator to report the NVIDIADriver state"}
end

local state = obj.status.state
local ready = condition("Ready")
local failed = condition("Error")
if failed ~= nil and failed.status ~= "True" then
  failed = nil
end

if state == "disabled" then
  return {status = "Suspended", message = "NVIDIADriver is disabled: ClusterPolicy spec.driver.useNvidiaDriverCRD is false"}
end

if state == "ignored" then
  return {status = "Degraded", message = "NVIDIADriver is ignored by the GPU Operator" .. detail(failed or ready)}
end

if state == "ready" then
  if ready ~= nil and ready.status == "True" and (ready.reason == "NoGPUNodes" or ready.reason == "NFDLabelsMissing") then
    return {status = "Degraded", message = "No GPU is usable: NVIDIADriver is ready but reports " .. ready.reason .. detail(ready)}
  end
  if ready ~= nil and ready.status == "True" then
    return {status = "Healthy", message = "NVIDIADriver is ready" .. detail(ready)}
  end
  return {status = "Progressing", message = "NVIDIADriver state is ready but its Ready condition is not True yet"}
end

if state == "notReady" then
  if failed ~= nil and failed.reason == "ConflictingNodeSelector" then
    return {status = "Degraded", message = "NVIDIADriver nodeSelector overlaps another NVIDIADriver" .. detail(failed)}
  end
  if failed ~= nil and failed.reason == "ReconcileFailed" then
    return {status = "Degraded", message = "NVIDIADriver reconcile failed" .. detail(failed)}
  end
  if failed ~= nil and failed.reason ~= nil then
    return {status = "Progressing", message = "NVIDIADriver is not ready (" .. failed.reason .. ")" .. detail(failed)}
  end
  return {status = "Progressing", message = "NVIDIADriver is not ready yet"}
end

return {status = "Unknown", message = "NVIDIADriver reports an unexpected state: " .. tostring(state)}
