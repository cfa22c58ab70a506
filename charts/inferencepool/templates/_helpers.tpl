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

{{/* Leader election is on whenever more than one replica runs (active-passive). */}}
{{- define "inferencepool.leaderElection" -}}
{{- if gt (int .Values.inferenceExtension.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{- define "inferencepool.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- printf "%s/%s:%s" $img.hub $img.name (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
