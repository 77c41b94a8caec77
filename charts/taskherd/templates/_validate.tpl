{{/*
Every rule the schema cannot express, checked together: each rule below prints one problem per
line, the lines are collected, and the render fails once with all of them. A problem names the
key as the user wrote it (a pool's key under workerPools[i] when that entry sets it, else under
workerPoolDefaults), its value, and what would be valid. Types, ranges and unknown keys are the
schema's job (values.schema.json), which Helm checks first.
*/}}
{{- define "taskherd.validateValues" -}}
{{- $ctx := dict "root" . "f" (fromYaml (include "taskherd.formats" .)) "pools" (fromYaml (include "taskherd.pools" .)).pools }}
{{- $errors := list }}
{{- range $rule := list "broker" "names" "images" "pools" "poolsTogether" "network" "operator" "monitoring" "beat" "tests" "metadata" "security" "extraDeploy" }}
{{- range splitList "\n" (include (printf "taskherd.validate.%s" $rule) $ctx) }}
{{- if trim . }}{{ $errors = append $errors (trim .) }}{{ end }}
{{- end }}
{{- end }}
{{- $errors = uniq $errors }}
{{- if $errors }}
{{- fail (printf "\n\ntaskherd: %d problem(s) in the values:\n  - %s\n" (len $errors) (join "\n  - " $errors)) }}
{{- end }}
{{- end }}

{{/* -- small checks shared by the rules; each prints a problem line or nothing ---------------- */}}

{{/* (dict "f" $f "format" "dnsSubdomain" "key" "broker.existingSecret.name" "value" $v "max" 253) */}}
{{- define "taskherd.check.format" -}}
{{- $format := index .f .format }}
{{- $value := toString .value }}
{{- if or (not (regexMatch $format.re $value)) (and .max (gt (len $value) (int .max))) }}
{{ .key }}={{ toJson .value }} is invalid; valid: {{ $format.valid }}
{{- end }}
{{- end }}

{{/* A map of labels: (dict "f" $f "key" "commonLabels" "labels" $map "reserved" true) */}}
{{- define "taskherd.check.labels" -}}
{{- $f := .f }}
{{- $reserved := splitList " " (include "taskherd.reservedLabels" dict) }}
{{- range $k, $v := .labels }}
{{- if not (regexMatch $f.labelKey.re $k) }}
{{ $.key }}: key {{ toJson $k }} is invalid; valid: {{ $f.labelKey.valid }}
{{- end }}
{{- if not (kindIs "string" $v) }}
{{ $.key }}.{{ $k }}={{ toJson $v }} is not a string; quote it ({{ $k }}: "{{ $v }}")
{{- else if not (regexMatch $f.labelValue.re $v) }}
{{ $.key }}.{{ $k }}={{ toJson $v }} is invalid; valid: {{ $f.labelValue.valid }}
{{- end }}
{{- if and $.reserved (has $k $reserved) }}
{{ $.key }}.{{ $k }} is set by the chart (selectors and standard labels); the chart's own labels cannot be overridden: remove it
{{- end }}
{{- end }}
{{- end }}

{{/* Annotation keys: (dict "f" $f "key" "commonAnnotations" "annotations" $map) */}}
{{- define "taskherd.check.annotations" -}}
{{- $f := .f }}
{{- range $k, $v := .annotations }}
{{- if not (regexMatch $f.labelKey.re $k) }}
{{ $.key }}: key {{ toJson $k }} is invalid; valid: {{ $f.labelKey.valid }}
{{- end }}
{{- if not (kindIs "string" $v) }}
{{ $.key }}.{{ $k }}={{ toJson $v }} is not a string; quote it ({{ $k }}: "{{ $v }}")
{{- end }}
{{- end }}
{{- end }}

