{{/*
Shared names, labels and the settings file of the tether chart.
*/}}

{{- define "tether.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether.fullname" -}}
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

{{- define "tether.headlessName" -}}
{{- printf "%s-headless" (include "tether.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: api
{{- end }}

{{- define "tether.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tether.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tether.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tether.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tether.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/*
One TOML value. Helm reads numbers from values.yaml as float64 (and from
--set as int64): whole numbers are printed as integers, because tether's
settings are integers and refuse "20000.0". Strings, booleans and lists go
through JSON, whose string escapes TOML shares.
*/}}
{{- define "tether.tomlValue" -}}
{{- if or (kindIs "float64" .) (kindIs "float32" .) -}}
{{- if eq (float64 .) (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}
{{ . }}
{{- else -}}
{{ toJson . }}
{{- end -}}
{{- end }}

{{/*
The settings file: the `config` values plus what the chart owns (listen
address, SQLite path, TLS paths). Secrets never appear here; they are env
variables from secretKeyRef (see the Deployment).
*/}}
{{- define "tether.configToml" -}}
{{- $config := deepCopy .Values.config }}
{{- $http := get $config "http" | default dict }}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int64 .Values.api.port)) }}
{{- if .Values.tls.enabled }}
{{- $_ := set $http "tls_cert_path" "/etc/tether/tls/tls.crt" }}
{{- $_ := set $http "tls_key_path" "/etc/tether/tls/tls.key" }}
{{- end }}
{{- $_ := set $config "http" $http }}
{{- $database := get $config "database" | default dict }}
{{- $_ := set $database "sqlite_path" "/var/lib/tether/tether.db" }}
{{- $_ := set $config "database" $database }}
{{- if gt (int64 (.Values.api.metricsPort | default 0)) 0 }}
{{- $_ := set $config "metrics" (dict "listen" (printf "0.0.0.0:%d" (int64 .Values.api.metricsPort))) }}
{{- end }}
# Settings of tether serve, rendered by the Helm chart from `config` in
# values.yaml. Environment variables (TETHER_<SECTION>__<KEY>) override them.
{{- range $section := keys $config | sortAlpha }}

[{{ $section }}]
{{- $entries := get $config $section }}
{{- range $key := keys $entries | sortAlpha }}
{{ $key }} = {{ include "tether.tomlValue" (get $entries $key) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Refuses value combinations that would deploy something broken.
*/}}
{{- define "tether.validate" -}}
{{- $graceSeconds := divf (.Values.config.shutdown.grace_ms | default 20000) 1000.0 }}
{{- $needed := addf $graceSeconds .Values.api.preStopSleepSeconds }}
{{- if le (float64 .Values.api.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "api.terminationGracePeriodSeconds (%v) must exceed api.preStopSleepSeconds + config.shutdown.grace_ms/1000 (%v), or pods are killed mid-drain" .Values.api.terminationGracePeriodSeconds $needed) }}
{{- end }}
{{- if and (not .Values.database.existingSecret) (or .Values.api.autoscaling.enabled (gt (int64 .Values.api.replicas) 1)) }}
{{- fail "more than one pod (api.replicas > 1 or api.autoscaling.enabled) needs PostgreSQL: set database.existingSecret; the embedded SQLite file cannot be shared between pods" }}
{{- end }}
{{- if and (gt (int64 (.Values.api.metricsPort | default 0)) 0) (eq (int64 .Values.api.metricsPort) (int64 .Values.api.port)) }}
{{- fail "api.metricsPort must differ from api.port" }}
{{- end }}
{{- $viewer := .Values.config.viewer | default dict }}
{{- $daemon := .Values.config.daemon | default dict }}
{{- $queue := $viewer.queue_bytes | default 4194304 }}
{{- $window := $daemon.window_bytes | default 262144 }}
{{- if gt (mul 2 (int64 $window)) (int64 $queue) }}
{{- fail (printf "config.viewer.queue_bytes (%v) must be at least twice config.daemon.window_bytes (%v): tether refuses to start otherwise" $queue $window) }}
{{- end }}
{{- if and .Values.redis.urlKey .Values.redis.clusterNodesKey }}
{{- fail "set redis.urlKey or redis.clusterNodesKey, not both" }}
{{- end }}
{{- if and (or .Values.redis.urlKey .Values.redis.clusterNodesKey) (not .Values.redis.existingSecret) }}
{{- fail "redis.urlKey / redis.clusterNodesKey need redis.existingSecret" }}
{{- end }}
{{- if and .Values.redis.existingSecret (not (or .Values.redis.urlKey .Values.redis.clusterNodesKey)) }}
{{- fail "redis.existingSecret needs redis.urlKey or redis.clusterNodesKey" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.api.autoscaling.enabled (not (dig "requests" "cpu" "" .Values.api.resources)) }}
{{- fail "api.autoscaling.enabled needs api.resources.requests.cpu: the HPA's CPU target is a share of the request" }}
{{- end }}
{{- if and .Values.api.autoscaling.enabled .Values.api.autoscaling.targetMemoryUtilizationPercentage (not (dig "requests" "memory" "" .Values.api.resources)) }}
{{- fail "api.autoscaling.targetMemoryUtilizationPercentage needs api.resources.requests.memory" }}
{{- end }}
{{- if and .Values.api.autoscaling.enabled (lt (int64 .Values.api.autoscaling.maxReplicas) (int64 .Values.api.autoscaling.minReplicas)) }}
{{- fail "api.autoscaling.maxReplicas must be at least api.autoscaling.minReplicas" }}
{{- end }}
{{- end }}
