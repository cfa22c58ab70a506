{{- define "bbr.name" -}}
{{- .Values.bbr.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bbr.labels" -}}
app.kubernetes.io/name: body-based-routing
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "bbr.selectorLabels" -}}
app: {{ include "bbr.name" . }}
{{- end -}}

{{- define "bbr.image" -}}
{{- $img := .Values.bbr.image -}}
{{- printf "%s/%s:%s" $img.hub $img.name (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
