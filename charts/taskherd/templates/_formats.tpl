{{/*
The formats Kubernetes and the container runtime accept, as regular expressions (RE2), with the
words a message uses to say what is valid. `queue`, `url` and `alertmanagerUrl` are also the
WorkerPool CRD's and the operator's (policy.py): tests/operator/test_workerpool_agreement.py
compares them. Read with: $f := fromYaml (include "taskherd.formats" .)
and `regexMatch (index $f "dnsLabel").re $value`.
*/}}
{{- define "taskherd.formats" -}}
dnsLabel:
  re: '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'
  valid: 'a DNS label: at most 63 lowercase letters, digits and "-", starting and ending with a letter or digit'
dnsSubdomain:
  re: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'
  valid: 'a DNS subdomain: lowercase letters, digits, "-" and ".", starting and ending with a letter or digit, at most 253 characters'
envName:
  re: '^[ -<>-~]+$'
  valid: 'an environment variable name: printable ASCII characters (space to ~) other than "="'
secretKey:
  re: '^[-._a-zA-Z0-9]+$'
  valid: 'a Secret key: letters, digits, "-", "_" and "."'
labelKey:
  re: '^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'
  valid: 'a label or annotation key: an optional DNS-subdomain prefix and "/", then at most 63 letters, digits, "-", "_" and ".", starting and ending with a letter or digit'
labelValue:
  re: '^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$'
  valid: 'a label value: empty, or at most 63 letters, digits, "-", "_" and ".", starting and ending with a letter or digit'
quantity:
  re: '^([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?[0-9]+)?$'
  valid: 'a Kubernetes quantity: a number with an optional suffix m, k, M, G, T, Ki, Mi, Gi, Ti (e.g. 500m, 256Mi, 1.5Gi)'
cidr:
  re: '^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])/(3[0-2]|[12]?[0-9])$|^[0-9a-fA-F]{0,4}(:[0-9a-fA-F]{0,4}){2,7}/(12[0-8]|1[01][0-9]|[1-9]?[0-9])$'
  valid: 'a CIDR: an IPv4 address and a prefix length 0-32 (10.0.0.0/8), or an IPv6 address and 0-128 (fd00::/8)'
url:
  re: '^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(/([^\s\p{Z}%\p{Cc}]|%[0-9A-Fa-f]{2})*)?$'
  valid: 'an http:// or https:// URL with a host name, a port from 1 to 65535 if any, no spaces or control characters, "%" only as %XX, at most 2048 characters'
alertmanagerUrl:
  re: '^https?://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?)(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(/([^\s\p{Z}?#%\p{Cc}]|%[0-9A-Fa-f]{2})*)?$'
  valid: 'Alertmanager''s base URL (/api/v2/alerts is added to it): an http:// or https:// URL with a host name, a port from 1 to 65535 if any, no ?query or #fragment, no spaces or control characters, "%" only as %XX, at most 2048 characters'
registry:
  re: '^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$'
  valid: 'a registry host with an optional port and path (registry.example.com:5000/mirror), no scheme, no tag'
repository:
  re: '^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?((\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*$'
  valid: 'an image name without tag or digest: lowercase path components separated by "/" (e.g. myorg/worker), optionally after a registry host'
tag:
  re: '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$'
  valid: 'an image tag: at most 128 letters, digits, "_", "." and "-", not starting with "." or "-"'
queue:
  re: '^[^,\s\p{Z}\p{Cc}]+$'
  valid: 'a queue name without commas, whitespace or control characters, at most 255 characters (the chart joins queue names with commas and writes them into YAML)'
celeryApp:
  re: '^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)?$'
  valid: 'a Python module path, optionally with :attribute (myproject.celery or myproject.celery:app)'
percent:
  re: '^(100|[1-9]?[0-9])%$'
  valid: 'a percentage 0%-100%'
{{- end }}

{{/*
A Kubernetes quantity as a plain number (float64), or the string "invalid" (also for a negative one).
Call with the value (a string such as "256Mi", or a number).
*/}}
{{- define "taskherd.quantityValue" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- if lt (float64 .) 0.0 }}{{ print "invalid" }}{{ else }}{{ toJson . }}{{ end }}
{{- else if not (regexMatch (fromYaml (include "taskherd.formats" dict)).quantity.re (toString .)) }}
{{- print "invalid" }}
{{- else }}
{{- $suffix := regexFind "(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)$" (toString .) }}
{{- $number := trimSuffix $suffix (toString .) }}
{{- $factors := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- mulf (float64 $number) (get $factors $suffix) | toJson }}
{{- end }}
{{- end }}
