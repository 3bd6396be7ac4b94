{{/* Name of the chart, overridable. */}}
{{- define "pdfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart, or the release name when it already contains the chart name. */}}
{{- define "pdfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects (ClusterRole, ClusterRoleBinding) carry the namespace too, so two
releases in two namespaces never collide. */}}
{{- define "pdfleet.clusterName" -}}
{{- printf "%s-%s" (include "pdfleet.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pdfleet.labels" -}}
helm.sh/chart: {{ include "pdfleet.chart" . }}
{{ include "pdfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: pdfleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels of the monitoring objects: the common set plus monitoring.labels. */}}
{{- define "pdfleet.monitoringLabels" -}}
{{ include "pdfleet.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pdfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pdfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pdfleet.leaseName" -}}
{{- default (include "pdfleet.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "pdfleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The operator's rules on InferenceServices and the objects it creates, shared by the ClusterRole
(all namespaces) and the per-namespace Roles (watchNamespaces). Why each rule is there is in
docs/install.md ("What the operator may do").
*/}}
{{- define "pdfleet.workloadRules" -}}
# Watch InferenceServices (kopf index and events); never write their spec or metadata.
- apiGroups: [pdfleet.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch]
# Write the status once per pass (merge patch on the status subresource).
- apiGroups: [pdfleet.dev]
  resources: [inferenceservices/status]
  verbs: [patch]
# Children: server-side apply (create + patch), watched into indexes, orphans deleted.
- apiGroups: [""]
  resources: [serviceaccounts, services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# The router's Role grants pods get/list/watch. RBAC lets a subject create such a Role and bind
# it only if it holds those permissions itself, which the pod rule below gives: no escalate or
# bind verb is needed.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, delete]
# Optional per-service NetworkPolicies (spec.networkPolicy; docs/security.md).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
# Worker and router pods: readiness and scheduling into status, drain annotations.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
# The operator records its own Events (kopf's event posting is off).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The Multus networks a fabric names: checked to exist, never written (kube/networks.py).
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [list, watch]
{{- end -}}
