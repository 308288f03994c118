{{/*
Helpers shared by the templates. Names are fixed (see values.yaml); the release namespace is where
every namespaced object goes and what the webhook configurations exclude.
*/}}

{{- define "gpugate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels helm adds to every object of the release, besides the part's own (name, component). */}}
{{- define "gpugate.releaseLabels" -}}
app.kubernetes.io/part-of: gpugate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels on pod templates: what kustomize's `labels` transformer puts there (no helm keys). */}}
{{- define "gpugate.podLabels" -}}
app.kubernetes.io/part-of: gpugate
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "gpugate.webhook.selector" -}}
app.kubernetes.io/name: gpugate-webhook
app.kubernetes.io/component: admission-webhook
{{- end }}

{{- define "gpugate.webhook.labels" -}}
{{ include "gpugate.webhook.selector" . }}
{{ include "gpugate.releaseLabels" . }}
{{- end }}

{{- define "gpugate.balancer.selector" -}}
app.kubernetes.io/name: gpugate-balancer
app.kubernetes.io/component: balancer
{{- end }}

{{- define "gpugate.balancer.labels" -}}
{{ include "gpugate.balancer.selector" . }}
{{ include "gpugate.releaseLabels" . }}
{{- end }}

{{- define "gpugate.scheduler.selector" -}}
app.kubernetes.io/name: gpugate-scheduler
app.kubernetes.io/component: scheduler
{{- end }}

{{- define "gpugate.scheduler.labels" -}}
{{ include "gpugate.scheduler.selector" . }}
{{ include "gpugate.releaseLabels" . }}
{{- end }}

{{- define "gpugate.certs.labels" -}}
app.kubernetes.io/name: gpugate-certs
app.kubernetes.io/component: tls
{{ include "gpugate.releaseLabels" . }}
{{- end }}

{{- define "gpugate.balancerCerts.labels" -}}
app.kubernetes.io/name: gpugate-balancer
app.kubernetes.io/component: balancer
{{ include "gpugate.releaseLabels" . }}
{{- end }}

{{/* The namespaces never sent to the webhook: the configured ones, the release's, the GPU Operator's. */}}
{{- define "gpugate.webhook.excludedNamespaces" -}}
{{- $names := concat .Values.webhook.excludeNamespaces (list .Release.Namespace .Values.gpuOperatorNamespace) | uniq -}}
{{- toJson $names -}}
{{- end }}

{{/* clientConfig of one webhook: the Service, or webhook.url with its caBundle. */}}
{{- define "gpugate.webhook.clientConfig" -}}
{{- if .root.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" .root.Values.webhook.url) .path | quote }}
caBundle: {{ .root.Values.webhook.caBundle | quote }}
{{- else }}
service:
  name: gpugate-webhook
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- if and (eq .root.Values.tls.mode "external") .root.Values.webhook.caBundle }}
caBundle: {{ .root.Values.webhook.caBundle | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The policy files, {name: text}: policies.files, else the bundled starter set. */}}
{{- define "gpugate.policyData" -}}
{{- if .Values.policies.files }}
{{- range $name, $text := .Values.policies.files }}
{{ $name }}: {{ $text | toJson }}
{{- end }}
{{- else }}
{{- range $path, $_ := .Files.Glob "files/policies/*.yaml" }}
{{ base $path }}: {{ $.Files.Get $path | toJson }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpugate.policyConfigMapName" -}}
{{ .Values.policies.existingConfigMap | default "gpugate-policies" }}
{{- end }}

{{/* Refuse combinations that cannot work, with the key to change. */}}
{{- define "gpugate.validate" -}}
{{- if and .Values.balancer.idlePolicies (not .Values.webhook.enabled) (not .Values.policies.existingConfigMap) }}
{{- fail "balancer.idlePolicies mounts the policies ConfigMap, which only webhook.enabled makes: enable the webhook or set policies.existingConfigMap" }}
{{- end }}
{{- if and .Values.webhook.url (ne .Values.tls.mode "external") }}
{{- fail (printf "webhook.url is set: the server outside the cluster has its own certificate, so set tls.mode to external (it is %q) and webhook.caBundle to its CA" .Values.tls.mode) }}
{{- end }}
{{- if and .Values.webhook.url (not .Values.webhook.caBundle) }}
{{- fail "webhook.url is set but webhook.caBundle is empty: give the base64 PEM CA that signed the server's certificate" }}
{{- end }}
{{- if and .Values.webhook.url (not (hasPrefix "https://" .Values.webhook.url)) }}
{{- fail (printf "webhook.url must start with https:// (the API server calls webhooks over TLS only), got %q" .Values.webhook.url) }}
{{- end }}
{{- if and .Values.webhook.caBundle (ne .Values.tls.mode "external") }}
{{- fail (printf "webhook.caBundle is set with tls.mode %s, which fills the caBundle itself; use tls.mode external" .Values.tls.mode) }}
{{- end }}
{{- if and .Values.scheduler.enabled (not .Values.balancer.enabled) }}
{{- fail "scheduler.enabled needs balancer.enabled: the second scheduler's extender is the balancer (and it mounts the CA of the balancer's certificate)" }}
{{- end }}
{{- if and .Values.policies.files .Values.policies.existingConfigMap }}
{{- fail "set policies.files or policies.existingConfigMap, not both" }}
{{- end }}
{{- end }}

{{- define "gpugate.canary.selector" -}}
app.kubernetes.io/name: gpugate-canary
app.kubernetes.io/component: canary-controller
{{- end }}

{{- define "gpugate.canary.labels" -}}
{{ include "gpugate.canary.selector" . }}
{{ include "gpugate.releaseLabels" . }}
{{- end }}
