{{/* Names, labels and the per-pool values every template shares. */}}

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

{{- define "taskherd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
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

{{/* Operator: names and labels. */}}
{{- define "taskherd.operator.fullname" -}}
{{- printf "%s-operator" (include "taskherd.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "taskherd.operator.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "taskherd.operator.labels" -}}
{{ include "taskherd.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Selector of every worker pod of the release, whatever its pool. */}}
{{- define "taskherd.worker.selectorLabels" -}}
{{ include "taskherd.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{/*
Deep merge of a pool over the defaults: maps merge key by key, anything else (lists, scalars,
null) replaces. Written out because sprig's merge/mergeOverwrite skip "empty" values, so a pool
could never set `autoscaling.enabled: false` or `minReplicas: 0` over a non-empty default.
Call with (list $dst $src); $dst is modified in place.
*/}}
{{- define "taskherd.deepMerge" -}}
{{- $dst := index . 0 }}
{{- range $key, $value := index . 1 }}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) }}
{{- include "taskherd.deepMerge" (list (get $dst $key) $value) }}
{{- else }}
{{- $_ := set $dst $key $value }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The effective pools: each `workerPools` entry merged over `workerPoolDefaults`, with the names
and the derived durations computed once, here, so that every template (and the validation)
uses the same numbers. Returns YAML: `pools: [...]`; use with fromYaml.
  fullname            Deployment / WorkerPool / PDB name
  deadLetterQueues    one DLQ per queue: as written, or `<queue>.dlq` (taskherd.contract's default)
  drainSeconds        drain deadline = hard + drainMargin (TASKHERD_DRAIN_DEADLINE)
  minGraceSeconds     drain deadline + shutdown
  graceSeconds        terminationGracePeriodSeconds, explicit or derived (= minGraceSeconds)
*/}}
{{- define "taskherd.pools" -}}
{{- $root := . }}
{{- $pools := list }}
{{- range $index, $entry := .Values.workerPools }}
{{- $pool := deepCopy $root.Values.workerPoolDefaults }}
{{- include "taskherd.deepMerge" (list $pool (deepCopy $entry)) }}
{{- $_ := set $pool "index" $index }}
{{- $_ := set $pool "fullname" (printf "%s-%s" (include "taskherd.fullname" $root) (toString $pool.name) | trunc 63 | trimSuffix "-") }}
{{- if empty $pool.deadLetterQueues }}
{{- $dlqs := list }}
{{- range $pool.queues }}{{ $dlqs = append $dlqs (printf "%s.dlq" (toString .)) }}{{ end }}
{{- $_ := set $pool "deadLetterQueues" $dlqs }}
{{- end }}
{{- $hard := int $pool.timeLimits.hardSeconds }}
{{- $drain := add $hard (int $pool.drainMarginSeconds) }}
{{- $minGrace := add $drain (int $pool.shutdownSeconds) }}
{{- $_ := set $pool "drainSeconds" $drain }}
{{- $_ := set $pool "minGraceSeconds" $minGrace }}
{{- if kindIs "invalid" $pool.terminationGracePeriodSeconds }}
{{- $_ := set $pool "graceSeconds" $minGrace }}
{{- else }}
{{- $_ := set $pool "graceSeconds" (int $pool.terminationGracePeriodSeconds) }}
{{- end }}
{{- $pools = append $pools $pool }}
{{- end }}
{{- toYaml (dict "pools" $pools) }}
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

{{/* repository@digest when a digest is given (immutable), else repository:tag. */}}
{{- define "taskherd.image" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository (toString .tag) }}
{{- end }}
{{- end }}

{{/*
Every cross-field rule of the values, checked together: all problems are collected, then the
render fails once with one line per problem, each naming the key, its value and what is valid.
(Types, ranges and unknown keys are the schema's job: values.schema.json.)
*/}}
{{- define "taskherd.validateValues" -}}
{{- $errors := list }}
{{- $v := .Values }}
{{- if not $v.broker.existingSecret.name }}
{{- $errors = append $errors "broker.existingSecret.name: is empty; name the Secret holding the broker URL (kubectl create secret generic celery-broker --from-literal=url=redis://...), plain-text URLs are not accepted" }}
{{- end }}
{{- if not $v.broker.existingSecret.key }}
{{- $errors = append $errors "broker.existingSecret.key: is empty; give the key of the broker URL in the Secret (e.g. url)" }}
{{- end }}
{{- $seen := dict }}
{{- range $pool := (fromYaml (include "taskherd.pools" .)).pools }}
{{- $at := printf "workerPools[%d] (%s)" (int $pool.index) (toString $pool.name) }}
{{- if hasKey $seen (toString $pool.name) }}
{{- $errors = append $errors (printf "%s: name %q is used by another pool; pool names must be unique" $at (toString $pool.name)) }}
{{- end }}
{{- $_ := set $seen (toString $pool.name) true }}
{{- $soft := int $pool.timeLimits.softSeconds }}
{{- $hard := int $pool.timeLimits.hardSeconds }}
{{- if ge $soft $hard }}
{{- $errors = append $errors (printf "%s: timeLimits.softSeconds (%d) must be less than timeLimits.hardSeconds (%d), so the task gets SoftTimeLimitExceeded before it is killed" $at $soft $hard) }}
{{- end }}
{{- if lt (int $pool.graceSeconds) (int $pool.minGraceSeconds) }}
{{- $errors = append $errors (printf "%s: terminationGracePeriodSeconds (%d) is too short: it must be at least timeLimits.hardSeconds + drainMarginSeconds + shutdownSeconds = %d + %d + %d = %d, or a task within its time limit is SIGKILLed; leave it empty to derive it" $at (int $pool.graceSeconds) $hard (int $pool.drainMarginSeconds) (int $pool.shutdownSeconds) (int $pool.minGraceSeconds)) }}
{{- end }}
{{- if and (eq $v.broker.type "redis") (le (int $v.broker.visibilityTimeoutSeconds) $hard) }}
{{- $errors = append $errors (printf "broker.visibilityTimeoutSeconds (%d) must be greater than %s timeLimits.hardSeconds (%d): Redis would deliver a task again while it still runs" (int $v.broker.visibilityTimeoutSeconds) $at $hard) }}
{{- end }}
{{- if and (empty $pool.command) (not $pool.app) }}
{{- $errors = append $errors (printf "%s: app is empty; set the Celery application (celery -A <app>) or a full command" $at) }}
{{- end }}
{{- if empty $pool.queues }}
{{- $errors = append $errors (printf "%s: queues is empty; list at least one queue to consume" $at) }}
{{- else if ne (len $pool.deadLetterQueues) (len $pool.queues) }}
{{- $errors = append $errors (printf "%s: deadLetterQueues names %d queue(s) for %d queue(s) %s; give one dead-letter queue per queue, in the same order, or none for <queue>.dlq" $at (len $pool.deadLetterQueues) (len $pool.queues) (toJson $pool.queues)) }}
{{- else }}
{{- range $dlq := $pool.deadLetterQueues }}
{{- if has $dlq $pool.queues }}
{{- $errors = append $errors (printf "%s: deadLetterQueues contains %q, which is also one of its queues; a dead-letter queue must not be consumed as work" $at (toString $dlq)) }}
{{- end }}
{{- end }}
{{- if ne (len (uniq $pool.deadLetterQueues)) (len $pool.deadLetterQueues) }}
{{- $errors = append $errors (printf "%s: deadLetterQueues %s names a queue twice; each queue needs its own dead-letter queue" $at (toJson $pool.deadLetterQueues)) }}
{{- end }}
{{- end }}
{{- $as := $pool.autoscaling }}
{{- if $as.enabled }}
{{- if gt (int $as.minReplicas) (int $as.maxReplicas) }}
{{- $errors = append $errors (printf "%s: autoscaling.minReplicas (%d) must not exceed autoscaling.maxReplicas (%d)" $at (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- if not $v.operator.enabled }}
{{- $errors = append $errors (printf "%s: autoscaling.enabled is true but operator.enabled is false; nothing would scale the pool (disable autoscaling and set replicas, or enable the operator)" $at) }}
{{- end }}
{{- if ne (int $pool.metrics.port) (int $v.workerPoolDefaults.metrics.port) }}
{{- $errors = append $errors (printf "%s: metrics.port (%d) differs from workerPoolDefaults.metrics.port (%d); the operator reads busyness of autoscaled pools on the default port, so set it there" $at (int $pool.metrics.port) (int $v.workerPoolDefaults.metrics.port)) }}
{{- end }}
{{- if and $as.deadLetter.alertmanagerUrl $as.deadLetter.webhookUrl }}
{{- $errors = append $errors (printf "%s: autoscaling.deadLetter.alertmanagerUrl and autoscaling.deadLetter.webhookUrl are both set; choose one" $at) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $errors }}
{{- fail (printf "\n\ntaskherd: %d problem(s) in the values:\n  - %s\n" (len $errors) (join "\n  - " $errors)) }}
{{- end }}
{{- end }}
