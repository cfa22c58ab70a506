{{/* Name of the InferencePool (and prefix of everything the chart creates). */}}
{{- define "inferencepool.poolName" -}}
{{- default .Release.Name .Values.inferencePool.name | trunc 59 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the EPP Deployment, Service, ServiceAccount and ConfigMap. */}}
{{- define "inferencepool.eppName" -}}
{{- printf "%s-epp" (include "inferencepool.poolName" .) -}}
{{- end -}}

{{- define "inferencepool.labels" -}}
app.kubernetes.io/name: inferencepool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "inferencepool.selectorLabels" -}}
inferencepool: {{ include "inferencepool.eppName" . }}
{{- end -}}

{{/* API group of the InferencePool, passed to the EPP as --pool-group. */}}
{{- define "inferencepool.group" -}}
{{- .Values.inferencePool.apiVersion | splitList "/" | first -}}
{{- end -}}

{{/* Leader election is on whenever more than one replica runs active-passive (the default
haMode); active-active replicas all serve. */}}
{{- define "inferencepool.leaderElection" -}}
{{- if and (gt (int .Values.inferenceExtension.replicas) 1) (ne (.Values.inferenceExtension.haMode | default "") "active-active") -}}true{{- end -}}
{{- end -}}

{{/* Active-active replicas sharing state through a store. */}}
{{- define "inferencepool.activeActive" -}}
{{- if eq (.Values.inferenceExtension.haMode | default "") "active-active" -}}true{{- end -}}
{{- end -}}

