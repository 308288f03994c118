-- Argo CD health for argoproj.io/Application, so an app-of-apps waits for each child wave
-- (Argo CD has shipped no Application health since 1.8). argocd-cm script: base Lua and
-- table only.
--
-- A parent reads the child's status right after applying the child's new spec; until the
-- controller has compared that spec, status.health still describes the old one. So while
-- status.sync.comparedTo does not match the spec, report Progressing instead of the stale
-- verdict; likewise while a sync operation is still running. Otherwise the child's own health
-- passes through.
--
-- "Match" is the controller's own test (argo-cd controller/state.go specEqualsCompareTo:
-- reflect.DeepEqual of comparedTo and spec.BuildComparedToStatus, i.e. destination,
-- ignoreDifferences and source or sources), on values as the controller writes them: it decodes
-- the spec into Go structs and writes comparedTo back as JSON, where every omitempty field that
-- is false, 0, "" or empty is dropped. A spec saying `helm: {skipCrds: false}` is compared to a
-- comparedTo without skipCrds; a literal comparison would call it stale forever. A struct field
-- is never dropped (omitempty does not apply to Go structs): a multi-source app's comparedTo
-- always carries `source: {repoURL: ""}` (ComparedTo.Source is a struct; ApplicationSource.RepoURL
-- has no omitempty; pkg/apis/application/v1alpha1/types.go), the zero ApplicationSource, which the
-- spec does not have. A real Argo CD v3.2.11 showed it (tests/e2e/test_argocd.py): so a table
-- whose every value is a zero value is a zero value too.

-- Deep equality where nil, false, 0, "" and tables of those mean the same (Go's zero values).
local function empty(v)
  if v == nil or v == "" or v == false or v == 0 then
    return true
  end
  if type(v) ~= "table" then
    return false
  end
  for _, item in pairs(v) do
    if not empty(item) then
      return false
    end
  end
  return true
end

local function same(a, b)
  if empty(a) and empty(b) then
    return true
  end
  if type(a) ~= "table" or type(b) ~= "table" then
    return a == b
  end
  for k, v in pairs(a) do
    if not same(v, b[k]) then
      return false
    end
  end
  for k, v in pairs(b) do
    if a[k] == nil and not empty(v) then
      return false
    end
  end
  return true
end

if obj.status == nil or obj.status.health == nil or obj.status.health.status == nil then
  return {status = "Progressing", message = "Waiting for the Application's health to be reported"}
end

local compared = nil
if obj.status.sync ~= nil then
  compared = obj.status.sync.comparedTo
end
if compared ~= nil and obj.spec ~= nil then
  local spec = obj.spec
  local multi = not empty(spec.sources)
  local source, sources = spec.source, spec.sources
  if multi then
    source = nil -- BuildComparedToStatus keeps only sources when there are several
  else
    sources = nil
  end
  if not same(source, compared.source) or not same(sources, compared.sources)
      or not same(spec.destination, compared.destination)
      or not same(spec.ignoreDifferences, compared.ignoreDifferences) then
    return {status = "Progressing", message = "Waiting for the controller to compare the new spec (status is stale)"}
  end
end

if obj.status.operationState ~= nil and obj.status.operationState.phase == "Running" then
  return {status = "Progressing", message = "Sync is running"}
end

-- status.health.message is deprecated and mostly empty since Argo CD 3.x: say what we know.
local message = obj.status.health.message
if message == nil or message == "" then
  local sync = "Unknown"
  if obj.status.sync ~= nil and obj.status.sync.status ~= nil then
    sync = obj.status.sync.status
  end
  message = "Application health is " .. obj.status.health.status .. ", sync status " .. sync
end
return {status = obj.status.health.status, message = message}
