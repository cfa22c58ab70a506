{{/*
llm-d-router v0.10's chart values (its llm-d-router-gateway chart: `router.*` from routerlib,
`provider.*`, `httpRoute.*`), read into this chart's own keys. Every template includes this
first; it runs once per render (a marker in .Values), so no template sees the values half
adopted. What cannot be honoured is refused with the reason, never ignored.
*/}}
{{- define "inferencepool.adoptRouter" -}}
{{- if not (hasKey .Values "_routerAdopted") -}}
{{- $_ := set .Values "_routerAdopted" true -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $pool := .Values.inferencePool -}}
{{- $r := .Values.router | default dict -}}
{{- $epp := $r.epp | default dict -}}
{{- range $k := list "replicas" "extProcPort" "env" "pluginsConfigFile" "pluginsCustomConfig" "extraContainerPorts" "resources" "affinity" "tolerations" "flags" "volumes" "volumeMounts" -}}
{{- if hasKey $epp $k }}{{ $_ := set $ie $k (get $epp $k) }}{{ end -}}
{{- end -}}
{{- if hasKey $epp "grpcHealthPort" }}{{ $_ := set $ie "healthPort" $epp.grpcHealthPort }}{{ end -}}
{{- if hasKey $r "metricsPort" }}{{ $_ := set $ie "metricsPort" $r.metricsPort }}{{ end -}}
{{- if hasKey $r "extraServicePorts" }}{{ $_ := set $ie "extraServicePorts" $r.extraServicePorts }}{{ end -}}
{{- with $epp.image -}}
{{- if contains "llm-d-router-endpoint-picker" (.repository | default "") -}}
{{- fail (printf "router.epp.image.repository=%s is llm-d-router's Go EPP: this chart runs this project's EPP with its own flags; leave router.epp.image out (or name this project's image)" .repository) -}}
{{- end -}}
{{- $_ := set $ie "image" (mergeOverwrite (deepCopy $ie.image) .) -}}
{{- end -}}
{{- with $epp.metricsDataSource }}{{ $_ := set $ie "metricsDataSource" (mergeOverwrite (deepCopy $ie.metricsDataSource) .) }}{{ end -}}
{{- if $epp.podAnnotations -}}
{{- fail "router.epp.podAnnotations: this chart does not annotate the EPP pods yet; set them with a post-render (kustomize) or leave them out" -}}
{{- end -}}
{{- with $epp.parsers }}{{ $_ := set $pool "parsers" . }}{{ end -}}
{{- with $r.proxy }}{{ if .enabled -}}
{{- fail "router.proxy.enabled: llm-d-router's standalone Envoy proxy is not part of this chart; use a Gateway (provider.name) or this project's local stack (docs/kubernetes.md)" -}}
{{- end }}{{ end -}}
{{- with $r.tokenizer }}{{ if .enabled -}}
{{- fail "router.tokenizer.enabled: the vLLM tokenizer sidecar is not rendered by this chart; run the tokenizer as its own Service and point token-producer at it (pluginsCustomConfig)" -}}
{{- end }}{{ end -}}
{{- with $r.monitoring -}}
{{- if (.provider | default dict).name -}}
{{- fail "router.monitoring.provider.name: use provider.name=gke for Google Cloud Managed Prometheus (a PodMonitoring), as this chart's GIE layout has it" -}}
{{- end -}}
{{- $m := deepCopy . -}}{{- $_ := unset $m "provider" -}}
{{- $_ := set $ie "monitoring" (mergeOverwrite (deepCopy $ie.monitoring) $m) -}}
{{- end -}}
{{- with $r.tracing }}{{ $_ := set $ie "tracing" (mergeOverwrite (deepCopy $ie.tracing) .) }}{{ end -}}
{{- with $r.latencyPredictor }}{{ $_ := set $ie.latencyPredictor "enabled" (.enabled | default false) }}{{ end -}}
{{- if and (hasKey $r "clusterDomain") (ne $r.clusterDomain "cluster.local") -}}
{{- fail (printf "router.clusterDomain=%s: this chart names Services by their short names and needs no cluster domain; leave it out" $r.clusterDomain) -}}
{{- end -}}
{{- with $r.inferencePool -}}
{{- if and (hasKey . "create") (not .create) -}}
{{- fail "router.inferencePool.create=false: this chart's release is one InferencePool and its EPP; install the EPP without a pool with the EPP's --endpoint-selector instead (docs/kubernetes.md)" -}}
{{- end -}}
{{- with .failureMode }}{{ $_ := set $ie "failureMode" . }}{{ end -}}
{{- end -}}
{{- with $r.modelServers -}}
{{- with .type }}{{ $_ := set $pool "modelServerType" . }}{{ end -}}
{{- with .protocol }}{{ $_ := set $pool "modelServerProtocol" . }}{{ end -}}
{{- with .targetPorts }}{{ $_ := set $pool "targetPorts" . }}{{ end -}}
{{- with .targetPortNumber }}{{ $_ := set $pool "targetPorts" (list (dict "number" .)) }}{{ end -}}
{{- with .matchLabels }}{{ $_ := set $pool "modelServers" (dict "matchLabels" .) }}{{ end -}}
{{- end -}}
{{- with $r.inferenceObjectives -}}
{{- $objs := list -}}
{{- range . }}{{ $objs = append $objs (merge (dict "apiVersion" "llm-d.ai/v1alpha2") .) }}{{ end -}}
{{- $_ := set $.Values "inferenceObjectives" (concat ($.Values.inferenceObjectives | default list) $objs) -}}
{{- end -}}
{{- with .Values.httpRoute -}}
{{- $route := $.Values.experimentalHttpRoute | default dict -}}
{{- if hasKey . "create" }}{{ $_ := set $route "enabled" .create }}{{ end -}}
{{- with .inferenceGatewayName }}{{ $_ := set $route "inferenceGatewayName" . }}{{ end -}}
{{- with .requestTimeout }}{{ $_ := set $route "requestTimeout" . }}{{ end -}}
{{- with .baseModel }}{{ $_ := set $route "baseModel" . }}{{ end -}}
{{- if .inferenceGatewayNamespace -}}
{{- fail "httpRoute.inferenceGatewayNamespace: this chart's HTTPRoute names a Gateway in the release namespace only" -}}
{{- end -}}
{{- if .headerMatches -}}
{{- fail "httpRoute.headerMatches: this chart's HTTPRoute matches on the path (and baseModel's header) only" -}}
{{- end -}}
{{- $_ := set $.Values "experimentalHttpRoute" $route -}}
{{- end -}}
{{- with (.Values.provider | default dict).gke -}}
{{- if (.preferredBackends | default dict).enabled -}}
{{- fail "provider.gke.preferredBackends: GKE preferred backends are not rendered by this chart" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