{{/* imagePullSecrets entries: names or {name: …}. (dict "f" $f "key" … "secrets" $list) */}}
{{- define "taskherd.check.pullSecrets" -}}
{{- $f := .f }}
{{- range $i, $s := .secrets }}
{{- $name := $s }}
{{- if kindIs "map" $s }}{{ $name = get $s "name" }}{{ end }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsSubdomain" "key" (printf "%s[%d]" $.key $i) "value" $name "max" 253) }}
{{- end }}
{{- end }}

{{/* A URL that must be http(s) with a host: (dict "f" $f "key" … "value" …); empty is fine.
"format" "alertmanagerUrl" for a base URL that /api/v2/alerts is added to. */}}
{{- define "taskherd.check.url" -}}
{{- if .value }}
{{- include "taskherd.check.format" (dict "f" .f "format" (.format | default "url") "key" .key "value" .value "max" 2048) }}
{{- end }}
{{- end }}

{{/* NetworkPolicy peers: (dict "f" $f "key" "broker.networkPeers" "peers" $list) */}}
{{- define "taskherd.check.peers" -}}
{{- $f := .f }}
{{- range $i, $peer := .peers }}
{{- $at := printf "%s[%d]" $.key $i }}
{{- if not (kindIs "map" $peer) }}
{{ $at }}={{ toJson $peer }} is not a NetworkPolicy peer; valid: a map with ipBlock, or podSelector and/or namespaceSelector
{{- else }}
{{- range $k, $_ := $peer }}
{{- if not (has $k (list "ipBlock" "podSelector" "namespaceSelector")) }}
{{ $at }}: unknown key {{ toJson $k }}; valid: ipBlock, or podSelector and/or namespaceSelector (e.g. ipBlock: {cidr: 10.0.0.0/8})
{{- end }}
{{- end }}
{{- if not $peer }}
{{ $at }} is empty, which would match nothing; valid: ipBlock, or podSelector and/or namespaceSelector
{{- end }}
{{- if and (hasKey $peer "ipBlock") (or (hasKey $peer "podSelector") (hasKey $peer "namespaceSelector")) }}
{{ $at }}: ipBlock cannot be combined with podSelector or namespaceSelector in one peer; make them two peers
{{- end }}
{{- with $peer.ipBlock }}
{{- if not (kindIs "map" .) }}
{{ $at }}.ipBlock={{ toJson . }} is invalid; valid: {cidr: 10.0.0.0/8, except: [...]}
{{- else }}
{{- include "taskherd.check.format" (dict "f" $f "format" "cidr" "key" (printf "%s.ipBlock.cidr" $at) "value" (.cidr | default "")) }}
{{- range $j, $except := .except }}
{{- include "taskherd.check.format" (dict "f" $f "format" "cidr" "key" (printf "%s.ipBlock.except[%d]" $at $j) "value" $except) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $selector := list "podSelector" "namespaceSelector" }}
{{- $s := get $peer $selector }}
{{- if and (hasKey $peer $selector) (not (kindIs "map" $s)) }}
{{ $at }}.{{ $selector }}={{ toJson $s }} is invalid; valid: a label selector ({matchLabels: {...}})
{{- else if $s }}
{{- range $k, $_ := $s }}
{{- if not (has $k (list "matchLabels" "matchExpressions")) }}
{{ $at }}.{{ $selector }}: unknown key {{ toJson $k }}; valid: matchLabels, matchExpressions
{{- end }}
{{- end }}
{{- include "taskherd.check.labels" (dict "f" $f "key" (printf "%s.%s.matchLabels" $at $selector) "labels" ($s.matchLabels | default dict)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* NetworkPolicy egress or ingress rules: (dict "f" $f "key" … "rules" $list "peers" "to") */}}
{{- define "taskherd.check.policyRules" -}}
{{- $f := .f }}
{{- range $i, $rule := .rules }}
{{- $at := printf "%s[%d]" $.key $i }}
{{- if not (kindIs "map" $rule) }}
{{ $at }}={{ toJson $rule }} is not a NetworkPolicy rule; valid: a map with {{ $.peers }} and ports
{{- else }}
{{- range $k, $_ := $rule }}
{{- if not (has $k (list $.peers "ports")) }}
{{ $at }}: unknown key {{ toJson $k }}; valid: {{ $.peers }}, ports
{{- end }}
{{- end }}
{{- include "taskherd.check.peers" (dict "f" $f "key" (printf "%s.%s" $at $.peers) "peers" (get $rule $.peers | default list)) }}
{{- range $j, $p := ($rule.ports | default list) }}
{{- $pat := printf "%s.ports[%d]" $at $j }}
{{- if not (kindIs "map" $p) }}
{{ $pat }}={{ toJson $p }} is invalid; valid: {port: 5432, protocol: TCP}
{{- else }}
{{- range $k, $_ := $p }}
{{- if not (has $k (list "port" "protocol" "endPort")) }}
{{ $pat }}: unknown key {{ toJson $k }}; valid: port, protocol, endPort
{{- end }}
{{- end }}
{{- if and (hasKey $p "protocol") (not (has $p.protocol (list "TCP" "UDP" "SCTP"))) }}
{{ $pat }}.protocol={{ toJson $p.protocol }} is invalid; valid: TCP, UDP, SCTP (upper case)
{{- end }}
{{- if hasKey $p "port" }}
{{- if kindIs "string" $p.port }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsLabel" "key" (printf "%s.port" $pat) "value" $p.port "max" 15) }}
{{- else if or (not (or (kindIs "float64" $p.port) (kindIs "int64" $p.port) (kindIs "int" $p.port))) (lt (float64 $p.port) 1.0) (gt (float64 $p.port) 65535.0) (ne (float64 $p.port) (float64 (int64 $p.port))) }}
{{ $pat }}.port={{ toJson $p.port }} is invalid; valid: a port number 1-65535 or a named port
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Kubernetes EnvVar lists: (dict "f" $f "key" "workerPools[0].env" "env" $list "reserved" $names "why" "…")
A value must be a string (an unquoted 1 or true is refused by the API server).
*/}}
{{- define "taskherd.check.env" -}}
{{- $f := .f }}
{{- range $i, $e := .env }}
{{- $at := printf "%s[%d]" $.key $i }}
{{- if not (kindIs "map" $e) }}
{{ $at }}={{ toJson $e }} is not an environment variable; valid: {name: NAME, value: "text"} or {name: NAME, valueFrom: {...}}
{{- else }}
{{- range $k, $_ := $e }}
{{- if not (has $k (list "name" "value" "valueFrom")) }}
{{ $at }}: unknown key {{ toJson $k }}; valid: name, value, valueFrom
{{- end }}
{{- end }}
{{- if not (and (kindIs "string" $e.name) $e.name) }}
{{ $at }}.name={{ toJson $e.name }} is missing or not a string; every variable needs a name
{{- else if not (regexMatch $f.envName.re $e.name) }}
{{ $at }}.name={{ toJson $e.name }} is invalid; valid: {{ $f.envName.valid }}
{{- else if has $e.name $.reserved }}
{{ $at }}.name={{ toJson $e.name }} is set by the chart ({{ $.why }}); remove it here
{{- end }}
{{- if and (hasKey $e "value") (hasKey $e "valueFrom") }}
{{ $at }} ({{ $e.name }}) has both value and valueFrom; keep one
{{- end }}
{{- if and (hasKey $e "value") (not (kindIs "string" $e.value)) }}
{{ $at }}.value={{ toJson $e.value }} ({{ $e.name }}) is not a string; Kubernetes takes only strings: quote it (value: "{{ $e.value }}")
{{- end }}
{{- if and (hasKey $e "valueFrom") (not (kindIs "map" $e.valueFrom)) }}
{{ $at }}.valueFrom={{ toJson $e.valueFrom }} ({{ $e.name }}) is invalid; valid: {secretKeyRef: {name, key}}, {configMapKeyRef: …}, {fieldRef: …}, {resourceFieldRef: …}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Resources: names, quantities, request <= limit. (dict "f" $f "key" "operator.resources" "resources" $map);
a pool's, whose every entry may come from workerPoolDefaults, adds "root" $ "index" <i> so each
problem names the key where it was written.
*/}}
{{- define "taskherd.check.resources" -}}
{{- $r := .resources | default dict }}
{{- range $k, $_ := $r }}
{{- if not (has $k (list "requests" "limits" "claims")) }}
{{ $.key }}: unknown key {{ toJson $k }}; valid: requests, limits
{{- end }}
{{- end }}
{{- range $section := list "requests" "limits" }}
{{- $m := get $r $section }}
{{- if and (hasKey $r $section) (not (kindIs "map" $m)) (not (kindIs "invalid" $m)) }}
{{ include "taskherd.resources.key" (dict "at" $ "parts" (list $section)) }}={{ toJson $m }} is invalid; valid: a map such as {cpu: 100m, memory: 256Mi}
{{- else }}
{{- range $name, $q := ($m | default dict) }}
{{- $at := include "taskherd.resources.key" (dict "at" $ "parts" (list $section $name)) }}
{{- if not (or (has $name (list "cpu" "memory" "ephemeral-storage")) (regexMatch "^hugepages-[0-9]+[A-Za-z]*$" $name) (contains "/" $name)) }}
{{ $at }}: {{ toJson $name }} is not a resource name, and its value would be lost; valid: cpu, memory, ephemeral-storage, hugepages-<size> (e.g. hugepages-2Mi), or an extended resource with its domain (e.g. nvidia.com/gpu)
{{- else if eq (include "taskherd.quantityValue" $q) "invalid" }}
{{ $at }}={{ toJson $q }} is invalid; valid: {{ $.f.quantity.valid }}
{{- else if not (or (eq $name "cpu") (contains "/" $name)) }}
{{- include "taskherd.check.bytes" (dict "key" $at "value" $q) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $requests := $r.requests | default dict }}
{{- $limits := $r.limits | default dict }}
{{- if and (kindIs "map" $requests) (kindIs "map" $limits) }}
{{- range $name, $limit := $limits }}
{{- if hasKey $requests $name }}
{{- $lv := include "taskherd.quantityValue" $limit }}
{{- $rv := include "taskherd.quantityValue" (get $requests $name) }}
{{- if and (ne $lv "invalid") (ne $rv "invalid") (gt (float64 $rv) (float64 $lv)) }}
{{ include "taskherd.resources.key" (dict "at" $ "parts" (list "requests" $name)) }}={{ get $requests $name | toJson }} is more than {{ include "taskherd.resources.key" (dict "at" $ "parts" (list "limits" $name)) }}={{ toJson $limit }}; a request may not exceed its limit
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where a resources entry was written: (dict "at" <check.resources' arguments> "parts" (list "limits" "memory")) */}}
{{- define "taskherd.resources.key" -}}
{{- if .at.root }}
{{- include "taskherd.pool.key" (dict "root" .at.root "index" .at.index "parts" (prepend .parts "resources")) }}
{{- else }}
{{- .at.key }}.{{ join "." .parts }}
{{- end }}
{{- end }}

{{/*
A size in bytes (memory, storage), already a valid quantity: it needs a unit, and "m" is milli
(256m is a quarter of a byte), a mistake for Mi that Kubernetes accepts and then cannot run.
(dict "key" … "value" … "min" "16Mi"); min is optional.
*/}}
{{- define "taskherd.check.bytes" -}}
{{- $v := toString .value }}
{{- if hasSuffix "m" $v }}
{{ .key }}={{ toJson .value }} is in thousandths of a byte ("m" is milli); valid: a size with a byte unit, e.g. {{ trimSuffix "m" $v }}Mi (Ki, Mi, Gi: powers of 1024; k, M, G: of 1000)
{{- else if not (regexMatch "(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)$" $v) }}
{{ .key }}={{ toJson .value }} has no unit, so it is {{ $v }} bytes; valid: a size with a byte unit, e.g. 512Mi or 1Gi (Ki, Mi, Gi: powers of 1024; k, M, G: of 1000)
{{- else if and .min (lt (float64 (include "taskherd.quantityValue" .value)) (float64 (include "taskherd.quantityValue" .min))) }}
{{ .key }}={{ toJson .value }} is below {{ .min }}{{ with .why }} ({{ . }}){{ end }}; valid: at least {{ .min }}
{{- end }}
{{- end }}

{{/*
Extra containers (initContainers, sidecars) run in the restricted pod: they may not weaken the
chart's security context, which they inherit (their own keys win).
(dict "f" $f "key" "workerPools[0].sidecars" "containers" $list "taken" $names)
*/}}
{{- define "taskherd.check.containers" -}}
{{- $f := .f }}
{{- $seen := dict }}
{{- range $i, $c := .containers }}
{{- $at := printf "%s[%d]" $.key $i }}
{{- if not (kindIs "map" $c) }}
{{ $at }}={{ toJson $c }} is not a container; valid: a Kubernetes Container ({name, image, command, ...})
{{- else }}
{{- if not (and (kindIs "string" $c.name) (regexMatch $f.dnsLabel.re (toString $c.name))) }}
{{ $at }}.name={{ toJson $c.name }} is missing or invalid; valid: {{ $f.dnsLabel.valid }}
{{- else if or (has $c.name $.taken) (hasKey $seen $c.name) }}
{{ $at }}.name={{ toJson $c.name }} is already a container of this pod; container names must be unique
{{- end }}
{{- $_ := set $seen (toString $c.name) true }}
{{- if not (and (kindIs "string" $c.image) $c.image) }}
{{ $at }}.image={{ toJson $c.image }} is missing; every container needs an image
{{- end }}
{{- if and (hasKey $c "securityContext") (not (kindIs "map" $c.securityContext)) }}
{{ $at }}.securityContext={{ toJson $c.securityContext }} is invalid; valid: a SecurityContext map ({runAsUser: 1000, ...}), or leave it out for the chart's
{{- else if $c.securityContext }}
{{- include "taskherd.check.restrictedSecurityContext" (dict "key" (printf "%s.securityContext" $at) "sc" $c.securityContext) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
RabbitMQ's consumer_timeout as the pool's worker knows it: TASKHERD_RABBITMQ_CONSUMER_TIMEOUT from
the pool's env, else the broker's default (1800 s). taskherd.worker.configure refuses to start when
the hard time limit is not below it (RabbitMQ would close the channel of a task running that long
and deliver it again while it runs), so the chart refuses first, with the key to change.
A value from valueFrom cannot be read here; the worker checks it.
(dict "root" $ "pool" $pool "k" <the pool's keys as written>)
*/}}
{{- define "taskherd.check.consumerTimeout" -}}
{{- $timeout := 1800.0 }}
{{- $from := "the broker's default" }}
{{- $known := true }}
{{- range $j, $e := .pool.env }}
{{- if and (kindIs "map" $e) (eq (toString $e.name) "TASKHERD_RABBITMQ_CONSUMER_TIMEOUT") }}
{{- $at := printf "%s[%d]" (index $.k "env") $j }}
{{- if not (hasKey $e "value") }}
{{- $known = false }}
{{- else if and (kindIs "string" $e.value) (regexMatch "^[0-9]+(\\.[0-9]+)?$" $e.value) (gt (float64 $e.value) 0.0) (le (float64 $e.value) 2592000.0) }}
{{- $timeout = float64 $e.value }}
{{- $from = printf "from %s" $at }}
{{- else }}
{{- $known = false }}
{{- if kindIs "string" $e.value }}
{{ $at }}.value={{ toJson $e.value }} (TASKHERD_RABBITMQ_CONSUMER_TIMEOUT) is invalid; valid: a number of seconds > 0 and <= 2592000 (30 days, taskherd.contract), the broker's consumer_timeout (rabbitmq.conf gives it in milliseconds: 3600000 is "3600")
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $hard := float64 .pool.timeLimits.hardSeconds }}
{{- if and $known (eq .root.Values.broker.type "rabbitmq") (ge $hard $timeout) }}
{{ index .k "timeLimits.hardSeconds" }}={{ toJson .pool.timeLimits.hardSeconds }} must be below RabbitMQ's consumer_timeout ({{ toJson $timeout }} s, {{ $from }}): RabbitMQ closes the channel of a task running that long and delivers it again while it runs, and the worker refuses to start; lower it, or raise consumer_timeout in the broker's rabbitmq.conf (milliseconds there) and give the worker the same value in seconds: {name: TASKHERD_RABBITMQ_CONSUMER_TIMEOUT, value: "{{ mul 2 (int64 $hard) }}"} in {{ index .k "env" }}
{{- end }}
{{- end }}

