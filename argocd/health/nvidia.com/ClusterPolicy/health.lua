-- Argo CD health for nvidia.com/ClusterPolicy (installed through argocd-cm, so it may use
-- only base Lua, table and os.time/os.date: no string or math library, no s:method() calls).
--
-- What the GPU Operator writes (controllers/clusterpolicy_controller.go Reconcile, with
-- internal/conditions/clusterpolicy.go setConditions): status.state (ready | notReady) through
-- updateCRState, then a condition pair. On success Ready=True carries the reason (Reconciled,
-- NoGPUNodes, NFDLabelsMissing) and Error=False/Ready; on failure Ready=False/Error and
-- Error=True carries the reason (OperandNotReady, ReconcileFailed) and message. State and
-- conditions are two writes, so for a moment the state is new and the pair still old. init()
-- failures write only the conditions: the state stays what it was, possibly ready. A second
-- ClusterPolicy gets state "ignored" in memory only, never written: it shows no status at all.
--
--   no status                            -> Progressing (not reconciled yet; a duplicate stays so)
--   Error=True ReconcileFailed           -> Degraded, whatever the state
--   ready + Ready=True                   -> Healthy; NoGPUNodes / NFDLabelsMissing only change the
--                                           message: a pool scaled to zero or the first reconcile
--                                           before NFD labelled the nodes is a state, not a failure
--   ready + Error=True OperandNotReady   -> Progressing (the conditions are not written yet)
--   ready + any other Error=True         -> Degraded
--   notReady                             -> Progressing with the operator's reason and message
--                                           (a driver rollout is notReady for hours; a node whose
--                                           upgrade failed is only on its node label:
--                                           `gpugate stack status --kube` and the dashboard show it)
--   anything else                        -> Unknown
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

-- Reasons the operator writes while it waits for operands, never for a failure.
local waiting = {OperandNotReady = true, DriverNotReady = true}

if obj.status == nil or obj.status.state == nil then
  return {status = "Progressing", message = "Waiting for the GPU Operator to report the ClusterPolicy state (no status yet; a second ClusterPolicy never gets one)"}
end

local state = obj.status.state
local ready = condition("Ready")
local failed = condition("Error")
if failed ~= nil and failed.status ~= "True" then
  failed = nil
end

if state ~= "ready" and state ~= "notReady" then
  return {status = "Unknown", message = "ClusterPolicy reports an unexpected state: " .. tostring(state)}
end

if failed ~= nil and failed.reason == "ReconcileFailed" then
  return {status = "Degraded", message = "ClusterPolicy reconcile failed (state " .. state .. ")" .. detail(failed)}
end

if state == "ready" then
  if failed ~= nil and not waiting[failed.reason] then
    return {status = "Degraded", message = "ClusterPolicy is ready but reports an error (" .. tostring(failed.reason) .. ")" .. detail(failed)}
  end
  if ready ~= nil and ready.status == "True" then
    if ready.reason == "NoGPUNodes" then
      return {status = "Healthy", message = "ClusterPolicy is ready; no GPU node in the cluster yet" .. detail(ready)}
    end
    if ready.reason == "NFDLabelsMissing" then
      return {status = "Healthy", message = "ClusterPolicy is ready; no GPU node discovered yet (NFD labels missing)" .. detail(ready)}
    end
    return {status = "Healthy", message = "ClusterPolicy is ready" .. detail(ready)}
  end
  return {status = "Progressing", message = "ClusterPolicy state is ready; waiting for the operator to write its Ready condition"}
end

if failed ~= nil and failed.reason ~= nil then
  return {status = "Progressing", message = "ClusterPolicy is not ready (" .. failed.reason .. ")" .. detail(failed)}
end
return {status = "Progressing", message = "ClusterPolicy is not ready yet"}
