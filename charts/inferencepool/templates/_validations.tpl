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
{{- if and $ie.sidecar.enabled $ie.sidecar.configMap (not $ie.sidecar.configMap.name) }}
{{- fail "inferenceExtension.sidecar.configMap.name is required when sidecar.configMap is given" }}
{{- end }}
{{- end -}}
