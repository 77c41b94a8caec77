{{/* NetworkPolicy pieces shared by the worker, exporter, beat, operator and test policies. */}}

{{/* The broker ports: broker.ports as written, else derived from broker.type. Returns JSON. */}}
{{- define "taskherd.broker.ports" -}}
{{- if .Values.broker.ports }}
{{- toJson .Values.broker.ports }}
{{- else if eq .Values.broker.type "rabbitmq" }}
{{- toJson (list 5672 15672) }}
{{- else }}
{{- toJson (list 6379) }}
{{- end }}
{{- end }}

{{- define "taskherd.networkPolicy.dnsEgress" -}}
- to:
    - namespaceSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.namespaceSelector | nindent 10 }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podSelector | nindent 10 }}
  ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end }}

{{- define "taskherd.networkPolicy.brokerEgress" -}}
- ports:
    {{- range fromJsonArray (include "taskherd.broker.ports" .) }}
    - {port: {{ toJson . }}, protocol: TCP}
    {{- end }}
  {{- with .Values.broker.networkPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
