{{/* NetworkPolicy egress rules shared by the worker and operator policies. */}}

{{- define "taskherd.networkPolicy.dnsEgress" -}}
- to:
    - namespaceSelector:
        matchLabels:
          {{- toYaml .dns.namespaceSelector | nindent 10 }}
      podSelector:
        matchLabels:
          {{- toYaml .dns.podSelector | nindent 10 }}
  ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end }}
{{- define "taskherd.networkPolicy.brokerEgress" -}}
- ports:
    {{- range .ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
  {{- with .networkPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
