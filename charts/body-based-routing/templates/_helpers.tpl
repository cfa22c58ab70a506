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

{{/* Image: upstream's registry/repository/tag; this chart's earlier hub/name still work. */}}
{{- define "bbr.image" -}}
{{- $img := .Values.bbr.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- if $img.hub -}}
{{- printf "%s/%s:%s" $img.hub (default "bbr" $img.name) $tag -}}
{{- else -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* ConfigMaps watched in every namespace: upstream's multiNamespace or our allNamespaces. */}}
{{- define "bbr.allNamespaces" -}}
{{- if or .Values.bbr.multiNamespace .Values.bbr.allNamespaces -}}true{{- end -}}
{{- end -}}

{{/* Extra flags as container args: the map form or upstream v1.0's list of {name, value}. */}}
{{- define "bbr.flags" -}}
{{- $flags := .Values.bbr.flags -}}
{{- if kindIs "slice" $flags -}}
{{- range $flags }}
- {{ printf "--%s=%v" .name (.value | toString) | quote }}
{{- end }}
{{- else -}}
{{- range $name, $value := $flags }}
- {{ printf "--%s=%v" $name ($value | toString) | quote }}
{{- end }}
{{- end -}}
{{- end -}}
