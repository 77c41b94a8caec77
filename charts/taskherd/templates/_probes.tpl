{{/*
How the kubelet asks a worker one probe: (dict "pool" $pool "kind" "startup"|"readiness"|"liveness").
`http`: GET /startupz, /readyz or /livez on the worker's metrics port, answered by the worker's own
server (taskherd.worker.components.probes) — no process per probe. `exec`: `taskherd probe <kind>`,
a Python process per probe. Both judge the same heartbeat rules (taskherd.pod.probe).
*/}}
{{- define "taskherd.worker.probeAction" -}}
{{- if eq .pool.probes.type "http" }}
httpGet:
  path: {{ get (dict "startup" "/startupz" "readiness" "/readyz" "liveness" "/livez") .kind }}
  port: metrics
{{- else }}
exec:
  command: [taskherd, probe, {{ .kind }}]
{{- end }}
{{- end }}
