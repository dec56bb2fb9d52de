{{/* Chart name. */}}
{{- define "autonodes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "autonodes.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "autonodes.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "autonodes.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The `annotations:` of an object's metadata: `additionalAnnotations` under the object's
own (`list $ .Values.service.annotations`; the object's win on the same key), nothing when
both are empty. Used as `{{- with include "autonodes.annotations" (list $ nil) }}{{ . | nindent 2 }}{{- end }}`. */}}
{{- define "autonodes.annotations" -}}
{{- $root := index . 0 -}}
{{- $all := merge (deepCopy (index . 1 | default dict)) (deepCopy ($root.Values.additionalAnnotations | default dict)) -}}
{{- with $all -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Labels that select the controller pods. */}}
{{- define "autonodes.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autonodes.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ServiceAccount's name. */}}
{{- define "autonodes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "autonodes.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
