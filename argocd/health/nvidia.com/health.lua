-- Argo CD health for the GPU Operator's nvidia.com/ClusterPolicy and nvidia.com/NVIDIADriver: one
-- script for both kinds (installed in argocd-cm's resource.customizations block under the glob
-- nvidia.com/{ClusterPolicy,NVIDIADriver}, so it may use only base Lua, table and os.time/os.date:
-- no string or math library, no s:method() calls). Each kind's cases are in <Kind>/health_test.yaml.
--
-- What the GPU Operator writes: status.state (ready | notReady) through updateCRState
-- (controllers/clusterpolicy_controller.go Reconcile) or updateCrStatus
-- (controllers/nvidiadriver_controller.go Reconcile), then one Ready/Error condition pair
-- (internal/conditions/clusterpolicy.go and nvidiadriver.go setConditions). On success Ready=True
-- carries the reason and Error=False/Ready; on failure Ready=False/Error and Error=True carries the
-- reason (OperandNotReady, DriverNotReady, ReconcileFailed, ...) and message. State and conditions
-- are two writes, so for a moment the state is new and the pair still old.
-- Only a ClusterPolicy: init() failures write only the conditions (the state stays what it was,
-- possibly ready); Ready=True may carry NoGPUNodes or NFDLabelsMissing; a second ClusterPolicy gets
-- state "ignored" in memory only, never written: it shows no status at all.
-- Only an NVIDIADriver: SetConditionsError also writes the state the caller set (notReady,
-- disabled) or keeps the one it read (a missing secretEnv Secret leaves "ready" with Error=True);
-- it never writes "ignored" and never NoGPUNodes (a pool without nodes is simply ready).
--
--   no status                              -> Progressing (not reconciled yet; a duplicate
--                                             ClusterPolicy stays so)
--   NVIDIADriver disabled                  -> Suspended: ClusterPolicy spec.driver.useNvidiaDriverCRD
--                                             is false (Error=True, reason Reconciled, by design)
--   Error=True ReconcileFailed             -> Degraded, whatever the state
--   NVIDIADriver ConflictingNodeSelector   -> Degraded: two pools could select one node, the
--                                             operator leaves ownership unchanged
--   ready + Ready=True                     -> Healthy; a ClusterPolicy's NoGPUNodes / NFDLabelsMissing
--                                             only change the message: a pool scaled to zero or the
--                                             first reconcile before NFD labelled the nodes is a
--                                             state, not a failure
--   ready + Error=True OperandNotReady or
--           DriverNotReady                 -> Progressing (the conditions are not written yet)
--   ready + any other Error=True           -> Degraded
--   notReady                               -> Progressing with the operator's reason and message
--                                             (a driver rollout is notReady for hours; a node whose
--                                             upgrade failed is only on its node label:
--                                             `gpugate stack status --kube` and the dashboard show it)
--   anything else                          -> Unknown
-- A canary rollback gpugate's controller decided (NVIDIADriver annotations gpugate.io/canary-*, written
-- by webhook/stack/canary_controller.py when it pushed the commit) is said in the message: while the
-- spec still holds the failed version (the commit not synced yet) the driver is Progressing
-- "rollback committed", while it rolls back to the old version "rollback under way", and once ready
-- the Healthy message says what was rolled back and why. An annotation whose versions match neither
-- is a past rollout's and is not read.
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

-- What only one kind writes, and the words its messages add.
local kinds = {
  ClusterPolicy = {
    noStatus = " (no status yet; a second ClusterPolicy never gets one)",
    readyBecause = {
      NoGPUNodes = "; no GPU node in the cluster yet",
      NFDLabelsMissing = "; no GPU node discovered yet (NFD labels missing)",
    },
    notReadyHint = "",
  },
  NVIDIADriver = {
    noStatus = "",
    disabled = "NVIDIADriver is disabled: ClusterPolicy spec.driver.useNvidiaDriverCRD is false",
    conflict = "NVIDIADriver nodeSelector can select the same nodes as another NVIDIADriver",
    readyBecause = {},
    notReadyHint = "; a node that failed its upgrade shows only in `gpugate stack status --kube`",
  },
}

