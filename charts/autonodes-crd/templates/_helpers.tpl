{{/* Removes the CEL rules (`x-kubernetes-validations`) from a parsed schema, in place: a
server before 1.25 refuses them in a server-side apply and its kubectl in client-side
validation; the controller checks the same rules itself and says so in a condition. */}}
{{- define "autonodes-crd.withoutCel" -}}
{{- if kindIs "map" . -}}
{{- $_ := unset . "x-kubernetes-validations" -}}
{{- range $_, $v := . }}{{ include "autonodes-crd.withoutCel" $v }}{{ end -}}
{{- else if kindIs "slice" . -}}
{{- range . }}{{ include "autonodes-crd.withoutCel" . }}{{ end -}}
{{- end -}}
{{- end -}}
