{{/* Upstream values this chart cannot honour yet: refused with the reason, never ignored. */}}
{{- define "inferencepool.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $_ := include "inferencepool.protocol" . }}
{{- $store := $ie.stateStore | default dict -}}
{{- if and (eq ($ie.haMode | default "") "active-active") (not $store.url) (not $store.secretRef) }}
{{- fail "inferenceExtension.haMode=active-active needs inferenceExtension.stateStore.url or stateStore.secretRef (the Valkey the replicas share; docs/active-active.md)" }}
{{- end }}
{{- if and $store.url $store.secretRef }}
{{- fail "inferenceExtension.stateStore: give url or secretRef, not both" }}
{{- end }}
{{- if and $store.secretRef (not (and $store.secretRef.name $store.secretRef.key)) }}
{{- fail "inferenceExtension.stateStore.secretRef needs name and key" }}
{{- end }}
{{- if and ($store.url | default $store.secretRef) (ne ($ie.haMode | default "") "active-active") }}
{{- fail "inferenceExtension.stateStore is shared by active-active replicas: set inferenceExtension.haMode=active-active" }}
{{- end }}
{{- if and $store.url (not $store.allowInsecure) (not (regexMatch "^[a-z]+://[^@/]*:[^@/]+@" $store.url)) }}
{{- fail "inferenceExtension.stateStore.url has no password: anyone who can reach the store could steer picks; put a URL with its password in a Secret (stateStore.secretRef), or set stateStore.allowInsecure=true" }}
{{- end }}
{{- if and (eq ($ie.haMode | default "") "active-active") (not $store.allowInsecure) (not (and $store.signingSecretRef $store.signingSecretRef.name $store.signingSecretRef.key)) }}
{{- fail "inferenceExtension.stateStore.signingSecretRef {name, key} is needed: the shared secret that signs what replicas write, so a writer without it cannot steer picks (or set stateStore.allowInsecure=true)" }}
{{- end }}
{{- if and $ie.sidecar.enabled $ie.sidecar.configMap (not $ie.sidecar.configMap.name) }}
{{- fail "inferenceExtension.sidecar.configMap.name is required when sidecar.configMap is given" }}
{{- end }}
{{- include "inferencepool.validatePD" . }}
{{- end -}}

{{/* ours: disaggregation (docs/pd.md), one message per mistake. */}}
{{- define "inferencepool.validatePD" -}}
{{- $pd := .Values.disaggregation | default dict -}}
{{- $ms := $pd.modelServers | default dict -}}
{{- $pool := .Values.inferencePool -}}
{{- if and $ms.enabled (not $pd.enabled) }}
{{- fail "disaggregation.modelServers.enabled needs disaggregation.enabled=true (the decode pods' sidecars need the EPP's P/D config)" }}
{{- end }}
{{- if and .Values.inferenceExtension.latencyPredictor.enabled (eq (include "inferencepool.configFile" .) "pd-plugins.yaml") }}
{{- fail "disaggregation.enabled and inferenceExtension.latencyPredictor.enabled: the P/D config the EPP loads has no latency plugins; enable one of them, or give your own config (pluginsCustomConfig + pluginsConfigFile)" }}
{{- end }}
{{- if $pd.enabled }}
{{- if ne (include "inferencepool.modelServerType" .) "vllm" }}
{{- fail (printf "disaggregation needs inferencePool.modelServerType=vllm, got %s (pd-sidecar speaks vLLM's P/D connectors only)" $pool.modelServerType) }}
{{- end }}
{{- if ne (include "inferencepool.protocol" .) "http" }}
{{- fail "disaggregation needs inferencePool.modelServerProtocol=http (pd-sidecar relays OpenAI HTTP requests, not vLLM's gRPC API)" }}
{{- end }}
{{- if hasKey $pool.modelServers.matchLabels "llm-d.ai/role" }}
{{- fail "inferencePool.modelServers.matchLabels must not hold llm-d.ai/role with disaggregation: the pool selects prefill and decode pods alike (prefill-filter/decode-filter tell them apart)" }}
{{- end }}
{{- end }}
{{- if include "inferencepool.pdModelServers" . }}
{{- if ne (len $pool.targetPorts) 1 }}
{{- fail (printf "disaggregation.modelServers needs exactly one inferencePool.targetPorts entry, got %d (pd-sidecar serves one port: no data-parallel ranks)" (len $pool.targetPorts)) }}
{{- end }}
{{- $port := (first $pool.targetPorts).number | int }}
{{- if not $ms.model }}
{{- fail "disaggregation.modelServers.model is required: the model vLLM serves (--model)" }}
{{- end }}
{{- if not $ms.image.tag }}
{{- fail "disaggregation.modelServers.image.tag is required: the vLLM version to run (pin the one your NIXL setup was tested with)" }}
{{- end }}
{{- if lt ($ms.decode.replicas | int) 1 }}
{{- fail (printf "disaggregation.modelServers.decode.replicas must be at least 1, got %v (the gateway sends every request to a decode pod)" $ms.decode.replicas) }}
{{- end }}
{{- if lt ($ms.prefill.replicas | int) 0 }}
{{- fail (printf "disaggregation.modelServers.prefill.replicas must be 0 or more, got %v" $ms.prefill.replicas) }}
{{- end }}
{{- if eq ($ms.decode.vllmPort | int) $port }}
{{- fail (printf "disaggregation.modelServers.decode.vllmPort must differ from the pool's target port %d, which the pd-sidecar listens on" $port) }}
{{- end }}
{{- $metrics := $ms.sidecar.metricsPort | int }}
{{- if and $metrics (has $metrics (list $port ($ms.decode.vllmPort | int))) }}
{{- fail (printf "disaggregation.modelServers.sidecar.metricsPort %d is taken by the sidecar's or vLLM's port in decode pods (0 turns the sidecar's metrics off)" $metrics) }}
{{- end }}
{{- end }}
{{- end -}}
