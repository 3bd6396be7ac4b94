-- Argo CD health check for inferenceservices.pdfleet.dev (InferenceService).
--
-- Follows kstatus, the conventions the operator writes its status by:
--   * status not written yet, or status.observedGeneration behind metadata.generation
--       -> Progressing (the operator has not seen the latest spec)
--   * Stalled=True      -> Degraded (cannot converge without help: a pod stuck or
--                          unschedulable past spec.progressDeadline, an invalid spec)
--   * Ready=True        -> Healthy
--   * Reconciling=True  -> Progressing (converging: pods starting, pools resizing, draining)
--   * anything else     -> Progressing
-- Install it under resource.customizations.health.pdfleet.dev_InferenceService in argocd-cm
-- (docs/gitops.md).
local hs = {}

local function find_condition(status, kind)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, condition in ipairs(status.conditions) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function describe(condition, fallback)
  if condition == nil then
    return fallback
  end
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    if text ~= "" then
      text = text .. ": " .. condition.message
    else
      text = condition.message
    end
  end
  if text == "" then
    return fallback
  end
  return text
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local stalled = find_condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

local ready = find_condition(status, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

local reconciling = find_condition(status, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the Ready condition")
return hs
