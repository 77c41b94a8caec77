{{/* The effective worker pools: each `workerPools` entry merged over `workerPoolDefaults`. */}}

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
The effective pools, with the names and the derived durations computed once, here, so that every
template (and the validation) uses the same numbers. Returns YAML `pools: [...]`; use with fromYaml.
  index               position in workerPools
  fullname            Deployment / WorkerPool / PDB / ServiceAccount name
  serviceAccountName  the pod's ServiceAccount (the pool's own when serviceAccount.create)
  deadLetterQueues    one DLQ per queue: as written, or `<queue>.dlq` (taskherd.contract's default;
                      deadLetterQueuesDerived says which)
  drainSeconds        drain deadline = hard + drainMargin (TASKHERD_DRAIN_DEADLINE)
  minGraceSeconds     drain deadline + shutdown
  graceSeconds        terminationGracePeriodSeconds, explicit or derived (= minGraceSeconds)
Numbers are float64 after this round trip: render them with toJson (never %v: 1048576 would
print as 1.048576e+06). The schema bounds every number, so the sums below cannot overflow.
*/}}
{{- define "taskherd.pools" -}}
{{- $root := . }}
{{- $pools := list }}
{{- range $index, $entry := .Values.workerPools }}
{{- $pool := deepCopy $root.Values.workerPoolDefaults }}
{{- if kindIs "map" $entry }}
{{- include "taskherd.deepMerge" (list $pool (deepCopy $entry)) }}
{{- end }}
{{- $_ := set $pool "index" $index }}
{{- $_ := set $pool "fullname" (include "taskherd.componentName" (dict "root" $root "suffix" (toString $pool.name))) }}
{{- $sa := $pool.serviceAccount | default dict }}
{{- $_ := set $pool "serviceAccountName" (ternary (default $pool.fullname $sa.name) (default "default" $sa.name) (eq true $sa.create)) }}
{{- $_ := set $pool "deadLetterQueuesDerived" (empty $pool.deadLetterQueues) }}
{{- if empty $pool.deadLetterQueues }}
{{- $dlqs := list }}
{{- range $pool.queues }}{{ $dlqs = append $dlqs (printf "%s.dlq" (toString .)) }}{{ end }}
{{- $_ := set $pool "deadLetterQueues" $dlqs }}
{{- end }}
{{- $limits := $pool.timeLimits | default dict }}
{{- $hard := int64 ($limits.hardSeconds | default 0) }}
{{- $drain := add $hard (int64 ($pool.drainMarginSeconds | default 0)) }}
{{- $minGrace := add $drain (int64 ($pool.shutdownSeconds | default 0)) }}
{{- $_ := set $pool "drainSeconds" $drain }}
{{- $_ := set $pool "minGraceSeconds" $minGrace }}
{{- if kindIs "invalid" $pool.terminationGracePeriodSeconds }}
{{- $_ := set $pool "graceSeconds" $minGrace }}
{{- else }}
{{- $_ := set $pool "graceSeconds" (int64 $pool.terminationGracePeriodSeconds) }}
{{- end }}
{{- $pools = append $pools $pool }}
{{- end }}
{{- toYaml (dict "pools" $pools) }}
{{- end }}

{{/*
Where the user wrote a pool's key: `workerPools[<i>].<path>` when that entry sets it, else
`workerPoolDefaults.<path>` — so a message points at the line to change.
Call with (dict "root" $ "index" <i> "path" "timeLimits.hardSeconds"), or with "parts" (a list)
instead of "path" when a key itself holds a dot (resources.limits."nvidia.com/gpu").
*/}}
{{- define "taskherd.pool.key" -}}
{{- $node := index .root.Values.workerPools (int .index) }}
{{- $found := true }}
{{- $parts := .parts }}
{{- if not $parts }}{{ $parts = splitList "." .path }}{{ end }}
{{- range $part := $parts }}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) }}
{{- $node = get $node $part }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}workerPools[{{ .index }}].{{ join "." $parts }}{{ else }}workerPoolDefaults.{{ join "." $parts }}{{ end }}
{{- end }}

{{/*
The pool's profile as the contract's environment variables (taskherd.contract): what
taskherd.worker.configure() reads in every process of the pool's app, the worker and the processes
that publish as the pool's producers (beat, the `helm test` pod), so they declare its queues alike.
Call with (dict "root" $ "pool" $pool).
*/}}
{{- define "taskherd.pool.profileEnv" -}}
{{- $pool := .pool }}
- name: TASKHERD_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.broker.existingSecret.name }}
      key: {{ .root.Values.broker.existingSecret.key }}
- name: TASKHERD_BROKER_TYPE
  value: {{ .root.Values.broker.type | quote }}
- name: TASKHERD_QUEUES
  value: {{ join "," $pool.queues | quote }}
- name: TASKHERD_DEAD_LETTER_QUEUES
  value: {{ join "," $pool.deadLetterQueues | quote }}
- name: TASKHERD_SOFT_TIME_LIMIT
  value: {{ $pool.timeLimits.softSeconds | toJson | quote }}
- name: TASKHERD_TIME_LIMIT
  value: {{ $pool.timeLimits.hardSeconds | toJson | quote }}
- name: TASKHERD_VISIBILITY_TIMEOUT
  value: {{ .root.Values.broker.visibilityTimeoutSeconds | toJson | quote }}
- name: TASKHERD_MAX_TASKS_PER_CHILD
  value: {{ $pool.maxTasksPerChild | toJson | quote }}
- name: TASKHERD_MAX_MEMORY_PER_CHILD_KB
  value: {{ $pool.maxMemoryPerChildKb | toJson | quote }}
{{- end }}

{{/* Environment every pod running the app gets: its name, and Python on a read-only root filesystem. */}}
{{- define "taskherd.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The root filesystem is read-only: no .pyc files, and HOME on the writable /tmp.
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
{{- end }}

{{/* The pool chosen by name (beat.pool, tests.pool), else the first. Returns YAML; use fromYaml. */}}
{{- define "taskherd.pool.named" -}}
{{- $pools := (fromYaml (include "taskherd.pools" .root)).pools }}
{{- $chosen := dict }}
{{- if $pools }}{{ $chosen = index $pools 0 }}{{ end }}
{{- range $pools }}{{ if and $.name (eq (toString .name) (toString $.name)) }}{{ $chosen = . }}{{ end }}{{ end }}
{{- toYaml $chosen }}
{{- end }}
