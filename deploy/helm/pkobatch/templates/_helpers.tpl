{{/*
The chart's name: nameOverride, else pkobatch. The app.kubernetes.io/name of the controller's
Deployments, pods and Services.
*/}}
{{- define "pkobatch.name" -}}
{{ .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of the chart's own namespaced objects' names: fullnameOverride, else the name
(pkobatch, so the Deployment is pkobatch-controller). Not the release name: the default
names are those of deploy/kustomize. At most 40 characters, so that the Service
<fullname>-controller-metrics stays a DNS label (63).
*/}}
{{- define "pkobatch.fullname" -}}
{{- $fullname := .Values.fullnameOverride | default (include "pkobatch.name" .) }}
{{- if gt (len $fullname) 40 }}
{{- fail (printf "fullnameOverride (or nameOverride): %q is longer than 40 characters; <name>-controller-metrics must fit a 63-character Service name" $fullname) }}
{{- end }}
{{- $fullname }}
{{- end }}

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
The labels of a controller Deployment's pods, which its selector uses; the context is
(list $ shard): the root context and the shard's name ("" for the main controller). A
shard's pods are component controller-shard, so no selector of the main controller matches
them. Not app.kubernetes.io/managed-by: pkobatch, which marks run Jobs and pods.
*/}}
{{- define "pkobatch.controllerLabels" -}}
{{- $shard := index . 1 -}}
app.kubernetes.io/name: {{ include "pkobatch.name" (index . 0) }}
{{- if $shard }}
app.kubernetes.io/component: controller-shard
pkobatch.io/controller-shard: {{ $shard }}
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

{{/*
The controller's ServiceAccount: serviceAccount.name, else <fullname>-controller.
*/}}
{{- define "pkobatch.serviceAccountName" -}}
{{ .Values.serviceAccount.name | default (printf "%s-controller" (include "pkobatch.fullname" .)) }}
{{- end }}

{{/*
The runners' ServiceAccount in each runner namespace, and the controller's default for runs
whose Stack names none (PKOBATCH_JOB__SERVICE_ACCOUNT): runner.serviceAccount.name, else
<fullname>-runner (pkobatch-runner, the controller's own default, as in deploy/kustomize/runner).
*/}}
{{- define "pkobatch.runnerServiceAccountName" -}}
{{ .Values.runner.serviceAccount.name | default (printf "%s-runner" (include "pkobatch.fullname" .)) }}
{{- end }}