{{/*
More than one operator replica is safe only with leader election: without it every replica polls,
scales and pages (twice the scaling, every page twice). Off through --no-leader-election or
TASKHERD_LEADER_ELECTION (a false value as taskherd.contract's flag reads it). Call with operator.*.
*/}}
{{- define "taskherd.check.leaderElection" -}}
{{- if and .enabled (gt (int64 .replicas) 1) }}
{{- $why := printf "with operator.replicas=%d every replica would lead: each scales the pools and pages for the same dead letters; valid: operator.replicas=1 with it, or remove it (the replicas elect one leader on a Lease)" (int64 .replicas) }}
{{- range $j, $arg := .extraArgs }}
{{- if eq (toString $arg) "--no-leader-election" }}
operator.extraArgs[{{ $j }}]={{ toJson $arg }} turns leader election off, but {{ $why }}
{{- end }}
{{- end }}
{{- range $j, $e := .env }}
{{- if and (kindIs "map" $e) (eq (toString $e.name) "TASKHERD_LEADER_ELECTION") (kindIs "string" $e.value) (has (lower $e.value) (list "0" "false" "no" "off")) }}
operator.env[{{ $j }}] (TASKHERD_LEADER_ELECTION={{ toJson $e.value }}) turns leader election off, but {{ $why }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A container's own securityContext under the restricted Pod Security Standard the chart promises:
each setting the standard forbids is refused with its key (kubernetes.io/docs/concepts/security/
pod-security-standards). readOnlyRootFilesystem is the chart's choice, not the standard's: a
container may set it false. (dict "key" "workerPools[0].sidecars[0].securityContext" "sc" $map)
*/}}
{{- define "taskherd.check.restrictedSecurityContext" -}}
{{- $sc := .sc }}
{{- $why := "pods run under the restricted Pod Security Standard" }}
{{- range $field := list "privileged" "allowPrivilegeEscalation" "runAsNonRoot" "readOnlyRootFilesystem" }}
{{- if and (hasKey $sc $field) (not (kindIs "bool" (get $sc $field))) }}
{{ $.key }}.{{ $field }}={{ toJson (get $sc $field) }} is not a boolean; valid: true or false, unquoted
{{- end }}
{{- end }}
{{- if and (kindIs "bool" $sc.privileged) $sc.privileged }}
{{ .key }}.privileged=true is refused: {{ $why }}
{{- end }}
{{- if and (kindIs "bool" $sc.allowPrivilegeEscalation) $sc.allowPrivilegeEscalation }}
{{ .key }}.allowPrivilegeEscalation=true is refused: {{ $why }}; valid: false
{{- end }}
{{- if and (kindIs "bool" $sc.runAsNonRoot) (not $sc.runAsNonRoot) }}
{{ .key }}.runAsNonRoot=false is refused: {{ $why }}; valid: true
{{- end }}
{{- if and (hasKey $sc "runAsUser") (eq (toString $sc.runAsUser) "0") }}
{{ .key }}.runAsUser=0 is refused: {{ $why }} (non-root)
{{- end }}
{{- with $sc.seccompProfile }}
{{- if not (and (kindIs "map" .) (has .type (list "RuntimeDefault" "Localhost"))) }}
{{ $.key }}.seccompProfile={{ toJson . }} is refused: {{ $why }}; valid: {type: RuntimeDefault}, or {type: Localhost, localhostProfile: …}
{{- end }}
{{- end }}
{{- with $sc.appArmorProfile }}
{{- if and (kindIs "map" .) (eq (toString .type) "Unconfined") }}
{{ $.key }}.appArmorProfile.type="Unconfined" is refused: {{ $why }}; valid: RuntimeDefault or Localhost
{{- end }}
{{- end }}
{{- if and (hasKey $sc "procMount") (ne (toString $sc.procMount) "Default") }}
{{ .key }}.procMount={{ toJson $sc.procMount }} is refused: {{ $why }}; valid: Default
{{- end }}
{{- if and (kindIs "map" $sc.windowsOptions) (kindIs "bool" $sc.windowsOptions.hostProcess) $sc.windowsOptions.hostProcess }}
{{ .key }}.windowsOptions.hostProcess=true is refused: {{ $why }}
{{- end }}
{{- with $sc.capabilities }}
{{- if not (kindIs "map" .) }}
{{ $.key }}.capabilities={{ toJson . }} is invalid; valid: {drop: [ALL]}, optionally with add: [NET_BIND_SERVICE]
{{- else }}
{{- if and (hasKey . "drop") (not (has "ALL" (.drop | default list))) }}
{{ $.key }}.capabilities.drop={{ toJson .drop }} replaces the chart's [ALL]: {{ $why }}, which must drop ALL; valid: [ALL] (leave drop out to keep the chart's)
{{- end }}
{{- range (.add | default list) }}
{{- if ne . "NET_BIND_SERVICE" }}
{{ $.key }}.capabilities.add contains {{ toJson . }}; the restricted Pod Security Standard allows only NET_BIND_SERVICE
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* -- the rules ------------------------------------------------------------------------------ */}}

{{- define "taskherd.validate.broker" -}}
{{- $f := .f }}
{{- $b := .root.Values.broker }}
{{- $s := $b.existingSecret }}
{{- if not $s.name }}
broker.existingSecret.name is empty; name the Secret holding the broker URL (kubectl create secret generic celery-broker --from-literal=url=redis://...), plain-text URLs are not accepted
{{- else }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsSubdomain" "key" "broker.existingSecret.name" "value" $s.name "max" 253) }}
{{- end }}
{{- if not $s.key }}
broker.existingSecret.key is empty; give the key of the broker URL in the Secret (e.g. url)
{{- else }}
{{- include "taskherd.check.format" (dict "f" $f "format" "secretKey" "key" "broker.existingSecret.key" "value" $s.key "max" 253) }}
{{- end }}
{{- if $s.managementUrlKey }}
{{- include "taskherd.check.format" (dict "f" $f "format" "secretKey" "key" "broker.existingSecret.managementUrlKey" "value" $s.managementUrlKey "max" 253) }}
{{- if ne $b.type "rabbitmq" }}
broker.existingSecret.managementUrlKey={{ toJson $s.managementUrlKey }} is read only for broker.type rabbitmq (the management API), but broker.type is {{ toJson $b.type }}; remove it
{{- end }}
{{- end }}
{{- $ports := list }}
{{- range $b.ports }}{{ $ports = append $ports (int .) }}{{ end }}
{{- if ne (len (uniq $ports)) (len $ports) }}
broker.ports={{ toJson $b.ports }} lists a port twice
{{- end }}
{{- if and (eq $b.type "rabbitmq") (eq (toJson $ports) "[6379]") }}
broker.ports=[6379] is Redis's port, but broker.type is rabbitmq; leave broker.ports empty to allow RabbitMQ's [5672, 15672] (AMQP and the management API), or list the ports your broker listens on
{{- end }}
{{- $v := .root.Values }}
{{- if and (eq $b.type "rabbitmq") $ports (not (has 15672 $ports)) (not $s.managementUrlKey) $v.networkPolicy.enabled (or $v.operator.enabled $v.exporter.enabled) }}
broker.ports={{ toJson $b.ports }} lacks 15672, the RabbitMQ management API the operator and the exporter read queues from (the broker's host, port 15672, as broker.existingSecret.managementUrlKey is empty): the NetworkPolicies would block it; add 15672, or set managementUrlKey to a Secret key holding the management URL and list its port
{{- end }}
{{- if and (eq $b.type "redis") $ports (not (without $ports 5672 15672)) }}
broker.ports={{ toJson $b.ports }} are RabbitMQ's ports, but broker.type is redis; leave broker.ports empty to allow Redis's [6379], or list the port your Redis listens on
{{- end }}
{{- include "taskherd.check.peers" (dict "f" $f "key" "broker.networkPeers" "peers" $b.networkPeers) }}
{{- end }}

{{/*
Object names: every object of a kind has a distinct name. The prefix is trimmed before a suffix
is added (taskherd.componentName), so only a real clash remains: a pool named like a component
(operator, exporter, beat), or two suffixes that meet after the prefix was trimmed.
*/}}
{{- define "taskherd.validate.names" -}}
{{- $root := .root }}
{{- $f := .f }}
{{- $v := $root.Values }}
{{- range $key := list "fullnameOverride" "nameOverride" }}
{{- with get $v $key }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString .)) }}
{{ $key }}={{ toJson . }} is invalid; valid: lowercase letters, digits and "-", starting and ending with a letter or digit (longer than 63 characters is cut to 63)
{{- end }}
{{- end }}
{{- end }}
{{- $names := dict }}
{{- $claims := list }}
{{- if $v.operator.enabled }}
{{- $op := include "taskherd.operator.fullname" $root }}
{{- $claims = concat $claims (list (list "Deployment" $op "the operator (operator.enabled)") (list "ServiceAccount" $op "the operator (operator.enabled)")) }}
{{- if $v.operator.podDisruptionBudget.enabled }}
{{- $claims = append $claims (list "PodDisruptionBudget" $op "the operator (operator.podDisruptionBudget.enabled)") }}
{{- end }}
{{- end }}
{{- if $v.exporter.enabled }}
{{- $claims = append $claims (list "Deployment" (include "taskherd.exporter.fullname" $root) "the exporter (exporter.enabled)") }}
{{- end }}
{{- if $v.beat.enabled }}
{{- $claims = append $claims (list "Deployment" (include "taskherd.beat.fullname" $root) "Celery beat (beat.enabled)") }}
{{- end }}
{{- range $pool := .pools }}
{{- $at := printf "workerPools[%d].name=%s" (int $pool.index) (toJson $pool.name) }}
{{- $claims = append $claims (list "Deployment" $pool.fullname $at) }}
{{- if and $pool.autoscaling.enabled $v.operator.enabled }}
{{- $claims = append $claims (list "WorkerPool" $pool.fullname $at) }}
{{- end }}
{{- if $pool.podDisruptionBudget.enabled }}
{{- $claims = append $claims (list "PodDisruptionBudget" $pool.fullname $at) }}
{{- end }}
{{- if and $pool.serviceAccount.create $pool.serviceAccount.name }}
{{- $saKey := include "taskherd.pool.key" (dict "root" $root "index" $pool.index "path" "serviceAccount.name") }}
{{- $claims = append $claims (list "ServiceAccount" $pool.serviceAccountName (printf "%s=%s (pool %s, serviceAccount.create)" $saKey (toJson $pool.serviceAccount.name) (toJson $pool.name)) "choose another serviceAccount.name, or let one pool create it and the others use it with serviceAccount.create=false") }}
{{- else if $pool.serviceAccount.create }}
{{- $claims = append $claims (list "ServiceAccount" $pool.serviceAccountName (printf "%s (serviceAccount.create)" $at)) }}
{{- end }}
{{- end }}
{{- range $claim := $claims }}
{{- $id := printf "%s/%s" (index $claim 0) (index $claim 1) }}
{{- if hasKey $names $id }}
{{ index $claim 2 }}: {{ $id }} is also the name of {{ get $names $id }}; two objects cannot share a name: {{ if gt (len $claim) 3 }}{{ index $claim 3 }}{{ else }}choose another pool name (or a shorter fullnameOverride){{ end }}
{{- else }}
{{- $_ := set $names $id (index $claim 2) }}
{{- end }}
{{- end }}
{{- end }}