{{/* Image: upstream's registry/repository/tag; this chart's earlier hub/name still work. */}}
{{- define "inferencepool.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- if $img.hub -}}
{{- printf "%s/%s:%s" $img.hub (default "epp" $img.name) $tag -}}
{{- else -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The pool's failureMode: inferencePool.endpointPickerRef.failureMode (this chart's
earlier key) when given, else upstream's inferenceExtension.failureMode. */}}
{{- define "inferencepool.failureMode" -}}
{{- $ref := .Values.inferencePool.endpointPickerRef | default dict -}}
{{- default .Values.inferenceExtension.failureMode $ref.failureMode -}}
{{- end -}}

{{/* The model server type, checked against the types upstream knows. */}}
{{- define "inferencepool.modelServerType" -}}
{{- $t := .Values.inferencePool.modelServerType | default "vllm" -}}
{{- if not (has $t (list "vllm" "sglang" "trtllm-serve" "triton-tensorrt-llm")) -}}
{{- fail (printf "inferencePool.modelServerType=%s: must be one of vllm, sglang, trtllm-serve, triton-tensorrt-llm" $t) -}}
{{- end -}}
{{- $t -}}
{{- end -}}

{{/* Extra flags as container args: the map form (name: value) or upstream v1.0's list of
{name, value}; each renders as --name=value. */}}
{{- define "inferencepool.flags" -}}
{{- $flags := .Values.inferenceExtension.flags -}}
{{- if kindIs "slice" $flags -}}
{{- range $flags }}
{{- if not (and (kindIs "map" .) (hasKey . "name")) }}
{{- fail (printf "inferenceExtension.flags: a list entry must be {name, value}, got %v" .) }}
{{- end }}
- {{ printf "--%s=%v" .name (.value | toString) | quote }}
{{- end }}
{{- else -}}
{{- range $name, $value := $flags }}
- {{ printf "--%s=%v" $name ($value | toString) | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* "true" when inferenceExtension.flags (map or v1.0 list form) sets the flag named by the
second argument, else "". */}}
{{- define "inferencepool.hasFlag" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $flags := $root.Values.inferenceExtension.flags -}}
{{- if kindIs "slice" $flags -}}
{{- range $flags }}{{ if and (kindIs "map" .) (eq (toString .name) $name) }}true{{ end }}{{ end -}}
{{- else if kindIs "map" $flags -}}
{{- if hasKey $flags $name }}true{{ end -}}
{{- end -}}
{{- end -}}

{{/* The request parser plugin types (a JSON list), as upstream picks them: vLLM over gRPC →
[vllmgrpc-parser], else inferencePool.parsers (llm-d v0.10's router.epp.parsers), else
inferencePool.parser (GIE's one parser); [] = the EPP's default parsers (openai, anthropic,
vllmhttp). */}}
{{- define "inferencepool.parsers" -}}
{{- $pool := .Values.inferencePool -}}
{{- if eq (include "inferencepool.protocol" .) "grpc" -}}
{{- list "vllmgrpc-parser" | toJson -}}
{{- else if $pool.parsers -}}
{{- $pool.parsers | toJson -}}
{{- else if $pool.parser -}}
{{- list $pool.parser | toJson -}}
{{- else -}}
{{- list | toJson -}}
{{- end -}}
{{- end -}}

{{/* The parser section of a rendered EndpointPickerConfig: one parser as GIE's `parser:`
(it reads every path), several as llm-d v0.10's `requestHandler.parsers` (the first whose
path suffix matches reads the request). */}}
{{- define "inferencepool.parserSection" -}}
{{- $parsers := include "inferencepool.parsers" . | fromJsonArray -}}
{{- if eq (len $parsers) 1 -}}
parser:
  pluginRef: {{ first $parsers }}
{{- else if $parsers -}}
requestHandler:
  parsers:
  {{- range $parsers }}
  - pluginRef: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* inferencePool.modelServerProtocol: http, or grpc (vLLM's gRPC API only: the one gRPC
model-server API the EPP reads). */}}
{{- define "inferencepool.protocol" -}}
{{- $p := lower (.Values.inferencePool.modelServerProtocol | default "http") -}}
{{- if not (has $p (list "http" "grpc")) -}}
{{- fail (printf "inferencePool.modelServerProtocol=%s: must be http or grpc" .Values.inferencePool.modelServerProtocol) -}}
{{- end -}}
{{- if and (eq $p "grpc") (ne (include "inferencepool.modelServerType" .) "vllm") -}}
{{- fail (printf "inferencePool.modelServerProtocol=grpc is vLLM's gRPC API: it needs modelServerType=vllm, got %s (no parser reads %s's gRPC API)" .Values.inferencePool.modelServerType .Values.inferencePool.modelServerType) -}}
{{- end -}}
{{- $p -}}
{{- end -}}

{{/* ours: prefill/decode disaggregation (docs/pd.md). "true" when disaggregation.enabled. */}}
{{- define "inferencepool.pd" -}}
{{- with .Values.disaggregation }}{{ if .enabled }}true{{ end }}{{ end -}}
{{- end -}}

{{/* "true" when the chart deploys the prefill and decode model servers. */}}
{{- define "inferencepool.pdModelServers" -}}
{{- if include "inferencepool.pd" . }}{{ if .Values.disaggregation.modelServers.enabled }}true{{ end }}{{ end -}}
{{- end -}}

{{/* The file of the EPP ConfigMap the EPP loads: pluginsConfigFile, except that with
disaggregation on, the default file name means the P/D config (a file the user named wins). */}}
{{- define "inferencepool.configFile" -}}
{{- $file := .Values.inferenceExtension.pluginsConfigFile -}}
{{- if and (include "inferencepool.pd" .) (eq $file "default-plugins.yaml") -}}
pd-plugins.yaml
{{- else -}}
{{- $file -}}
{{- end -}}
{{- end -}}

{{/* The data-layer and parser plugins every rendered EndpointPickerConfig lists (scraping
as metricsDataSource and the engine type say; the parsers as inferencepool.parsers says). */}}
{{- define "inferencepool.dataLayerPlugins" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $type := include "inferencepool.modelServerType" . -}}
{{- $mds := $ie.metricsDataSource | default dict -}}
{{- $parsers := include "inferencepool.parsers" . | fromJsonArray -}}
- type: metrics-data-source
  {{- /* A model-server-metrics-* entry in flags keeps working: its parameter is left
  out (an explicit parameter would win over the flag, as upstream's loader has it). */}}
  {{- $params := dict }}
  {{- if not (include "inferencepool.hasFlag" (list . "model-server-metrics-scheme")) }}
  {{- $_ := set $params "scheme" ($mds.scheme | default "http") }}
  {{- end }}
  {{- if not (include "inferencepool.hasFlag" (list . "model-server-metrics-path")) }}
  {{- /* trtllm-serve publishes its metrics under /prometheus/metrics */}}
  {{- $_ := set $params "path" (ternary "/prometheus/metrics" ($mds.path | default "/metrics") (eq $type "trtllm-serve")) }}
  {{- end }}
  {{- if not (include "inferencepool.hasFlag" (list . "model-server-metrics-https-insecure-skip-verify")) }}
  {{- $_ := set $params "insecureSkipVerify" (ne $mds.insecureSkipVerify false) }}
  {{- end }}
  {{- with $params }}
  parameters:
    {{- range $k, $v := . }}
    {{ $k }}: {{ $v | toJson }}
    {{- end }}
  {{- end }}
- type: core-metrics-extractor
  {{- if ne $type "vllm" }}
  parameters:
    defaultEngine: {{ $type | quote }}
  {{- end }}
{{- range $parsers }}
- type: {{ . }}
{{- end }}
{{- end -}}

{{/* Image of a values block {registry, repository, tag}; tag defaults to the second
argument. */}}
{{- define "inferencepool.imageOf" -}}
{{- $img := index . 0 -}}
{{- printf "%s/%s:%s" $img.registry $img.repository (default (index . 1) $img.tag) -}}
{{- end -}}

{{/* Labels of a P/D model-server pod of the role given as second argument: the pool's
selector plus llm-d's role label, which prefill-filter/decode-filter read. */}}
{{- define "inferencepool.pdPodLabels" -}}
{{- $root := index . 0 -}}
{{- toYaml $root.Values.inferencePool.modelServers.matchLabels }}
llm-d.ai/role: {{ index . 1 }}
{{- end -}}

{{/* Name of the decode pods' ServiceAccount and of the pd-sidecar's Role. */}}
{{- define "inferencepool.pdSidecarName" -}}
{{- printf "%s-pd-sidecar" (include "inferencepool.poolName" .) -}}
{{- end -}}
