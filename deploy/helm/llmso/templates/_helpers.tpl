{{/* Names: <release>-llmso unless the release name already says llmso. */}}
{{- define "llmso.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llmso.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Common labels; include with (dict "root" $ "component" "gateway"). */}}
{{- define "llmso.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "llmso.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: llmso
{{- end -}}

{{- define "llmso.componentSelector" -}}
{{ include "llmso.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "llmso.gatewayImage" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The pod and container security settings every workload shares: non-root, read-only
root filesystem, no privilege escalation, no capabilities. Argument: the uid. */}}
{{- define "llmso.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "llmso.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The number of gateways there can be at once. */}}
{{- define "llmso.maxGateways" -}}
{{- if .Values.gateway.autoscaling.enabled -}}
{{- .Values.gateway.autoscaling.maxReplicas -}}
{{- else -}}
{{- .Values.gateway.replicas -}}
{{- end -}}
{{- end -}}

{{/* The shared store URL ("" when none). */}}
{{- define "llmso.sharedStore" -}}
{{- if .Values.sharedStore.url -}}
{{- .Values.sharedStore.url -}}
{{- else if .Values.redis.enabled -}}
{{- printf "redis://%s-redis.%s.svc.%s:6379/0" (include "llmso.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{/* One base URL per vLLM StatefulSet pod, as a YAML list. */}}
{{- define "llmso.vllmReplicaUrls" -}}
{{- $fullname := include "llmso.fullname" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.vllm.replicas) -}}
{{- $urls = append $urls (printf "http://%s-vllm-%d.%s-vllm-headless.%s.svc.%s:%d/v1" $fullname $i $fullname $.Release.Namespace $.Values.clusterDomain (int $.Values.vllm.port)) -}}
{{- end -}}
{{- toYaml $urls -}}
{{- end -}}

{{/* One gRPC address per Triton pod; each pod's metrics are on the same host, port 8002. */}}
{{- define "llmso.tritonReplicaUrls" -}}
{{- $fullname := include "llmso.fullname" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.triton.replicas) -}}
{{- $urls = append $urls (printf "%s-triton-%d.%s-triton-headless.%s.svc.%s:8001" $fullname $i $fullname $.Release.Namespace $.Values.clusterDomain) -}}
{{- end -}}
{{- toYaml $urls -}}
{{- end -}}

{{/* The gateway's llmso config: values.config plus what the chart owns (server bind
and drain, engine models, the shared store). */}}
{{- define "llmso.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $server := get $config "server" | default dict -}}
{{- range $key := list "host" "port" "drain_grace" "drain_timeout" -}}
{{- if hasKey $server $key -}}
{{- fail (printf "config.server.%s is set by the chart: use gateway.port / gateway.drain instead" $key) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $_ = set $server "port" (int .Values.gateway.port) -}}
{{- $_ = set $server "drain_grace" .Values.gateway.drain.grace -}}
{{- $_ = set $server "drain_timeout" .Values.gateway.drain.timeout -}}
{{- $_ = set $config "server" $server -}}
{{- $models := get $config "models" | default list -}}
{{- if .Values.vllm.enabled -}}
{{- $vllm := dict "name" .Values.vllm.servedModelName "backend" "openai" "engine" "vllm" "replicas" (include "llmso.vllmReplicaUrls" . | fromYamlArray) -}}
{{- $models = append $models (merge $vllm (deepCopy .Values.vllm.gatewayModel)) -}}
{{- end -}}
{{- if .Values.triton.enabled -}}
{{- $triton := dict "name" .Values.triton.modelName "backend" "triton" "replicas" (include "llmso.tritonReplicaUrls" . | fromYamlArray) "metrics_port" 8002 "triton_model" .Values.triton.tritonModel -}}
{{- if .Values.triton.tokenizer -}}{{- $_ = set $triton "tokenizer" .Values.triton.tokenizer -}}{{- end -}}
{{- $models = append $models (merge $triton (deepCopy .Values.triton.gatewayModel)) -}}
{{- end -}}
{{- if not $models -}}
{{- fail "no models: enable vllm or triton, or list models under config.models" -}}
{{- end -}}
{{- $_ = set $config "models" $models -}}
{{- $store := include "llmso.sharedStore" . -}}
{{- $limits := get $config "limits" | default dict -}}
{{- if and $store (not (hasKey $limits "store")) -}}{{- $_ = set $limits "store" $store -}}{{- end -}}
{{- if $limits -}}{{- $_ = set $config "limits" $limits -}}{{- end -}}
{{- if and (gt (int (include "llmso.maxGateways" .)) 1) (eq (get $limits "store" | default "memory") "memory") (not .Values.sharedStore.allowPerPod) -}}
{{- fail "more than one gateway needs a shared store for limits and stored responses: set redis.enabled, sharedStore.url, or sharedStore.allowPerPod=true" -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