-- The canary rollback this NVIDIADriver is in, as a message, and whether its spec still has the
-- failed version (committed, not synced yet); nil when there is none.
local function rollback()
  if obj.kind ~= "NVIDIADriver" or obj.metadata == nil or obj.metadata.annotations == nil then
    return nil, false
  end
  local a = obj.metadata.annotations
  if a["gpugate.io/canary-decision"] ~= "rollback" or obj.spec == nil then
    return nil, false
  end
  local mode = a["gpugate.io/canary-mode"] or "a failure"
  local evidence = ""
  if a["gpugate.io/canary-evidence"] ~= nil then
    evidence = ": " .. a["gpugate.io/canary-evidence"]
  end
  local commit = a["gpugate.io/canary-commit"] or "?"
  if obj.spec.version ~= nil and obj.spec.version == a["gpugate.io/canary-rollout-version"] then
    return "canary rollback of " .. obj.spec.version .. " committed (" .. commit .. ", " .. mode .. evidence .. "), waiting for Argo CD to sync it", true
  end
  if obj.spec.version ~= nil and obj.spec.version == a["gpugate.io/canary-rollback-to"] then
    return "canary rollback from " .. tostring(a["gpugate.io/canary-rollout-version"]) .. " to " .. obj.spec.version .. " (" .. mode .. evidence .. ")", false
  end
  return nil, false
end

-- Reasons the operator writes while it waits for operands, never for a failure.
local waiting = {OperandNotReady = true, DriverNotReady = true}

local kind = obj.kind
local own = kinds[kind]
if own == nil then
  return {status = "Unknown", message = "gpugate's GPU Operator health check has no rules for kind " .. tostring(kind)}
end

if obj.status == nil or obj.status.state == nil then
  return {status = "Progressing", message = "Waiting for the GPU Operator to report the " .. kind .. " state" .. own.noStatus}
end

local state = obj.status.state
local ready = condition("Ready")
local failed = condition("Error")
if failed ~= nil and failed.status ~= "True" then
  failed = nil
end

if state == "disabled" and own.disabled ~= nil then
  return {status = "Suspended", message = own.disabled}
end

if state ~= "ready" and state ~= "notReady" then
  return {status = "Unknown", message = kind .. " reports an unexpected state: " .. tostring(state)}
end

if failed ~= nil and failed.reason == "ReconcileFailed" then
  return {status = "Degraded", message = kind .. " reconcile failed (state " .. state .. ")" .. detail(failed)}
end

if failed ~= nil and failed.reason == "ConflictingNodeSelector" and own.conflict ~= nil then
  return {status = "Degraded", message = own.conflict .. detail(failed)}
end

local canary, unsynced = rollback()
if canary ~= nil and unsynced then
  return {status = "Progressing", message = canary}
end

if state == "ready" then
  if failed ~= nil and not waiting[failed.reason] then
    return {status = "Degraded", message = kind .. " is ready but reports an error (" .. tostring(failed.reason) .. ")" .. detail(failed)}
  end
  if ready ~= nil and ready.status == "True" then
    local because = ""
    if ready.reason ~= nil and own.readyBecause[ready.reason] ~= nil then
      because = own.readyBecause[ready.reason]
    end
    if canary ~= nil then
      return {status = "Healthy", message = kind .. " is ready after a " .. canary}
    end
    return {status = "Healthy", message = kind .. " is ready" .. because .. detail(ready)}
  end
  return {status = "Progressing", message = kind .. " state is ready; waiting for the operator to write its Ready condition"}
end

local under = ""
if canary ~= nil then
  under = canary .. " under way; "
end
if failed ~= nil and failed.reason ~= nil then
  return {status = "Progressing", message = under .. kind .. " is not ready (" .. failed.reason .. ")" .. detail(failed) .. own.notReadyHint}
end
return {status = "Progressing", message = under .. kind .. " is not ready yet"}
