{{/* Names, labels and annotations every template shares. */}}

{{- define "taskherd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "taskherd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
<fullname>-<suffix>, at most 63 characters. The PREFIX is trimmed, never the suffix (as
cert-manager's webhook.fullname does): truncating the whole string could cut two suffixes to the
same name. Names that still collide are refused by taskherd.validate.names.
Call with (dict "root" $ "suffix" "operator").
*/}}
{{- define "taskherd.componentName" -}}
{{- $suffix := toString .suffix }}
{{- $room := int (sub 62 (len $suffix)) }}
{{- printf "%s-%s" (include "taskherd.fullname" .root | trunc $room | trimSuffix "-") $suffix }}
{{- end }}

{{- define "taskherd.operator.fullname" -}}
{{- include "taskherd.componentName" (dict "root" . "suffix" "operator") }}
{{- end }}

{{- define "taskherd.exporter.fullname" -}}
{{- include "taskherd.componentName" (dict "root" . "suffix" "exporter") }}
{{- end }}

{{- define "taskherd.beat.fullname" -}}
{{- include "taskherd.componentName" (dict "root" . "suffix" "beat") }}
{{- end }}

{{/*
The operator's metrics Service. A Service name is a DNS-1035 label, stricter than the DNS subdomain
of the other objects: a release name may hold dots (shop.v2), which become "-" here. One starting
with a digit cannot be mended so; taskherd.validate.monitoring refuses it.
*/}}
{{- define "taskherd.operator.metricsServiceName" -}}
{{- include "taskherd.componentName" (dict "root" . "suffix" "operator-metrics") | replace "." "-" }}
{{- end }}

{{- define "taskherd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels the chart sets itself: commonLabels and podLabels may not override them. */}}
{{- define "taskherd.reservedLabels" -}}
app.kubernetes.io/name app.kubernetes.io/instance app.kubernetes.io/version app.kubernetes.io/managed-by app.kubernetes.io/part-of app.kubernetes.io/component helm.sh/chart taskherd.io/pool
{{- end }}

{{- define "taskherd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "taskherd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "taskherd.labels" -}}
helm.sh/chart: {{ include "taskherd.chart" . }}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: taskherd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
`annotations:` of an object: its own (a map, may be empty) plus commonAnnotations; nothing when
both are empty. Call with (dict "root" $ "annotations" (dict ...)); indent with nindent.
*/}}
{{- define "taskherd.annotations" -}}
{{- $all := merge (deepCopy (default dict .annotations)) (deepCopy (default dict .root.Values.commonAnnotations)) }}
{{- with $all -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "taskherd.operator.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "taskherd.operator.labels" -}}
{{ include "taskherd.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "taskherd.exporter.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: exporter
{{- end }}

{{- define "taskherd.exporter.labels" -}}
{{ include "taskherd.labels" . }}
app.kubernetes.io/component: exporter
{{- end }}

{{- define "taskherd.beat.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: beat
{{- end }}

{{- define "taskherd.beat.labels" -}}
{{ include "taskherd.labels" . }}
app.kubernetes.io/component: beat
{{- end }}

{{/* Selector of every worker pod of the release, whatever its pool. */}}
{{- define "taskherd.worker.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "taskherd.pool.selectorLabels" -}}
{{ include "taskherd.worker.selectorLabels" .root }}
taskherd.io/pool: {{ .pool.name }}
{{- end }}

{{- define "taskherd.pool.labels" -}}
{{ include "taskherd.labels" .root }}
app.kubernetes.io/component: worker
taskherd.io/pool: {{ .pool.name }}
{{- end }}
