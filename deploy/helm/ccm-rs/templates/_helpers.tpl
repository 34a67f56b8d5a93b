{{/*
The fixed parts shared with `ccm manifests` (RBAC rules, tolerations, probes, security
contexts): files/ccm.json is the one source for both.
*/}}
{{- define "ccm.fixed" -}}
{{ .Files.Get "files/ccm.json" }}
{{- end -}}
