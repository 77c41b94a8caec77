{{/*
An image reference: [registry/]repository then @digest (immutable, wins over the tag) or :tag.
The registry is global.imageRegistry when set (a mirror for every image, as bitnami charts do),
else image.registry; an empty tag means the chart's appVersion (as `helm create` charts do).
Call with (dict "root" $ "image" <image values>). The values are checked by
taskherd.validate.image: a numeric tag is refused there, never rendered (1.10 would be 1.1).
*/}}
{{- define "taskherd.image" -}}
{{- $registry := default .image.registry (((.root.Values.global | default dict).imageRegistry)) }}
{{- $name := .image.repository }}
{{- if $registry }}{{ $name = printf "%s/%s" (trimSuffix "/" $registry) $name }}{{ end }}
{{- if .image.digest }}
{{- printf "%s@%s" $name .image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .root.Chart.AppVersion (toString .image.tag)) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets entries from names or {name: …} maps (both spellings are accepted). */}}
{{- define "taskherd.imagePullSecrets" -}}
{{- with . }}
imagePullSecrets:
  {{- range . }}
  - name: {{ if kindIs "map" . }}{{ get . "name" }}{{ else }}{{ . }}{{ end }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
initContainers / sidecars: each gets the chart's container securityContext under its own (its own
keys win, an explicit false too: readOnlyRootFilesystem: false is kept; taskherd.validate refuses
what the restricted Pod Security Standard forbids). taskherd.deepMerge, not sprig's merge, which
takes false for "unset" and would overwrite it.
Call with (dict "root" $ "containers" <list>).
*/}}
{{- define "taskherd.extraContainers" -}}
{{- range .containers }}
{{- $c := deepCopy . }}
{{- $securityContext := deepCopy $.root.Values.containerSecurityContext }}
{{- if kindIs "map" .securityContext }}
{{- include "taskherd.deepMerge" (list $securityContext (deepCopy .securityContext)) }}
{{- end }}
{{- $_ := set $c "securityContext" $securityContext }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}
