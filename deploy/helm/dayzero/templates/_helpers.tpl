{{/* Chart name, truncated to a DNS label. */}}
{{- define "dayzero.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified prefix of every resource name (short enough for "-prefill" etc. to fit). */}}
{{- define "dayzero.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dayzero.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "dayzero.labels" -}}
helm.sh/chart: {{ include "dayzero.chart" . }}
app.kubernetes.io/name: {{ include "dayzero.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component; call with (dict "root" $ "component" "prefill"). */}}
{{- define "dayzero.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dayzero.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component. */}}
{{- define "dayzero.componentLabels" -}}
{{ include "dayzero.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference of one service; call with (dict "root" $ "repo" .Values.image.router). */}}
{{- define "dayzero.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) .repo $tag -}}
{{- else -}}
{{- printf "%s:%s" .repo $tag -}}
{{- end -}}
{{- end }}

{{- define "dayzero.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dayzero.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* redis:// URL of the registry: the bundled StatefulSet or the external one (required). */}}
{{- define "dayzero.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis:6379/0" (include "dayzero.fullname" .) -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end }}

{{/* The router's gRPC address as the frontend dials it. */}}
{{- define "dayzero.routerAddress" -}}
{{- printf "%s-router:%d" (include "dayzero.fullname" .) (int .Values.router.grpcPort) -}}
{{- end }}

{{/* Model directory inside the container. */}}
{{- define "dayzero.modelDir" -}}
{{- if eq .Values.model.volume.type "demo" -}}
/models/{{ .Values.model.demo.preset }}
{{- else -}}
/models/{{ .Values.model.path }}
{{- end -}}
{{- end }}

{{/* GPUs per decode pod: max(tp, ep); the smaller must divide the larger. */}}
{{- define "dayzero.decodeGpus" -}}
{{- $tp := int .Values.decode.tp -}}
{{- $ep := int .Values.decode.ep -}}
{{- if or (lt $tp 1) (lt $ep 1) -}}
{{- fail (printf "decode.tp (%d) and decode.ep (%d) must be at least 1" $tp $ep) -}}
{{- end -}}
{{- $hi := max $tp $ep | int -}}
{{- $lo := min $tp $ep | int -}}
{{- if ne (mod $hi $lo) 0 -}}
{{- fail (printf "decode.tp (%d) and decode.ep (%d): the smaller must divide the larger (experts share the TP ranks)" $tp $ep) -}}
{{- end -}}
{{- $hi -}}
{{- end }}

{{/* NVLink multicast off (it can take shared GPUs down); never overridable. */}}
{{- define "dayzero.lockedEnvNames" -}}
NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS NCCL_MNNVL_ENABLE
{{- end }}

{{/* Environment of a prefill/decode container; call with (dict "root" $ "stage" .Values.decode). */}}
{{- define "dayzero.workerEnv" -}}
{{- $w := .root.Values.workers -}}
{{- $locked := splitList " " (include "dayzero.lockedEnvNames" .root) -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: PYTHONUNBUFFERED
  value: "1"
{{- if eq $w.device "cuda" }}
- name: NCCL_DEBUG
  value: {{ $w.nccl.debug | quote }}
{{- if $w.nccl.socketIfname }}
- name: NCCL_SOCKET_IFNAME
  value: {{ $w.nccl.socketIfname | quote }}
{{- end }}
{{- if $w.nccl.ibDisable }}
- name: NCCL_IB_DISABLE
  value: "1"
{{- end }}
{{- end }}
{{- if $w.ucx.tls }}
- name: UCX_TLS
  value: {{ $w.ucx.tls | quote }}
{{- end }}
{{- if $w.ucx.netDevices }}
- name: UCX_NET_DEVICES
  value: {{ $w.ucx.netDevices | quote }}
{{- end }}
{{- range (concat ($w.extraEnv | default list) (.stage.extraEnv | default list)) }}
{{- if not (has .name $locked) }}
- {{ toYaml . | nindent 2 | trim }}
{{- end }}
{{- end }}
- name: NCCL_NVLS_ENABLE
  value: "0"
- name: NCCL_MNNVL_ENABLE
  value: "0"
- name: TORCH_SYMM_MEM_DISABLE_MULTICAST
  value: "1"
- name: NVSHMEM_DISABLE_NVLS
  value: "1"
{{- end }}

{{/* Common env of the CPU-only services. */}}
{{- define "dayzero.extraEnv" -}}
{{- range . }}
- {{ toYaml . | nindent 2 | trim }}
{{- end }}
{{- end }}

{{/* HTTP probes of a dayzero process; call with (dict "port" "http" "startupSeconds" N). */}}
{{- define "dayzero.probes" -}}
startupProbe:
  httpGet:
    path: /health
    port: {{ .port }}
  periodSeconds: 5
  failureThreshold: {{ div (int .startupSeconds) 5 | max 1 }}
livenessProbe:
  httpGet:
    path: /health
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /ready
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end }}

{{/* PodDisruptionBudget of one component; call with (dict "root" $ "component" "router" "pdb" .Values.router.pdb). */}}
{{- define "dayzero.pdb" -}}
{{- if .pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "dayzero.fullname" .root }}-{{ .component }}
  labels:
    {{- include "dayzero.componentLabels" (dict "root" .root "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "dayzero.selectorLabels" (dict "root" .root "component" .component) | nindent 6 }}
{{- end }}
{{- end }}