{{/* One image: (dict "ctx" $ctx "image" $img "key" (function of the field -> key as written)) */}}
{{- define "taskherd.check.image" -}}
{{- $f := .f }}
{{- $img := .image }}
{{- $registry := default $img.registry (.global.imageRegistry | default "") }}
{{- $registryKey := ternary "global.imageRegistry" .keys.registry (not (empty .global.imageRegistry)) }}
{{- if $registry }}
{{- include "taskherd.check.format" (dict "f" $f "format" "registry" "key" $registryKey "value" $registry "max" 255) }}
{{- end }}
{{- if not (regexMatch $f.repository.re (toString $img.repository)) }}
{{ .keys.repository }}={{ toJson $img.repository }} is invalid; valid: {{ $f.repository.valid }}{{ if contains ":" (toString $img.repository) }} (put a tag in {{ .keys.tag }}, a digest in {{ .keys.digest }}){{ end }}
{{- else if and $registry (regexMatch "^([^/]*[.:][^/]*|localhost)/" (toString $img.repository)) }}
{{ .keys.repository }}={{ toJson $img.repository }} starts with a registry host, and the registry is already {{ toJson $registry }} ({{ $registryKey }}); the image would be {{ $registry }}/{{ $img.repository }}: put the host in {{ .keys.registry }} and the rest in {{ .keys.repository }}
{{- end }}
{{- if or (kindIs "float64" $img.tag) (kindIs "int64" $img.tag) (kindIs "int" $img.tag) }}
{{ .keys.tag }}={{ toJson $img.tag }} is a number, not a tag: YAML reads 1.10 as 1.1 and 1.0 as 1; quote it ({{ .keys.tag }}: "{{ $img.tag }}")
{{- else if and $img.tag (not (regexMatch $f.tag.re (toString $img.tag))) }}
{{ .keys.tag }}={{ toJson $img.tag }} is invalid; valid: {{ $f.tag.valid }}
{{- end }}
{{- end }}

{{- define "taskherd.validate.images" -}}
{{- $ctx := . }}
{{- $v := .root.Values }}
{{- $global := $v.global | default dict }}
{{- range $component := list "operator" "exporter" }}
{{- $keys := dict }}
{{- range $field := list "registry" "repository" "tag" "digest" }}{{ $_ := set $keys $field (printf "%s.image.%s" $component $field) }}{{ end }}
{{- include "taskherd.check.image" (dict "f" $ctx.f "image" (get $v $component).image "keys" $keys "global" $global) }}
{{- end }}
{{- range $pool := .pools }}
{{- $keys := dict }}
{{- range $field := list "registry" "repository" "tag" "digest" }}
{{- $_ := set $keys $field (include "taskherd.pool.key" (dict "root" $ctx.root "index" $pool.index "path" (printf "image.%s" $field))) }}
{{- end }}
{{- include "taskherd.check.image" (dict "f" $ctx.f "image" $pool.image "keys" $keys "global" $global) }}
{{- end }}
{{- end }}

{{/* Celery worker options the chart derives from values: extraArgs may not set them again. */}}
{{- define "taskherd.reservedWorkerArgs" -}}
--time-limit: "set timeLimits.hardSeconds instead: the pod's grace period is derived from it"
--soft-time-limit: "set timeLimits.softSeconds instead"
--prefetch-multiplier: "taskherd.worker.configure fixes the prefetch at 1 (with late acks a worker must not hold messages another could run)"
--concurrency: "set concurrency instead (the chart passes it)"
-c: "set concurrency instead (the chart passes it)"
--queues: "set queues instead (the chart passes it)"
-Q: "set queues instead (the chart passes it)"
--exclude-queues: "set queues instead (the chart passes it)"
-X: "set queues instead (the chart passes it)"
--max-tasks-per-child: "set maxTasksPerChild instead (the chart passes it)"
--max-memory-per-child: "set maxMemoryPerChildKb instead (the chart passes it)"
--without-mingle: "set mingle instead (false, the default, passes it)"
--without-gossip: "set gossip instead (false, the default, passes it)"
--loglevel: "set logLevel instead (the chart passes it)"
-l: "set logLevel instead (the chart passes it)"
--app: "set app instead (the chart passes it)"
-A: "set app instead (the chart passes it)"
--autoscale: "the operator scales pods (autoscaling); Celery's autoscale would change the concurrency the limits assume"
--beat: "every replica would run its own beat and send each periodic task once per replica: set beat.enabled instead"
-B: "every replica would run its own beat and send each periodic task once per replica: set beat.enabled instead"
--detach: "a detached worker leaves the container, which then exits"
-D: "a detached worker leaves the container, which then exits"
--pool: "only prefork enforces the hard time limit the grace period is derived from and keeps tasks off the heartbeat loop"
-P: "only prefork enforces the hard time limit the grace period is derived from and keeps tasks off the heartbeat loop"
{{- end }}

{{/* Celery beat options the chart sets: beat.extraArgs may not set them again. */}}
{{- define "taskherd.reservedBeatArgs" -}}
--schedule: "the chart keeps beat's schedule file on its writable emptyDir (/run/taskherd/beat); to keep last run times across restarts set beat.scheduler (a database scheduler)"
-s: "the chart keeps beat's schedule file on its writable emptyDir (/run/taskherd/beat); to keep last run times across restarts set beat.scheduler (a database scheduler)"
--max-interval: "set beat.maxIntervalSeconds instead: the liveness probe's max age is derived from it"
--detach: "a detached beat leaves the container, which then exits"
-D: "a detached beat leaves the container, which then exits"
--pidfile: "the root filesystem is read-only, and one beat runs per release (one replica, Recreate): beat needs no pidfile"
--app: "set the app of beat.pool instead (the chart passes it)"
-A: "set the app of beat.pool instead (the chart passes it)"
{{- end }}

{{/* Operator options the chart sets or derives: operator.extraArgs may not set them again. */}}
{{- define "taskherd.reservedOperatorArgs" -}}
--liveness: "set operator.healthPort instead: the chart serves /healthz on 0.0.0.0 at that port, and the liveness and readiness probes and the container port are derived from it (another address or port fails them: a restart loop)"
--metrics-port: "set operator.metricsPort instead: the container port, the NetworkPolicy and the ServiceMonitor are derived from it (another port is never scraped)"
--namespace: "the operator watches the release namespace, the only one its Role reaches (another one answers 403); install a release in each namespace that runs pools"
-n: "the operator watches the release namespace, the only one its Role reaches (another one answers 403); install a release in each namespace that runs pools"
--lease-namespace: "the chart creates the leader-election Lease in the release namespace, the only one its Role reaches (another one answers 403)"
--verbose: "set operator.verbose=true instead (the chart passes it)"
{{- end }}

{{/* The operator's options the chart leaves to extraArgs: with reservedOperatorArgs, every option
`python -m taskherd.operator` has (tests/chart/test_operator_args.py compares them with its parser).
The operator is this chart's appVersion, so the chart knows its whole command line: any other entry
makes it exit at start, a restart loop. */}}
{{- define "taskherd.operatorExtraOptions" -}}
--dry-run: "log every write as '**DRY-RUN**: would …' instead of making it"
--no-leader-election: "one replica, no Lease (with operator.replicas=1 only)"
{{- end }}

