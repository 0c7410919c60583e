{{/* The chart's name. */}}
{{- define "toa-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name, suffixed with the chart's unless it holds it. */}}
{{- define "toa-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "toa-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toa-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "toa-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "toa-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "toa-operator.serviceAccountName" -}}
{{- default (include "toa-operator.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "toa-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "toa-operator.agentImage" -}}
{{- printf "%s:%s" .Values.agentImage.repository (default .Chart.AppVersion .Values.agentImage.tag) }}
{{- end }}
