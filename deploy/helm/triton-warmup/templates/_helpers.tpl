{{- define "triton-warmup.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-warmup.fullname" -}}
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

{{- define "triton-warmup.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "triton-warmup.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-warmup.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "triton-warmup.labels" -}}
helm.sh/chart: {{ include "triton-warmup.chart" . }}
{{ include "triton-warmup.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: triton-warmup
{{- end -}}

{{- define "triton-warmup.claimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-cache" (include "triton-warmup.fullname" .)) -}}
{{- end -}}

{{- define "triton-warmup.manifestConfigMap" -}}
{{- .Values.manifest.existingConfigMap | default (printf "%s-manifest" (include "triton-warmup.fullname" .)) -}}
{{- end -}}

{{/* The warmup init container's image: warmup.image when set, else the server's own
(this package installed in it), so that the warmup compiles with the server's torch,
Triton and model code. */}}
{{- define "triton-warmup.warmupImage" -}}
{{- $own := .Values.warmup.image | default dict -}}
{{- $image := ternary $own .Values.server.image (not (empty $own.repository)) -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}

{{- define "triton-warmup.warmupPullPolicy" -}}
{{- $own := .Values.warmup.image | default dict -}}
{{- $inherited := ternary "IfNotPresent" .Values.server.image.pullPolicy (not (empty $own.repository)) -}}
{{- $own.pullPolicy | default $inherited | default "IfNotPresent" -}}
{{- end -}}

{{/* Paths every container agrees on. */}}
{{- define "triton-warmup.volumePath" -}}/var/lib/triton-warmup{{- end -}}
{{- define "triton-warmup.tritonCachePath" -}}/var/cache/triton{{- end -}}
{{- define "triton-warmup.workPath" -}}/run/triton-warmup{{- end -}}
{{/* Compiled models' Inductor cache (and the CUDA driver's JIT cache in it): the warmup
restores and fills it, the server's torch.compile reads it. */}}
{{- define "triton-warmup.inductorCachePath" -}}/var/cache/torchinductor{{- end -}}
{{- define "triton-warmup.statusFile" -}}{{ include "triton-warmup.workPath" . }}/status.json{{- end -}}
{{/* Serving processes write their metrics files here; the sidecar re-exports them. */}}
{{- define "triton-warmup.servingMetricsPath" -}}/run/triton-warmup-metrics{{- end -}}
{{- define "triton-warmup.manifestPath" -}}/etc/triton-warmup{{- end -}}
{{- define "triton-warmup.bundlePath" -}}
{{- if eq .Values.bundles.source "configMap" -}}/etc/triton-warmup-bundles
{{- else if eq .Values.bundles.source "pvc" -}}{{ include "triton-warmup.volumePath" . }}/{{ .Values.bundles.pvcPath }}
{{- else -}}{{ include "triton-warmup.volumePath" . }}/bundles
{{- end -}}
{{- end -}}

{{/* Environment shared by the warmup init container and the sidecar. */}}
{{- define "triton-warmup.env" -}}
- name: TRITON_WARMUP_VOLUME
  value: {{ include "triton-warmup.volumePath" . | quote }}
- name: TRITON_WARMUP_MANIFEST
  value: {{ printf "%s/manifest.yaml" (include "triton-warmup.manifestPath" .) | quote }}
- name: TRITON_WARMUP_WORK_DIR
  value: {{ include "triton-warmup.workPath" . | quote }}
- name: TRITON_WARMUP_STATUS_FILE
  value: {{ include "triton-warmup.statusFile" . | quote }}
- name: TRITON_WARMUP_TRITON_CACHE_DIR
  value: {{ include "triton-warmup.tritonCachePath" . | quote }}
- name: TRITON_WARMUP_INDUCTOR_CACHE_DIR
  value: {{ include "triton-warmup.inductorCachePath" . | quote }}
- name: TRITON_WARMUP_BUNDLE_DIR
  value: {{ include "triton-warmup.bundlePath" . | quote }}
- name: TRITON_WARMUP_MATCH_POLICY
  value: {{ .Values.warmup.matchPolicy | quote }}
- name: TRITON_WARMUP_OTHER_WORLD_SIZES
  value: {{ .Values.warmup.otherWorldSizes | quote }}
- name: TRITON_WARMUP_LOG_FORMAT
  value: {{ .Values.warmup.logFormat | quote }}
{{- if eq .Values.lock.backend "redis" }}
- name: TRITON_WARMUP_LOCK_URL
  value: {{ .Values.lock.redisUrl | quote }}
- name: TRITON_WARMUP_LOCK_FALLBACK
  value: {{ .Values.lock.fallback | default "none" | quote }}
{{- if eq (toString .Values.lock.remoteTier) "false" }}
- name: TRITON_WARMUP_REMOTE_URL
  value: "off"
{{- end }}
{{- end }}
{{- end -}}

{{/* Triton's compile cache on the remote tier (warmup.triton_remote_cache): a kernel
another pod compiled is loaded instead of compiled, in the warmup and in the server. */}}
{{- define "triton-warmup.tritonRemoteEnv" -}}
{{- if .Values.lock.tritonCache }}
{{- if or (ne .Values.lock.backend "redis") (eq (toString .Values.lock.remoteTier) "false") }}
{{- fail "lock.tritonCache needs lock.backend=redis and lock.remoteTier=true: Triton's kernels are shared on the remote tier" }}
{{- end }}
- name: TRITON_CACHE_MANAGER
  value: warmup.triton_remote_cache:TieredCacheManager
- name: TRITON_WARMUP_REMOTE_URL
  value: {{ .Values.lock.redisUrl | quote }}
- name: TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S
  value: {{ .Values.lock.tritonCacheTimeoutSeconds | default 0.2 | quote }}
{{- end }}
{{- end -}}

{{/* What torch.compile in the server needs to hit the artifacts the warmup left: set
before the process starts (the CUDA driver reads its cache path when CUDA starts). */}}
{{- define "triton-warmup.inductorEnv" -}}
- name: TORCHINDUCTOR_CACHE_DIR
  value: {{ include "triton-warmup.inductorCachePath" . | quote }}
- name: TORCHINDUCTOR_FX_GRAPH_CACHE
  value: "1"
- name: TORCHINDUCTOR_AUTOGRAD_CACHE
  value: "1"
- name: TRITON_WARMUP_STATIC_LAUNCHER
  value: {{ ternary "on" "off" (ne .Values.warmup.staticLauncher false) | quote }}
- name: CUDA_CACHE_PATH
  value: {{ printf "%s/cuda-jit" (include "triton-warmup.inductorCachePath" .) | quote }}
{{- end -}}
