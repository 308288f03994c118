-- Argo CD health for apiextensions.k8s.io/CustomResourceDefinition, replacing Argo CD's built-in
-- check (argocd-cm script: base Lua and table only).
--
-- Why: Argo CD's built-in check (resource_customizations/apiextensions.k8s.io/
-- CustomResourceDefinition/health.lua; v3.2.x) is Degraded for a CRD that has conditions but no
-- Established=True. The API server writes exactly that for every new CRD: its naming controller
-- accepts the names and writes Established=False/Installing, the establishing controller turns it
-- True a moment later. On a real Argo CD v3.2.11 every first install of the GPU Operator chart
-- showed gpu-operator, and through the Application check gpugate-root, Degraded for up to ~40 s,
-- and on-health-degraded pages on Degraded. Argo CD 3.5 calls only reason Installing Progressing.
--
-- What the apiextensions-apiserver writes (staging/src/k8s.io/apiextensions-apiserver/pkg/...):
--   registry/customresourcedefinition/strategy.go PrepareForCreate: a new CRD has no conditions
--   controller/status/naming_controller.go: NamesAccepted True/NoConflicts, or False with
--     PluralConflict, SingularConflict, ShortNamesConflict, KindConflict, ListKindConflict and
--     a message such as `"nvd" is already in use`; with it Established False/NotAccepted (names
--     refused) or False/Installing (names accepted, not served yet); an Established=True is kept
--   controller/establish/establishing_controller.go: Established True/InitialNamesAccepted, or
--     False/InvalidCABundle when the conversion webhook's caBundle is invalid
--   controller/nonstructuralschema: NonStructuralSchema True/Violations (a legacy schema)
--   registry/customresourcedefinition/etcd.go Delete and controller/finalizer/crd_finalizer.go:
--     deletionTimestamp and Terminating True (InstanceDeletionPending, InstanceDeletionInProgress,
--     InstanceDeletionFailed, InstanceDeletionCheck) until the custom resources are gone
--
--   deletionTimestamp or Terminating=True -> Progressing (as Argo CD's check: deletion takes time);
--                                            Argo CD itself says Progressing "Pending deletion" for
--                                            any object with a deletionTimestamp before it runs a
--                                            script (gitops-engine pkg/health/health.go
--                                            GetResourceHealth), so this message shows only for
--                                            Terminating=True without one
--   NamesAccepted=False                   -> Degraded with the condition's message: a name
--                                            conflict, it is not served (or keeps its old names)
--   NonStructuralSchema=True              -> Degraded (as Argo CD's check)
--   Established=False InvalidCABundle     -> Degraded: it will not be established until fixed
--   Established=True                      -> Healthy
--   anything else (no conditions yet, Established False/Unknown or not written yet)
--                                         -> Progressing: being established
local function condition(ctype)
  if obj.status == nil or obj.status.conditions == nil then
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

local function because(c)
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return " (" .. c.reason .. ")"
  end
  return ""
end

local terminating = condition("Terminating")
if terminating ~= nil and terminating.status ~= "True" then
  terminating = nil
end
if (obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil) or terminating ~= nil then
  return {status = "Progressing", message = "CRD is terminating" .. detail(terminating)}
end

local names = condition("NamesAccepted")
if names ~= nil and names.status == "False" then
  return {status = "Degraded", message = "CRD names are not accepted" .. because(names) .. detail(names)}
end

local nonStructural = condition("NonStructuralSchema")
if nonStructural ~= nil and nonStructural.status == "True" then
  return {status = "Degraded", message = "CRD schema is not structural" .. because(nonStructural) .. detail(nonStructural)}
end

local established = condition("Established")
if established ~= nil and established.status == "True" then
  return {status = "Healthy", message = "CRD is established"}
end
if established ~= nil and established.reason == "InvalidCABundle" then
  return {status = "Degraded", message = "CRD is not established" .. because(established) .. detail(established)}
end
if established ~= nil then
  return {status = "Progressing", message = "CRD is being established" .. because(established) .. detail(established)}
end
if names == nil then
  return {status = "Progressing", message = "Waiting for the API server to accept the CRD's names (no conditions yet)"}
end
return {status = "Progressing", message = "Waiting for the CRD to be established"}
