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
Call with (dict "root" $ "index" <i> "path" "timeLimits.hardSeconds").
*/}}
{{- define "taskherd.pool.key" -}}
{{- $node := index .root.Values.workerPools (int .index) }}
{{- $found := true }}
{{- range $part := splitList "." .path }}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) }}
{{- $node = get $node $part }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}workerPools[{{ .index }}].{{ .path }}{{ else }}workerPoolDefaults.{{ .path }}{{ end }}
{{- end }}
