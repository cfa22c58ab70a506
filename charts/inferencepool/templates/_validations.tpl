{{/* Upstream values this chart cannot honour yet: refused with the reason, never ignored. */}}
{{- define "inferencepool.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- if $ie.latencyPredictor.enabled }}
{{- fail "inferenceExtension.latencyPredictor.enabled: predicted-latency scheduling is not built yet (issue 17); leave it false" }}
{{- end }}
{{- if ne (.Values.inferencePool.modelServerProtocol | default "http") "http" }}
{{- fail (printf "inferencePool.modelServerProtocol=%s: only http model servers are supported (the EPP has no vLLM gRPC parser yet, issue 13)" .Values.inferencePool.modelServerProtocol) }}
{{- end }}
{{- if and $ie.monitoring.prometheus.enabled (eq .Values.provider.name "gke") }}
{{- fail "inferenceExtension.monitoring.prometheus.enabled with provider.name=gke: the GKE PodMonitoring objects are not rendered yet (issue 13); scrape the EPP's metrics port yourself" }}
{{- end }}
{{- if and $ie.sidecar.enabled $ie.sidecar.configMap (not $ie.sidecar.configMap.name) }}
{{- fail "inferenceExtension.sidecar.configMap.name is required when sidecar.configMap is given" }}
{{- end }}
{{- end -}}