{{/*
One extraArgs entry of a program the chart starts: (dict "key" "workerPools[0].extraArgs[2]" "arg" …
"reserved" <reservedWorkerArgs, reservedBeatArgs or reservedOperatorArgs> "program" "the worker"),
optionally "allow" (a regex of entries that name a reserved option but are what the chart sets:
--pool=prefork) and "only" (the program's other options, when the chart knows its whole command
line: any other entry is refused). Refused: a reserved option, written whole or as an abbreviation
(a prefix of at least 3 letters: --time for --time-limit; argparse would take it, or the program
refuses it and its container never starts), an option with its value or two options in one entry
("--time-limit 600"), which reaches the program as one unknown option name, and with "only" an
entry that is none of the program's options.
*/}}
{{- define "taskherd.check.extraArg" -}}
{{- $flag := regexReplaceAll "^(--[^=\\s]+)[=\\s].*$|^(-[A-Za-z]).+$" .arg "${1}${2}" }}
{{- $option := "" }}
{{- if hasKey .reserved $flag }}
{{- $option = $flag }}
{{- else if and (hasPrefix "--" $flag) (ge (len $flag) 5) }}
{{- range $name := keys .reserved | sortAlpha }}
{{- if and (not $option) (hasPrefix $flag $name) }}{{ $option = $name }}{{ end }}
{{- end }}
{{- end }}
{{- if and $option (not (and .allow (regexMatch .allow .arg))) }}
{{ .key }}={{ toJson .arg }} is refused{{ if ne $option $flag }} ({{ $flag }} abbreviates {{ $option }}){{ end }}: {{ get .reserved $option }}
{{- else if and (hasPrefix "--" .arg) (regexMatch "\\s+-" .arg) }}
{{ .key }}={{ toJson .arg }} holds several options in one entry, which {{ .program }} reads as one unknown option; valid: one entry each ({{ regexSplit "\\s+" (trim .arg) -1 | join ", " }})
{{- else if and (hasPrefix "--" .arg) (regexMatch "\\s" .arg) }}
{{ .key }}={{ toJson .arg }} holds an option and its value in one entry, which {{ .program }} reads as one unknown option; valid: "{{ $flag }}=<value>", or two entries ("{{ $flag }}", "<value>")
{{- else if and .only (not (hasKey .only .arg)) }}
{{ .key }}={{ toJson .arg }} is not an option {{ .program }} runs with: it would exit at start (a restart loop); valid: {{ keys .only | sortAlpha | join ", " }} (the chart sets the others from its values)
{{- end }}
{{- end }}

