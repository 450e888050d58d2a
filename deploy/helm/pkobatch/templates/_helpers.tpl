{{/*
Labels of every object: kustomize's app.kubernetes.io/part-of plus Helm's own.
*/}}
{{- define "pkobatch.labels" -}}
app.kubernetes.io/part-of: pkobatch
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The labels of a controller Deployment's pods, which its selector uses; the context is the
shard's name ("" for the main controller). A shard's pods are component controller-shard,
so no selector of the main controller matches them. Not app.kubernetes.io/managed-by:
pkobatch, which marks run Jobs and pods.
*/}}
{{- define "pkobatch.controllerLabels" -}}
app.kubernetes.io/name: pkobatch
{{- if . }}
app.kubernetes.io/component: controller-shard
pkobatch.io/controller-shard: {{ . }}
{{- else }}
app.kubernetes.io/component: controller
{{- end }}
{{- end }}

{{- define "pkobatch.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The image of every run: job.image, else pkobatch/runner at the controller image's tag.
*/}}
{{- define "pkobatch.runnerImage" -}}
{{ .Values.job.image | default (printf "pkobatch/runner:%s" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- end }}

{{/*
Namespaces with the controller's Roles when rbac.scope=namespace (default: the release's).
*/}}
{{- define "pkobatch.watchedNamespaces" -}}
{{- if .Values.controller.namespaces }}
{{- toJson .Values.controller.namespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
Namespaces that get the runner ServiceAccount and RoleBinding.
*/}}
{{- define "pkobatch.runnerNamespaces" -}}
{{- $namespaces := .Values.runner.namespaces }}
{{- if eq .Values.rbac.scope "namespace" }}
{{- $namespaces = concat (include "pkobatch.watchedNamespaces" . | fromJsonArray) $namespaces }}
{{- end }}
{{- toJson (uniq $namespaces) }}
{{- end }}

{{- define "pkobatch.roleKind" -}}
{{- if eq .Values.rbac.scope "namespace" }}Role{{ else }}ClusterRole{{ end }}
{{- end }}
