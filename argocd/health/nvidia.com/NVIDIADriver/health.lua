-- Argo CD health for nvidia.com/NVIDIADriver (argocd-cm script: base Lua, table and
-- os.time/os.date only; no string or math library).
--
-- What the GPU Operator writes (controllers/nvidiadriver_controller.go Reconcile, with
-- internal/conditions/nvidiadriver.go setConditions): status.state from the state manager
-- (ready | notReady) through updateCrStatus, then the same Ready/Error condition pair as the
-- ClusterPolicy; SetConditionsError also writes the state the caller set (notReady, disabled) or
-- keeps the one it read (a missing secretEnv Secret leaves "ready" with Error=True). It never
-- writes "ignored" and never a NoGPUNodes reason: a pool without nodes is simply ready.
--
--   no status                                -> Progressing
--   disabled                                 -> Suspended: ClusterPolicy spec.driver.useNvidiaDriverCRD
--                                               is false (Error=True, reason Reconciled, by design)
--   Error=True ReconcileFailed               -> Degraded, whatever the state
--   notReady + ConflictingNodeSelector       -> Degraded: two pools could select one node, the
--                                               operator leaves ownership unchanged
--   ready + Ready=True                       -> Healthy
--   ready + Error=True DriverNotReady        -> Progressing (the conditions are not written yet)
--   ready + any other Error=True             -> Degraded
--   notReady                                 -> Progressing with the operator's reason: driver pods
--                                               not ready, which is a rollout or a node whose upgrade
--                                               failed (only its node label says which:
--                                               `gpugate stack status --kube`, the dashboard)
--   anything else                            -> Unknown
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

local waiting = {OperandNotReady = true, DriverNotReady = true}

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

if state ~= "ready" and state ~= "notReady" then
  return {status = "Unknown", message = "NVIDIADriver reports an unexpected state: " .. tostring(state)}
end

if failed ~= nil and failed.reason == "ReconcileFailed" then
  return {status = "Degraded", message = "NVIDIADriver reconcile failed (state " .. state .. ")" .. detail(failed)}
end

if failed ~= nil and failed.reason == "ConflictingNodeSelector" then
  return {status = "Degraded", message = "NVIDIADriver nodeSelector can select the same nodes as another NVIDIADriver" .. detail(failed)}
end

if state == "ready" then
  if failed ~= nil and not waiting[failed.reason] then
    return {status = "Degraded", message = "NVIDIADriver is ready but reports an error (" .. tostring(failed.reason) .. ")" .. detail(failed)}
  end
  if ready ~= nil and ready.status == "True" then
    return {status = "Healthy", message = "NVIDIADriver is ready" .. detail(ready)}
  end
  return {status = "Progressing", message = "NVIDIADriver state is ready; waiting for the operator to write its Ready condition"}
end

if failed ~= nil and failed.reason ~= nil then
  return {status = "Progressing", message = "NVIDIADriver is not ready (" .. failed.reason .. ")" .. detail(failed) .. "; a node that failed its upgrade shows only in `gpugate stack status --kube`"}
end
return {status = "Progressing", message = "NVIDIADriver is not ready yet"}