{{/*
A queue name the broker and the WorkerPool CRD refuse although the queue format allows it: over 255
bytes of UTF-8 (RabbitMQ's limit; the schema's maxLength counts characters, sprig's len bytes) or
holding an invisible format character (Unicode Cf: U+200B, U+FEFF, U+00AD…, a name that looks like
another queue's). (dict "key" "workerPools[0].queues" "name" …); empty when the name is fine.
*/}}
{{- define "taskherd.check.queueBytes" -}}
{{- if gt (len .name) 255 }}
{{ .key }} contains a queue name of {{ len .name }} bytes in UTF-8 ({{ toJson (trunc 40 .name) }}…); valid: at most 255 bytes (RabbitMQ's limit on a queue name)
{{- else if regexMatch "\\p{Cf}" .name }}
{{ .key }} contains {{ toJson .name }}, which holds an invisible format character (Unicode category Cf, e.g. U+200B zero-width space); valid: a queue name without them (it would look like another queue's)
{{- end }}
{{- end }}

{{/* Environment variables the chart sets on the worker (taskherd.contract): env may not repeat them. */}}
{{- define "taskherd.workerEnvNames" -}}
TASKHERD_BROKER_URL TASKHERD_BROKER_TYPE TASKHERD_QUEUES TASKHERD_DEAD_LETTER_QUEUES TASKHERD_SOFT_TIME_LIMIT TASKHERD_TIME_LIMIT TASKHERD_VISIBILITY_TIMEOUT TASKHERD_DRAIN_DEADLINE TASKHERD_MAX_TASKS_PER_CHILD TASKHERD_MAX_MEMORY_PER_CHILD_KB TASKHERD_HEARTBEAT_DIR TASKHERD_HEARTBEAT_INTERVAL TASKHERD_METRICS_PORT TASKHERD_METRICS_DIR POD_NAME POD_NAMESPACE
{{- end }}

{{/* Each pool on its own. */}}
{{- define "taskherd.validate.pools" -}}
{{- $ctx := . }}
{{- $root := .root }}
{{- $f := .f }}
{{- $v := $root.Values }}
{{- $reservedArgs := fromYaml (include "taskherd.reservedWorkerArgs" $root) }}
{{- $reservedEnv := splitList " " (include "taskherd.workerEnvNames" $root) }}
{{- range $pool := .pools }}
{{- $i := int $pool.index }}
{{- $entry := index $v.workerPools $i }}
{{- $k := dict }}
{{- range $path := list "app" "concurrency" "queues" "deadLetterQueues" "command" "extraArgs" "timeLimits.softSeconds" "timeLimits.hardSeconds" "terminationGracePeriodSeconds" "drainMarginSeconds" "shutdownSeconds" "maxMemoryPerChildKb" "resources" "resources.limits.memory" "scratchSizeLimit" "env" "envFrom" "extraVolumes" "extraVolumeMounts" "metrics.port" "replicas" "autoscaling.enabled" "autoscaling.minReplicas" "autoscaling.maxReplicas" "autoscaling.deadLetter.alertmanagerUrl" "autoscaling.deadLetter.webhookUrl" "podDisruptionBudget.maxUnavailable" "podLabels" "podAnnotations" "nodeSelector" "imagePullSecrets" "priorityClassName" "serviceAccount.create" "serviceAccount.name" "serviceAccount.annotations" "probes.startup.periodSeconds" "probes.startup.failureThreshold" "initContainers" "sidecars" }}
{{- $_ := set $k $path (include "taskherd.pool.key" (dict "root" $root "index" $i "path" $path)) }}
{{- end }}
{{- /* app and command */}}
{{- if and (empty $pool.command) (not $pool.app) }}
workerPools[{{ $i }}].app is empty (pool {{ toJson $pool.name }}), and so is workerPoolDefaults.app; set the Celery application (celery -A <app>) in either, or a full command
{{- else if and (empty $pool.command) (not (regexMatch $f.celeryApp.re (toString $pool.app))) }}
{{ $k.app }}={{ toJson $pool.app }} is invalid; valid: {{ $f.celeryApp.valid }}
{{- end }}
{{- if and $pool.command $pool.extraArgs }}
{{ $k.extraArgs }}={{ toJson $pool.extraArgs }} would be ignored: {{ $k.command }} replaces the whole command; put the arguments in the command
{{- end }}
{{- if empty $pool.command }}
{{- range $j, $arg := $pool.extraArgs }}
{{- include "taskherd.check.extraArg" (dict "key" (printf "%s[%d]" $k.extraArgs $j) "arg" (toString $arg) "reserved" $reservedArgs "program" "the worker" "allow" "^(--pool=|-P)prefork$") }}
{{- end }}
{{- end }}
{{- /* queues and their dead-letter queues */}}
{{- if empty $pool.queues }}
{{ $k.queues }} is empty (pool {{ toJson $pool.name }}); list at least one queue to consume
{{- else }}
{{- range $q := $pool.queues }}
{{- if not (regexMatch $f.queue.re (toString $q)) }}
{{ $k.queues }} contains {{ toJson $q }}, which is invalid; valid: {{ $f.queue.valid }}
{{- else }}
{{- include "taskherd.check.queueBytes" (dict "key" $k.queues "name" (toString $q)) }}
{{- if and $pool.deadLetterQueuesDerived (le (len (toString $q)) 255) (gt (len (toString $q)) 251) }}
{{ $k.queues }} contains a queue name of {{ len (toString $q) }} bytes in UTF-8 ({{ toJson (trunc 40 (toString $q)) }}…): its dead-letter queue <queue>.dlq would be longer than 255; valid: at most 251 bytes, or name the dead-letter queues in workerPools[{{ $i }}].deadLetterQueues
{{- end }}
{{- end }}
{{- end }}
{{- if ne (len (uniq $pool.queues)) (len $pool.queues) }}
{{ $k.queues }}={{ toJson $pool.queues }} names a queue twice
{{- end }}
{{- if ne (len $pool.deadLetterQueues) (len $pool.queues) }}
{{ $k.deadLetterQueues }}={{ toJson $pool.deadLetterQueues }} names {{ len $pool.deadLetterQueues }} queue(s) for the {{ len $pool.queues }} of {{ $k.queues }}={{ toJson $pool.queues }}; give one dead-letter queue per queue, in the same order, or none for <queue>.dlq
{{- else }}
{{- range $dlq := $pool.deadLetterQueues }}
{{- if and (not $pool.deadLetterQueuesDerived) (not (regexMatch $f.queue.re (toString $dlq))) }}
{{ $k.deadLetterQueues }} contains {{ toJson $dlq }}, which is invalid; valid: {{ $f.queue.valid }}
{{- else if and (not $pool.deadLetterQueuesDerived) (include "taskherd.check.queueBytes" (dict "key" $k.deadLetterQueues "name" (toString $dlq))) }}
{{- include "taskherd.check.queueBytes" (dict "key" $k.deadLetterQueues "name" (toString $dlq)) }}
{{- else if has $dlq $pool.queues }}
{{ $k.deadLetterQueues }} contains {{ toJson $dlq }}, which is also one of {{ $k.queues }}; a dead-letter queue must not be consumed as work
{{- end }}
{{- end }}
{{- if ne (len (uniq $pool.deadLetterQueues)) (len $pool.deadLetterQueues) }}
{{ $k.deadLetterQueues }}={{ toJson $pool.deadLetterQueues }} names a queue twice; each queue needs its own dead-letter queue
{{- end }}
{{- end }}
{{- end }}
{{- /* time */}}
{{- $soft := int64 $pool.timeLimits.softSeconds }}
{{- $hard := int64 $pool.timeLimits.hardSeconds }}
{{- if ge $soft $hard }}
{{ index $k "timeLimits.softSeconds" }}={{ $soft }} must be less than {{ index $k "timeLimits.hardSeconds" }}={{ $hard }}, so the task gets SoftTimeLimitExceeded before it is killed
{{- end }}
{{- if lt (int64 $pool.graceSeconds) (int64 $pool.minGraceSeconds) }}
{{ index $k "terminationGracePeriodSeconds" }}={{ int64 $pool.graceSeconds }} is too short: it must be at least timeLimits.hardSeconds + drainMarginSeconds + shutdownSeconds = {{ $hard }} + {{ int64 $pool.drainMarginSeconds }} + {{ int64 $pool.shutdownSeconds }} = {{ int64 $pool.minGraceSeconds }}, or a task within its time limit is SIGKILLed; leave it empty to derive it
{{- end }}
{{- if and (eq $v.broker.type "redis") (le (int64 $v.broker.visibilityTimeoutSeconds) $hard) }}
broker.visibilityTimeoutSeconds={{ int64 $v.broker.visibilityTimeoutSeconds }} must be greater than {{ index $k "timeLimits.hardSeconds" }}={{ $hard }}: Redis would deliver a task again while it still runs
{{- end }}
{{- include "taskherd.check.consumerTimeout" (dict "root" $root "pool" $pool "k" $k) }}
{{- /* memory */}}
{{- include "taskherd.check.resources" (dict "f" $f "key" $k.resources "resources" $pool.resources "root" $root "index" $i) }}
{{- $memory := include "taskherd.quantityValue" ((($pool.resources | default dict).limits | default dict).memory | default "") }}
{{- if and (gt (int64 $pool.maxMemoryPerChildKb) 0) (ne $memory "invalid") (gt (float64 $memory) 0.0) }}
{{- $childBytes := mulf (float64 $pool.maxMemoryPerChildKb) 1024.0 }}
{{- $children := int64 $pool.concurrency }}
{{- if ge $childBytes (float64 $memory) }}
{{ $k.maxMemoryPerChildKb }}={{ int64 $pool.maxMemoryPerChildKb }} KiB is not below {{ index $k "resources.limits.memory" }}={{ toJson $pool.resources.limits.memory }}: the pod is OOM-killed before Celery replaces the child (it checks after each task); set it well below the limit, or 0
{{- else if gt (mulf $childBytes (float64 $children)) (float64 $memory) }}
{{- /* every child may grow to the cap before Celery replaces it (it checks after each task), all at
once: the cap is per child, the limit per pod */}}
{{- $maxKb := floor (divf (float64 $memory) (mulf 1024.0 (float64 $children))) | int64 }}
{{- $maxChildren := floor (divf (float64 $memory) $childBytes) | int64 }}
{{ $k.concurrency }}={{ $children }} × {{ $k.maxMemoryPerChildKb }}={{ int64 $pool.maxMemoryPerChildKb }} KiB = {{ mul $children (int64 $pool.maxMemoryPerChildKb) }} KiB exceeds {{ index $k "resources.limits.memory" }}={{ toJson $pool.resources.limits.memory }} ({{ divf (float64 $memory) 1024.0 | floor | int64 }} KiB): each of the {{ $children }} children may grow to the cap before Celery replaces it (it checks after each task), and the pod is OOM-killed first; valid: concurrency × maxMemoryPerChildKb at most the limit: maxMemoryPerChildKb at most {{ $maxKb }} with concurrency {{ $children }}, concurrency at most {{ $maxChildren }} with this cap, a higher memory limit, or maxMemoryPerChildKb 0 (off)
{{- end }}
{{- end }}
{{- if eq (include "taskherd.quantityValue" $pool.scratchSizeLimit) "invalid" }}
{{ $k.scratchSizeLimit }}={{ toJson $pool.scratchSizeLimit }} is invalid; valid: {{ $f.quantity.valid }}
{{- else }}
{{- include "taskherd.check.bytes" (dict "key" $k.scratchSizeLimit "value" $pool.scratchSizeLimit "min" "16Mi" "why" "each writable emptyDir holds /tmp, the heartbeat or the Prometheus files of every process") }}
{{- end }}
{{- /* the startup probe's budget: a worker still booting is restarted when it runs out, and
boots again, in a loop (docs/chart.md: the startup probe's budget, at least 60 s) */}}
{{- $startup := $pool.probes.startup }}
{{- $minStartup := 60 }}
{{- $startupBudget := mul (int64 $startup.periodSeconds) (int64 $startup.failureThreshold) }}
{{- if lt $startupBudget (int64 $minStartup) }}
{{ index $k "probes.startup.periodSeconds" }}={{ int64 $startup.periodSeconds }} × {{ index $k "probes.startup.failureThreshold" }}={{ int64 $startup.failureThreshold }} gives a worker {{ $startupBudget }} s to boot, less than the minimum of {{ $minStartup }} s: a boot takes 6–30 s (docs/benchmarks.md; 34 s measured on a loaded node), and a worker restarted before its first heartbeat boots again, in a loop; valid: periodSeconds × failureThreshold at least {{ $minStartup }} (e.g. failureThreshold {{ div (add $minStartup (sub (int64 $startup.periodSeconds) 1)) (int64 $startup.periodSeconds) }} with periodSeconds {{ int64 $startup.periodSeconds }}; the default is 1 × 300)
{{- end }}
{{- /* environment, volumes, extra containers */}}
{{- include "taskherd.check.env" (dict "f" $f "key" $k.env "env" $pool.env "reserved" $reservedEnv "why" "the chart <-> worker contract, docs/chart.md: set the value it comes from") }}
{{- range $j, $from := $pool.envFrom }}
{{- if not (and (kindIs "map" $from) (or $from.configMapRef $from.secretRef) (not (and $from.configMapRef $from.secretRef))) }}
{{ $k.envFrom }}[{{ $j }}]={{ toJson $from }} is invalid; valid: {configMapRef: {name: …}} or {secretRef: {name: …}}, with an optional prefix
{{- else }}
{{- $ref := $from.configMapRef | default $from.secretRef }}
{{- if not (and (kindIs "map" $ref) (kindIs "string" $ref.name) (regexMatch $f.dnsSubdomain.re (toString $ref.name))) }}
{{ $k.envFrom }}[{{ $j }}].{{ ternary "configMapRef" "secretRef" (not (empty $from.configMapRef)) }}.name={{ toJson (and (kindIs "map" $ref) $ref.name) }} is missing or invalid; valid: {{ $f.dnsSubdomain.valid }}
{{- end }}
{{- if and (hasKey $from "prefix") (not (and (kindIs "string" $from.prefix) (or (eq $from.prefix "") (regexMatch $f.envName.re $from.prefix)))) }}
{{ $k.envFrom }}[{{ $j }}].prefix={{ toJson $from.prefix }} is invalid; valid: {{ $f.envName.valid }}
{{- end }}
{{- end }}
{{- end }}
{{- $reservedVolumes := list "tmp" "heartbeat" "prometheus" "beat-schedule" }}
{{- $volumes := list }}
{{- range $j, $vol := $pool.extraVolumes }}
{{- if not (and (kindIs "map" $vol) (kindIs "string" $vol.name) (regexMatch $f.dnsLabel.re (toString $vol.name))) }}
{{ $k.extraVolumes }}[{{ $j }}].name={{ toJson (and (kindIs "map" $vol) $vol.name) }} is missing or invalid; valid: {{ $f.dnsLabel.valid }}
{{- else if or (has $vol.name $volumes) (has $vol.name $reservedVolumes) }}
{{ $k.extraVolumes }}[{{ $j }}].name={{ toJson $vol.name }} is already a volume of the pod (the chart's {{ join ", " $reservedVolumes }}, or an earlier entry); choose another name
{{- else }}
{{- $volumes = append $volumes $vol.name }}
{{- end }}
{{- end }}
{{- range $j, $m := $pool.extraVolumeMounts }}
{{- if not (kindIs "map" $m) }}
{{ $k.extraVolumeMounts }}[{{ $j }}]={{ toJson $m }} is not a volume mount; valid: {name, mountPath}
{{- else }}
{{- if not (has $m.name $volumes) }}
{{ $k.extraVolumeMounts }}[{{ $j }}].name={{ toJson $m.name }} is not one of the pool's extraVolumes {{ toJson $volumes }}; add it to {{ $k.extraVolumes }} (the pool's pods, beat and the test pod mount the same volumes)
{{- end }}
{{- if not (and (kindIs "string" $m.mountPath) (hasPrefix "/" (toString $m.mountPath))) }}
{{ $k.extraVolumeMounts }}[{{ $j }}].mountPath={{ toJson $m.mountPath }} is invalid; valid: an absolute path
{{- else if has (trimSuffix "/" $m.mountPath) (list "/tmp" "/run/taskherd/heartbeat" "/run/taskherd/prometheus" "/run/taskherd/beat") }}
{{ $k.extraVolumeMounts }}[{{ $j }}].mountPath={{ toJson $m.mountPath }} is where the chart mounts its own volume; choose another path
{{- end }}
{{- end }}
{{- end }}
{{- include "taskherd.check.containers" (dict "f" $f "key" $k.initContainers "containers" $pool.initContainers "taken" (list "taskherd-worker")) }}
{{- $taken := list "taskherd-worker" }}
{{- range $pool.initContainers }}{{ if kindIs "map" . }}{{ $taken = append $taken (toString .name) }}{{ end }}{{ end }}
{{- include "taskherd.check.containers" (dict "f" $f "key" $k.sidecars "containers" $pool.sidecars "taken" $taken) }}
{{- /* scaling and disruption: autoscaling.* is checked even when disabled (it is the pool's
WorkerPool the day autoscaling is turned on); a page target without a WorkerPool is refused, or
the pool's dead letters would page nobody */}}
{{- $as := $pool.autoscaling }}
{{- if gt (int64 $as.minReplicas) (int64 $as.maxReplicas) }}
{{ index $k "autoscaling.minReplicas" }}={{ int64 $as.minReplicas }} must not exceed {{ index $k "autoscaling.maxReplicas" }}={{ int64 $as.maxReplicas }}
{{- end }}
{{- if and $as.deadLetter.alertmanagerUrl $as.deadLetter.webhookUrl }}
{{ index $k "autoscaling.deadLetter.alertmanagerUrl" }} and {{ index $k "autoscaling.deadLetter.webhookUrl" }} are both set; choose one page target
{{- end }}
{{- include "taskherd.check.url" (dict "f" $f "format" "alertmanagerUrl" "key" (index $k "autoscaling.deadLetter.alertmanagerUrl") "value" $as.deadLetter.alertmanagerUrl) }}
{{- include "taskherd.check.url" (dict "f" $f "key" (index $k "autoscaling.deadLetter.webhookUrl") "value" $as.deadLetter.webhookUrl) }}
{{- if and (not $as.enabled) (or $as.deadLetter.alertmanagerUrl $as.deadLetter.webhookUrl) }}
{{- $target := ternary "autoscaling.deadLetter.alertmanagerUrl" "autoscaling.deadLetter.webhookUrl" (not (empty $as.deadLetter.alertmanagerUrl)) }}
{{- $url := toJson (get $as.deadLetter (trimPrefix "autoscaling.deadLetter." $target)) }}
{{- if $v.monitoring.prometheusRule.enabled }}
{{ index $k $target }}={{ $url }} would page nobody: {{ index $k "autoscaling.enabled" }}=false, so pool {{ toJson $pool.name }} has no WorkerPool; its dead letters page through the PrometheusRule (monitoring.prometheusRule.enabled=true), so set workerPools[{{ $i }}].{{ $target }}=""
{{- else }}
{{ index $k $target }}={{ $url }} would page nobody: {{ index $k "autoscaling.enabled" }}=false, so pool {{ toJson $pool.name }} has no WorkerPool and the operator does not watch its dead-letter queues; set autoscaling.enabled=true, or page through monitoring.prometheusRule.enabled=true (every pool's dead-letter queues) and set workerPools[{{ $i }}].{{ $target }}=""
{{- end }}
{{- end }}
{{- if $as.enabled }}
{{- if not $v.operator.enabled }}
{{ index $k "autoscaling.enabled" }}=true but operator.enabled=false; nothing would scale pool {{ toJson $pool.name }} (disable autoscaling and set replicas, or enable the operator)
{{- end }}
{{- if and (kindIs "map" $entry) (hasKey $entry "replicas") }}
workerPools[{{ $i }}].replicas={{ toJson $entry.replicas }} would be ignored: {{ index $k "autoscaling.enabled" }}=true and the operator owns the replica count; set autoscaling.minReplicas/maxReplicas, or autoscaling.enabled=false
{{- end }}
{{- if ne (int64 $pool.metrics.port) (int64 $v.workerPoolDefaults.metrics.port) }}
{{ index $k "metrics.port" }}={{ int64 $pool.metrics.port }} differs from workerPoolDefaults.metrics.port={{ int64 $v.workerPoolDefaults.metrics.port }}; the operator reads busyness of autoscaled pools on the default port, so set it there
{{- end }}
{{- end }}
{{- if $pool.podDisruptionBudget.enabled }}
{{- $mu := $pool.podDisruptionBudget.maxUnavailable }}
{{- if kindIs "string" $mu }}
{{- if not (regexMatch $f.percent.re $mu) }}
{{ index $k "podDisruptionBudget.maxUnavailable" }}={{ toJson $mu }} is invalid; valid: a whole number >= 1 or {{ $f.percent.valid }}
{{- else if eq $mu "0%" }}
{{ index $k "podDisruptionBudget.maxUnavailable" }}="0%" would block every node drain forever; valid: at least 1 (or 1%), or podDisruptionBudget.enabled=false
{{- end }}
{{- else if eq (int64 $mu) 0 }}
{{ index $k "podDisruptionBudget.maxUnavailable" }}=0 would block every node drain forever; valid: at least 1 (or 1%), or podDisruptionBudget.enabled=false
{{- end }}
{{- end }}
{{- /* metadata and scheduling */}}
{{- include "taskherd.check.labels" (dict "f" $f "key" $k.podLabels "labels" $pool.podLabels "reserved" true) }}
{{- include "taskherd.check.annotations" (dict "f" $f "key" $k.podAnnotations "annotations" $pool.podAnnotations) }}
{{- include "taskherd.check.labels" (dict "f" $f "key" $k.nodeSelector "labels" $pool.nodeSelector) }}
{{- include "taskherd.check.pullSecrets" (dict "f" $f "key" $k.imagePullSecrets "secrets" $pool.imagePullSecrets) }}
{{- if $pool.priorityClassName }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsSubdomain" "key" $k.priorityClassName "value" $pool.priorityClassName "max" 253) }}
{{- end }}
{{- if $pool.serviceAccount.name }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsSubdomain" "key" (index $k "serviceAccount.name") "value" $pool.serviceAccount.name "max" 253) }}
{{- end }}
{{- if and (eq true $pool.serviceAccount.create) (eq (toString $pool.serviceAccount.name) "default") }}
{{ index $k "serviceAccount.name" }}="default" with {{ index $k "serviceAccount.create" }}=true would create a ServiceAccount named "default", which Kubernetes keeps in every namespace (helm install fails: it "already exists"); valid: another name (empty: the pool's own, named like its Deployment), or serviceAccount.create=false to run as the namespace's default
{{- end }}
{{- include "taskherd.check.annotations" (dict "f" $f "key" (index $k "serviceAccount.annotations") "annotations" $pool.serviceAccount.annotations) }}
{{- if and $pool.serviceAccount.annotations (not $pool.serviceAccount.create) }}
{{ index $k "serviceAccount.annotations" }} would be ignored: serviceAccount.create is false, so the chart creates no ServiceAccount to annotate; set serviceAccount.create=true
{{- end }}
{{- end }}
{{- end }}

{{/* Rules across pools: names, shared queues. */}}
{{- define "taskherd.validate.poolsTogether" -}}
{{- if not .root.Values.workerPools }}
workerPools is empty: the chart would deploy the operator and the exporter with no pool to run (and no helm test); list at least one pool, e.g. workerPools: [{name: default, app: myproject.celery}]
{{- end }}
{{- $seen := dict }}
{{- $queueOwner := dict }}
{{- $dlqOf := dict }}
{{- $scaledBy := dict }}
{{- range $pool := .pools }}
{{- $at := printf "workerPools[%d]" (int $pool.index) }}
{{- if hasKey $seen (toString $pool.name) }}
{{ $at }}.name={{ toJson $pool.name }} is also the name of {{ get $seen (toString $pool.name) }}; pool names must be unique
{{- else }}
{{- $_ := set $seen (toString $pool.name) $at }}
{{- end }}
{{- range $j, $q := $pool.queues }}
{{- $dlq := "" }}
{{- if lt $j (len $pool.deadLetterQueues) }}{{ $dlq = index $pool.deadLetterQueues $j }}{{ end }}
{{- if and (hasKey $dlqOf $q) (ne (get $dlqOf $q) $dlq) }}
{{ $at }} (pool {{ toJson $pool.name }}) gives queue {{ toJson $q }} the dead-letter queue {{ toJson $dlq }}, but {{ get $queueOwner $q }} gives it {{ toJson (get $dlqOf $q) }}; a queue has one dead-letter queue
{{- end }}
{{- if and $pool.autoscaling.enabled (hasKey $scaledBy $q) }}
{{ $at }} (pool {{ toJson $pool.name }}) and {{ get $scaledBy $q }} both autoscale on queue {{ toJson $q }}; each would scale to the whole depth (twice the workers): let one pool consume it, or disable autoscaling on one
{{- end }}
{{- if $pool.autoscaling.enabled }}{{ $_ := set $scaledBy $q (printf "%s (pool %s)" $at (toJson $pool.name)) }}{{ end }}
{{- $_ := set $dlqOf $q $dlq }}
{{- $_ := set $queueOwner $q (printf "%s (pool %s)" $at (toJson $pool.name)) }}
{{- end }}
{{- end }}
{{- range $pool := .pools }}
{{- range $dlq := $pool.deadLetterQueues }}
{{- if and (hasKey $queueOwner $dlq) (not (has $dlq $pool.queues)) }}
workerPools[{{ int $pool.index }}] (pool {{ toJson $pool.name }}) uses {{ toJson $dlq }} as a dead-letter queue, but {{ get $queueOwner $dlq }} consumes it as work; a dead-letter queue must not be consumed
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "taskherd.validate.network" -}}
{{- $f := .f }}
{{- $np := .root.Values.networkPolicy }}
{{- range $i, $cidr := $np.apiServer.cidrs }}
{{- include "taskherd.check.format" (dict "f" $f "format" "cidr" "key" (printf "networkPolicy.apiServer.cidrs[%d]" $i) "value" $cidr) }}
{{- end }}
{{- include "taskherd.check.policyRules" (dict "f" $f "key" "networkPolicy.workerExtraEgress" "rules" $np.workerExtraEgress "peers" "to") }}
{{- include "taskherd.check.policyRules" (dict "f" $f "key" "networkPolicy.operatorExtraEgress" "rules" $np.operatorExtraEgress "peers" "to") }}
{{- include "taskherd.check.peers" (dict "f" $f "key" "networkPolicy.metricsIngress.from" "peers" $np.metricsIngress.from) }}
{{- include "taskherd.check.labels" (dict "f" $f "key" "networkPolicy.dns.namespaceSelector" "labels" $np.dns.namespaceSelector) }}
{{- include "taskherd.check.labels" (dict "f" $f "key" "networkPolicy.dns.podSelector" "labels" $np.dns.podSelector) }}
{{- end }}

{{- define "taskherd.validate.operator" -}}
{{- $f := .f }}
{{- $op := .root.Values.operator }}
{{- if and $op.enabled (eq (int64 $op.healthPort) (int64 $op.metricsPort)) }}
operator.healthPort={{ int64 $op.healthPort }} equals operator.metricsPort={{ int64 $op.metricsPort }}; the health endpoint and /metrics are two servers and need two ports
{{- end }}
{{- include "taskherd.check.leaderElection" $op }}
{{- $reservedArgs := fromYaml (include "taskherd.reservedOperatorArgs" .root) }}
{{- $operatorOptions := fromYaml (include "taskherd.operatorExtraOptions" .root) }}
{{- range $j, $arg := $op.extraArgs }}
{{- include "taskherd.check.extraArg" (dict "key" (printf "operator.extraArgs[%d]" $j) "arg" (toString $arg) "reserved" $reservedArgs "program" "the operator" "only" $operatorOptions) }}
{{- end }}
{{- include "taskherd.check.url" (dict "f" $f "format" "alertmanagerUrl" "key" "operator.defaultAlertmanagerUrl" "value" $op.defaultAlertmanagerUrl) }}
{{- include "taskherd.check.annotations" (dict "f" $f "key" "operator.serviceAccount.annotations" "annotations" $op.serviceAccount.annotations) }}
{{- include "taskherd.check.annotations" (dict "f" $f "key" "operator.podAnnotations" "annotations" $op.podAnnotations) }}
{{- include "taskherd.check.labels" (dict "f" $f "key" "operator.nodeSelector" "labels" $op.nodeSelector) }}
{{- include "taskherd.check.pullSecrets" (dict "f" $f "key" "operator.imagePullSecrets" "secrets" $op.imagePullSecrets) }}
{{- include "taskherd.check.resources" (dict "f" $f "key" "operator.resources" "resources" $op.resources) }}
{{- include "taskherd.check.resources" (dict "f" $f "key" "exporter.resources" "resources" .root.Values.exporter.resources) }}
{{- include "taskherd.check.env" (dict "f" $f "key" "operator.env" "env" $op.env "reserved" (list "POD_NAME" "POD_NAMESPACE" "TASKHERD_LEASE_NAME" "TASKHERD_OPERATOR_METRICS_PORT" "TASKHERD_OPERATOR_HEALTH_PORT" "TASKHERD_WORKER_METRICS_PORT" "TASKHERD_ALERTMANAGER_URL") "why" "operator.* values") }}
{{- if $op.priorityClassName }}
{{- include "taskherd.check.format" (dict "f" $f "format" "dnsSubdomain" "key" "operator.priorityClassName" "value" $op.priorityClassName "max" 253) }}
{{- end }}
{{- end }}

{{/*
Monitoring objects that would be created but could not work, and the one-page rule: a dead
letter pages from ONE source (docs/chart.md, "One page per dead letter").
*/}}
{{- define "taskherd.validate.monitoring" -}}
{{- $f := .f }}
{{- $v := .root.Values }}
{{- $m := $v.monitoring }}
{{- if and $m.podMonitor.enabled $v.networkPolicy.enabled (not $v.networkPolicy.metricsIngress.enabled) }}
monitoring.podMonitor.enabled=true but networkPolicy.metricsIngress.enabled=false: the NetworkPolicies would block Prometheus from the pods; set networkPolicy.metricsIngress.enabled=true (and .from to your Prometheus namespace)
{{- end }}
{{- if and $m.serviceMonitor.enabled (not $v.operator.enabled) }}
monitoring.serviceMonitor.enabled=true scrapes the operator, but operator.enabled=false; disable one of them
{{- end }}
{{- if and $m.serviceMonitor.enabled $v.operator.enabled (not (regexMatch "^[a-z]" (include "taskherd.operator.metricsServiceName" $.root))) }}
monitoring.serviceMonitor.enabled=true needs a Service named {{ include "taskherd.operator.metricsServiceName" $.root | toJson }}, which Kubernetes refuses: a Service name must start with a letter, and it starts with the {{ ternary "fullnameOverride" "release name" (not (empty $v.fullnameOverride)) }}; choose a {{ ternary "fullnameOverride" "release name" (not (empty $v.fullnameOverride)) }} starting with a letter{{ if empty $v.fullnameOverride }} or set fullnameOverride{{ end }}
{{- end }}
{{- if and $m.serviceMonitor.enabled $v.operator.enabled $v.networkPolicy.enabled (not $v.networkPolicy.metricsIngress.enabled) }}
monitoring.serviceMonitor.enabled=true but networkPolicy.metricsIngress.enabled=false: the operator's NetworkPolicy would block Prometheus; set networkPolicy.metricsIngress.enabled=true
{{- end }}
{{- if $m.prometheusRule.enabled }}
{{- if $v.operator.defaultAlertmanagerUrl }}
operator.defaultAlertmanagerUrl is set and monitoring.prometheusRule.enabled=true: both would page TaskherdDeadLetterQueue for the same dead letters (twice, from two sources); keep the PrometheusRule and remove the URL, or disable the PrometheusRule
{{- end }}
{{- range $pool := $.pools }}
{{- if and $pool.autoscaling.enabled (or $pool.autoscaling.deadLetter.alertmanagerUrl $pool.autoscaling.deadLetter.webhookUrl) }}
{{ include "taskherd.pool.key" (dict "root" $.root "index" $pool.index "path" (ternary "autoscaling.deadLetter.alertmanagerUrl" "autoscaling.deadLetter.webhookUrl" (not (empty $pool.autoscaling.deadLetter.alertmanagerUrl)))) }} is set and monitoring.prometheusRule.enabled=true: both would page for the dead letters of pool {{ toJson $pool.name }} (twice, from two sources); keep the PrometheusRule and remove the URL, or disable the PrometheusRule
{{- end }}
{{- end }}
{{- end }}
{{- range $name := list "podMonitor" "serviceMonitor" "prometheusRule" "grafanaDashboard" }}
{{- include "taskherd.check.labels" (dict "f" $f "key" (printf "monitoring.%s.labels" $name) "labels" (get $m $name).labels "reserved" true) }}
{{- end }}
{{- end }}

{{- define "taskherd.validate.beat" -}}
{{- $v := .root.Values }}
{{- $beat := $v.beat }}
{{- if $beat.enabled }}
{{- $names := list }}
{{- range .pools }}{{ $names = append $names (toString .name) }}{{ end }}
{{- if not .pools }}
beat.enabled=true but workerPools is empty; beat runs with a pool's image, app and queues
{{- else if and $beat.pool (not (has $beat.pool $names)) }}
beat.pool={{ toJson $beat.pool }} is not a pool; valid: one of {{ toJson $names }} (or empty for the first)
{{- else }}
{{- $pool := index .pools 0 }}
{{- range .pools }}{{ if eq (toString .name) $beat.pool }}{{ $pool = . }}{{ end }}{{ end }}
{{- if and $pool.command (not $beat.command) }}
beat.enabled=true with pool {{ toJson $pool.name }}, whose command replaces celery's (no app to run beat with); set beat.command too
{{- end }}
{{- end }}
{{- $reservedArgs := fromYaml (include "taskherd.reservedBeatArgs" .root) }}
{{- range $j, $arg := $beat.extraArgs }}
{{- include "taskherd.check.extraArg" (dict "key" (printf "beat.extraArgs[%d]" $j) "arg" (toString $arg) "reserved" $reservedArgs "program" "celery beat") }}
{{- end }}
{{- include "taskherd.check.resources" (dict "f" .f "key" "beat.resources" "resources" $beat.resources) }}
{{- include "taskherd.check.annotations" (dict "f" .f "key" "beat.podAnnotations" "annotations" $beat.podAnnotations) }}
{{- include "taskherd.check.labels" (dict "f" .f "key" "beat.nodeSelector" "labels" $beat.nodeSelector) }}
{{- if $beat.priorityClassName }}
{{- include "taskherd.check.format" (dict "f" .f "format" "dnsSubdomain" "key" "beat.priorityClassName" "value" $beat.priorityClassName "max" 253) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "taskherd.validate.tests" -}}
{{- $tests := .root.Values.tests }}
{{- if and $tests.enabled $tests.pool }}
{{- $names := list }}
{{- range .pools }}{{ $names = append $names (toString .name) }}{{ end }}
{{- if not (has $tests.pool $names) }}
tests.pool={{ toJson $tests.pool }} is not a pool; valid: one of {{ toJson $names }} (or empty for the first)
{{- end }}
{{- end }}
{{- end }}

{{- define "taskherd.validate.metadata" -}}
{{- $v := .root.Values }}
{{- include "taskherd.check.labels" (dict "f" .f "key" "commonLabels" "labels" $v.commonLabels "reserved" true) }}
{{- include "taskherd.check.annotations" (dict "f" .f "key" "commonAnnotations" "annotations" $v.commonAnnotations) }}
{{- end }}

{{- define "taskherd.validate.security" -}}
{{- $seccomp := .root.Values.podSecurityContext.seccompProfile }}
{{- if and (eq $seccomp.type "Localhost") (not $seccomp.localhostProfile) }}
podSecurityContext.seccompProfile.type=Localhost needs podSecurityContext.seccompProfile.localhostProfile (the profile's path on the node)
{{- end }}
{{- if and (ne $seccomp.type "Localhost") $seccomp.localhostProfile }}
podSecurityContext.seccompProfile.localhostProfile is set, but type is {{ toJson $seccomp.type }}; it is read only with type Localhost
{{- end }}
{{- end }}

{{- define "taskherd.validate.extraDeploy" -}}
{{- range $i, $obj := .root.Values.extraDeploy }}
{{- if kindIs "map" $obj }}
{{- if not (and $obj.apiVersion $obj.kind (kindIs "map" $obj.metadata) ($obj.metadata | default dict).name) }}
extraDeploy[{{ $i }}] has no apiVersion, kind or metadata.name; valid: a whole Kubernetes object (or a string template rendering one)
{{- end }}
{{- else if not (kindIs "string" $obj) }}
extraDeploy[{{ $i }}]={{ toJson $obj }} is not an object; valid: a Kubernetes object, or a string rendered with tpl
{{- end }}
{{- end }}
{{- end }}
