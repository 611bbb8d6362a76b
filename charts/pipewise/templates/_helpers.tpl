{{/* The release's base name, at most 40 characters (room for the suffixes below). */}}
{{- define "pipewise.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pipewise.coordinator" -}}{{ include "pipewise.fullname" . }}-coordinator{{- end -}}
{{- define "pipewise.worker" -}}{{ include "pipewise.fullname" . }}-worker{{- end -}}
{{- define "pipewise.data" -}}{{ .Values.storage.existingClaim | default (printf "%s-data" (include "pipewise.fullname" .)) }}{{- end -}}

{{/* The coordinator's URL inside the cluster. */}}
{{- define "pipewise.coordinatorUrl" -}}
{{ ternary "https" "http" .Values.tls.enabled }}://{{ include "pipewise.coordinator" . }}:{{ .Values.coordinator.port }}
{{- end -}}

{{/* Where the TLS and token Secrets are mounted. */}}
{{- define "pipewise.tlsDir" -}}/var/run/pipewise/tls{{- end -}}
{{- define "pipewise.tokenDir" -}}/var/run/pipewise/tokens{{- end -}}

{{/*
The security flags of a container: `role` is coordinator, worker or submit. The
coordinator serves TLS and takes both tokens; a worker presents its certificate and the
worker token; the submit Job checks the coordinator with ca.crt and sends the submitter token.
*/}}
{{- define "pipewise.securityArgs" -}}
{{- $v := .root.Values }}
{{- $tls := include "pipewise.tlsDir" .root }}
{{- $tokens := include "pipewise.tokenDir" .root }}
{{- if $v.tls.enabled }}
{{- if eq .role "coordinator" }}
- --tls-cert
- {{ $tls }}/tls.crt
- --tls-key
- {{ $tls }}/tls.key
{{- if $v.tls.requireWorkerCertificates }}
- --tls-client-ca
- {{ $tls }}/ca.crt
{{- end }}
{{- else }}
- --tls-ca
- {{ $tls }}/ca.crt
{{- end }}
{{- if eq .role "worker" }}
- --tls-cert
- {{ $tls }}/tls.crt
- --tls-key
- {{ $tls }}/tls.key
{{- end }}
{{- end }}
{{- if $v.tokens.enabled }}
{{- if eq .role "coordinator" }}
- --submitter-token-file
- {{ $tokens }}/submitter
- --worker-token-file
- {{ $tokens }}/worker
{{- else }}
- --token-file
- {{ $tokens }}/{{ ternary "worker" "submitter" (eq .role "worker") }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The TLS and token mounts of a container (read-only). */}}
{{- define "pipewise.securityMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "pipewise.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.tokens.enabled }}
- name: tokens
  mountPath: {{ include "pipewise.tokenDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The TLS and token volumes of a pod: each role gets only the token it sends. */}}
{{- define "pipewise.securityVolumes" -}}
{{- $v := .root.Values }}
{{- if $v.tls.enabled }}
- name: tls
  secret:
    secretName: {{ $v.tls.secretName | quote }}
    # 0440: the owner and the pod's fsGroup read it (the containers run as a non-root user).
    defaultMode: 288
{{- end }}
{{- if $v.tokens.enabled }}
- name: tokens
  secret:
    secretName: {{ $v.tokens.secretName | quote }}
    # 0440: the owner and the pod's fsGroup read it (the containers run as a non-root user).
    defaultMode: 288
    {{- if ne .role "coordinator" }}
    items:
      - key: {{ ternary "worker" "submitter" (eq .role "worker") }}
        path: {{ ternary "worker" "submitter" (eq .role "worker") }}
    {{- end }}
{{- end }}
{{- end -}}

{{/* The CPU image (deploy/Dockerfile): the coordinator, the submit hook Job, CPU workers. */}}
{{- define "pipewise.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The workers' image: with workers.gpu.enabled the CUDA image (deploy/Dockerfile.cuda), whose
empty fields follow `image` (tag: image.tag or appVersion, with "-cuda"); else the CPU image.
*/}}
{{- define "pipewise.workerImage" -}}
{{- if .Values.workers.gpu.enabled -}}
{{- $cuda := .Values.workers.gpu.image | default dict -}}
{{ $cuda.repository | default .Values.image.repository }}:{{ $cuda.tag | default (printf "%s-cuda" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- else -}}
{{ include "pipewise.image" . }}
{{- end -}}
{{- end -}}

{{- define "pipewise.workerPullPolicy" -}}
{{- if .Values.workers.gpu.enabled -}}
{{ (.Values.workers.gpu.image | default dict).pullPolicy | default .Values.image.pullPolicy }}
{{- else -}}
{{ .Values.image.pullPolicy }}
{{- end -}}
{{- end -}}

{{- define "pipewise.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (coordinator or worker). */}}
{{- define "pipewise.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The data volume of a pod. */}}
{{- define "pipewise.dataVolume" -}}
- name: data
{{- if .Values.storage.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "pipewise.data" . }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* The pod securityContext of every pod. */}}
{{- define "pipewise.podSecurityContext" -}}
{{- with .Values.podSecurityContext -}}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The securityContext of every container. */}}
{{- define "pipewise.securityContext" -}}
{{- with .Values.securityContext -}}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The scratch volume (/tmp) of a pod: its root filesystem is read-only. */}}
{{- define "pipewise.scratchVolume" -}}
{{- $dir := dict }}
{{- with .Values.scratch.medium }}{{ $_ := set $dir "medium" . }}{{ end }}
{{- with .Values.scratch.sizeLimit }}{{ $_ := set $dir "sizeLimit" (toString .) }}{{ end }}
- name: scratch
  emptyDir: {{- toYaml $dir | nindent 4 }}
{{- end -}}

{{- define "pipewise.scratchMount" -}}
- name: scratch
  mountPath: /tmp
{{- end -}}

{{/*
The startup, readiness and liveness probes of a container: grpc.health.v1 (the overall
status, service "") on `port`, with the timings of `probes` (startup, readiness, liveness).
*/}}
{{- define "pipewise.grpcProbes" -}}
{{- range $i, $probe := list "startup" "readiness" "liveness" }}
{{- if $i }}{{ "\n" }}{{ end -}}
{{ $probe }}Probe:
  {{- /* The kubelet's gRPC probe speaks no TLS: a TLS port is checked with TCP. */}}
  {{ ternary "tcpSocket" "grpc" (default false $.tls) }}:
    port: {{ $.port }}
  {{- toYaml (get $.probes $probe) | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The workers' Volcano PodGroup. */}}
{{- define "pipewise.podGroup" -}}{{ include "pipewise.worker" . }}{{- end -}}

{{/* The workers' scheduler: gang.schedulerName, else volcano with a PodGroup. */}}
{{- define "pipewise.workerScheduler" -}}
{{- .Values.gang.schedulerName | default (ternary "volcano" "" .Values.gang.volcano.enabled) -}}
{{- end -}}

{{/* An integer (a float to the template when it comes from a values file) or a percentage. */}}
{{- define "pipewise.intOrPercent" -}}
{{- ternary (quote .) (int64 .) (kindIs "string" .) -}}
{{- end -}}

{{/* The NetworkPolicy rule for scrapes of the "metrics" port (no `from`: any source). */}}
{{- define "pipewise.metricsIngress" -}}
- ports:
    - port: metrics
      protocol: TCP
  {{- with .Values.networkPolicy.metricsFrom }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
