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
{{/* The cache families' own pod folders (default <work dir>/families/<name>), writable
in every container, the server's included, for the sidecar to harvest. */}}
{{- define "triton-warmup.familyFoldersPath" -}}{{ include "triton-warmup.workPath" . }}/families{{- end -}}
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
  value: {{ include "triton-warmup.redisUrl" . | quote }}
{{- include "triton-warmup.redisPasswordEnv" . }}
- name: TRITON_WARMUP_LOCK_FALLBACK
  value: {{ .Values.lock.fallback | default "none" | quote }}
{{- if eq (toString .Values.lock.remoteTier) "false" }}
- name: TRITON_WARMUP_REMOTE_URL
  value: "off"
{{- end }}
{{- end }}
{{- include "triton-warmup.trustEnv" . }}
{{- end -}}

{{/* The Redis URL the containers use: lock.redisUrl, refused when it carries a password
(that comes from a Secret: redisPasswordSecret), with the CA's path (redisCa) added as
redis-py's ssl_ca_certs. */}}
{{- define "triton-warmup.redisUrl" -}}
{{- $url := .Values.lock.redisUrl | default "" -}}
{{- if or (regexMatch "^[a-z]+://[^/?#@]*:[^/?#@]*@" $url) (regexMatch "[?&]password=" $url) -}}
{{- fail "lock.redisUrl carries a password: give the URL without it and the password in a Secret (lock.redisPasswordSecret.name and .key)" -}}
{{- end -}}
{{- if include "triton-warmup.redisCaVolume" . -}}
{{- if not (hasPrefix "rediss://" $url) -}}
{{- fail "lock.redisCa is for TLS: lock.redisUrl must start with rediss://" -}}
{{- end -}}
{{- $url = printf "%s%sssl_ca_certs=%s/%s" $url (ternary "&" "?" (contains "?" $url)) (include "triton-warmup.redisCaPath" .) .Values.lock.redisCa.key -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{- define "triton-warmup.redisPasswordEnv" -}}
{{- $secret := .Values.lock.redisPasswordSecret | default dict -}}
{{- if $secret.name }}
- name: TRITON_WARMUP_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name | quote }}
      key: {{ $secret.key | default "password" | quote }}
{{- end }}
{{- end -}}

{{/* The Redis server's CA (rediss://): a volume of the pod, mounted by every container
that reaches Redis. */}}
{{- define "triton-warmup.redisCaPath" -}}/etc/triton-warmup/redis-ca{{- end -}}
{{- define "triton-warmup.redisCaVolume" -}}
{{- $ca := .Values.lock.redisCa | default dict -}}
{{- if and (eq .Values.lock.backend "redis") $ca.secretName -}}
secret:
  secretName: {{ $ca.secretName | quote }}
{{- else if and (eq .Values.lock.backend "redis") $ca.configMapName -}}
configMap:
  name: {{ $ca.configMapName | quote }}
{{- end -}}
{{- end -}}

{{/* Trust: the fleet's trusted public keys in every container that reads bundles or the
Redis tier; the signing key where a container publishes to the Redis tier (see
triton-warmup.signs); neither with trust.allowUnsigned. */}}
{{- define "triton-warmup.trustedKeysPath" -}}/etc/triton-warmup/trusted-keys{{- end -}}
{{- define "triton-warmup.signingPath" -}}/etc/triton-warmup/signing{{- end -}}
{{- define "triton-warmup.bundleKeysPath" -}}/etc/triton-warmup/bundle-keys{{- end -}}
{{- define "triton-warmup.trustEnv" -}}
{{- if .Values.trust.allowUnsigned }}
- name: TRITON_WARMUP_ALLOW_UNSIGNED
  value: "true"
{{- else }}
{{- if not .Values.trust.publicKeysSecret }}
{{- fail "trust.publicKeysSecret is empty: name the Secret of trusted public keys (docs/kubernetes.md), or set trust.allowUnsigned=true to accept unsigned bundles and Redis values" }}
{{- end }}
- name: TRITON_WARMUP_TRUSTED_KEYS
  value: {{ include "triton-warmup.trustedKeysPath" . | quote }}
{{- if .Values.trust.bundleKeysSecret }}
- name: TRITON_WARMUP_TRUSTED_BUNDLE_KEYS
  value: {{ include "triton-warmup.bundleKeysPath" . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Non-empty when the pod signs what it publishes: a signing key is named, trust is on
and the remote tier is on (lock.backend=redis, lock.remoteTier). */}}
{{- define "triton-warmup.signs" -}}
{{- if and .Values.trust.signingKeySecret (not .Values.trust.allowUnsigned) (eq .Values.lock.backend "redis") (ne (toString .Values.lock.remoteTier) "false") -}}
true
{{- end -}}
{{- end -}}

{{- define "triton-warmup.signingEnv" -}}
{{- if include "triton-warmup.signs" . }}
- name: TRITON_WARMUP_SIGNING_KEY
  value: {{ printf "%s/signing.key" (include "triton-warmup.signingPath" .) | quote }}
{{- end }}
{{- end -}}

{{/* The mounts of trust and of the Redis CA; "signing": also the signing key. */}}
{{- define "triton-warmup.securityMounts" -}}
{{- $root := .root -}}
{{- if not $root.Values.trust.allowUnsigned }}
- {name: trusted-keys, mountPath: {{ include "triton-warmup.trustedKeysPath" $root }}, readOnly: true}
{{- if $root.Values.trust.bundleKeysSecret }}
- {name: bundle-keys, mountPath: {{ include "triton-warmup.bundleKeysPath" $root }}, readOnly: true}
{{- end }}
{{- end }}
{{- if and .signing (include "triton-warmup.signs" $root) }}
- {name: signing-key, mountPath: {{ include "triton-warmup.signingPath" $root }}, readOnly: true}
{{- end }}
{{- if include "triton-warmup.redisCaVolume" $root }}
- {name: redis-ca, mountPath: {{ include "triton-warmup.redisCaPath" $root }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "triton-warmup.securityVolumes" -}}
{{- if not .Values.trust.allowUnsigned }}
- name: trusted-keys
  secret:
    secretName: {{ .Values.trust.publicKeysSecret | quote }}
{{- if .Values.trust.bundleKeysSecret }}
- name: bundle-keys
  secret:
    secretName: {{ .Values.trust.bundleKeysSecret | quote }}
{{- end }}
{{- end }}
{{- if include "triton-warmup.signs" . }}
- name: signing-key
  secret:
    secretName: {{ .Values.trust.signingKeySecret | quote }}
    defaultMode: 0440           # read by the pod's group (fsGroup) only
    items:
      - {key: signing.key, path: signing.key}
{{- end }}
{{- with include "triton-warmup.redisCaVolume" . }}
- name: redis-ca
  {{- . | nindent 2 }}
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
  value: {{ include "triton-warmup.redisUrl" . | quote }}
- name: TRITON_WARMUP_TRITON_REMOTE_TIMEOUT_S
  value: {{ .Values.lock.tritonCacheTimeoutSeconds | default 0.2 | quote }}
{{- end }}
{{- end -}}

{{/* What torch.compile in the server needs to hit the artifacts the warmup left: set
before the process starts (the CUDA driver reads its cache path when CUDA starts). */}}
{{- define "triton-warmup.inductorEnv" -}}
- name: TORCHINDUCTOR_CACHE_DIR
  value: {{ include "triton-warmup.inductorCachePath" . | quote }}
{{- include "triton-warmup.inductorRest" . }}
{{- end -}}

{{/* The server's: SGLang without its piecewise backend compiles with Inductor's own cache,
which no declared model's harvest keeps: it goes under SGLang's declared folder instead,
kept whole with it (its piecewise backend sets its own dir there anyway). */}}
{{- define "triton-warmup.serverInductorEnv" -}}
{{- $sglang := dict -}}
{{- range (include "triton-warmup.engineFolders" . | fromJsonArray) -}}
{{- if eq .engine "sglang" }}{{ $sglang = . }}{{ end -}}
{{- end -}}
{{- if $sglang -}}
- name: TORCHINDUCTOR_CACHE_DIR
  value: {{ printf "%s/torchinductor" $sglang.path | quote }}
{{- include "triton-warmup.inductorRest" . }}
{{- else -}}
{{- include "triton-warmup.inductorEnv" . }}
{{- end -}}
{{- end -}}

{{- define "triton-warmup.inductorRest" }}
- name: TORCHINDUCTOR_FX_GRAPH_CACHE
  value: "1"
- name: TORCHINDUCTOR_AUTOGRAD_CACHE
  value: "1"
- name: TRITON_WARMUP_STATIC_LAUNCHER
  value: {{ ternary "on" "off" (ne .Values.warmup.staticLauncher false) | quote }}
- name: CUDA_CACHE_PATH
  value: {{ printf "%s/cuda-jit" (include "triton-warmup.inductorCachePath" .) | quote }}
{{- end -}}

{{/* The manifest the pods read (the inline one): manifest.inline, or the engine's
default (vllm, sglang: their folders only; torch: manifests/torch.yaml), with the
engine's folders added to its caches: unless it declares them (by name or path). */}}
{{- define "triton-warmup.manifestText" -}}
{{- $engine := include "triton-warmup.engineCaches" . | fromJsonArray -}}
{{- $inline := .Values.manifest.inline | default "" -}}
{{- if and (not $inline) (eq (include "triton-warmup.engineName" .) "torch") -}}
{{- $inline = .Files.Get "manifests/torch.yaml" -}}
{{- end -}}
{{- if not $inline -}}
{{- toYaml (dict "version" 1 "caches" $engine) -}}
{{- else -}}
{{- $manifest := fromYaml $inline -}}
{{- $own := $manifest.caches | default list -}}
{{- $all := include "triton-warmup.mergeCaches" (list $own $engine) | fromJsonArray -}}
{{- if eq (len $all) (len $own) -}}
{{- $inline -}}
{{- else -}}
{{- toYaml (set $manifest "caches" $all) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (list own engine): own's caches, then each of the engine's that own names neither
by name nor by path. */}}
{{- define "triton-warmup.mergeCaches" -}}
{{- $own := index . 0 -}}
{{- $all := $own -}}
{{- range (index . 1) -}}
{{- $cache := . -}}
{{- $taken := false -}}
{{- range $own -}}
{{- if or (eq .name $cache.name) (eq (toString .path) $cache.path) }}{{ $taken = true }}{{ end -}}
{{- end -}}
{{- if not $taken }}{{ $all = append $all $cache }}{{ end -}}
{{- end -}}
{{- toJson $all -}}
{{- end -}}

{{/* The pods' checksum/manifest: of the inline manifest; of an existing ConfigMap's
manifest.yaml where Helm can read it (install, upgrade), else manifest.checksum. */}}
{{- define "triton-warmup.manifestChecksum" -}}
{{- if .Values.manifest.existingConfigMap -}}
{{- $found := lookup "v1" "ConfigMap" .Release.Namespace .Values.manifest.existingConfigMap | default dict -}}
{{- $text := (get ($found.data | default dict) "manifest.yaml") | default "" -}}
{{- if $text }}{{ sha256sum $text }}{{ else }}{{ .Values.manifest.checksum | default "" }}{{ end -}}
{{- else -}}
{{- include "triton-warmup.manifestText" . | sha256sum -}}
{{- end -}}
{{- end -}}

{{/*
The folders the manifest declares under caches: (an engine's own cache root): the
inline manifest's, or manifest.caches beside an existing ConfigMap (with the engine's
folders). Each is an emptyDir mounted at its path in the init container, the sidecar and
the server, so the warmup restores it where the server reads it and the sidecar harvests
what the server writes.
*/}}
{{- define "triton-warmup.declaredCaches" -}}
{{- if .Values.manifest.existingConfigMap -}}
{{- $engine := include "triton-warmup.engineCaches" . | fromJsonArray -}}
{{- include "triton-warmup.mergeCaches" (list (.Values.manifest.caches | default list) $engine) -}}
{{- else -}}
{{- toJson ((include "triton-warmup.manifestText" . | fromYaml).caches | default list) -}}
{{- end -}}
{{- end -}}

{{- define "triton-warmup.declaredCacheMounts" -}}
{{- range $i, $cache := (include "triton-warmup.declaredCaches" . | fromJsonArray) }}
- {name: declared-cache-{{ $i }}, mountPath: {{ $cache.path | quote }}}
{{- end }}
{{- end -}}

{{- define "triton-warmup.declaredCacheVolumes" -}}
{{- range $i, $cache := (include "triton-warmup.declaredCaches" . | fromJsonArray) }}
- name: declared-cache-{{ $i }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{- define "triton-warmup.serviceAccountName" -}}
{{- $account := .Values.serviceAccount | default dict -}}
{{- if $account.create -}}
{{- $account.name | default (include "triton-warmup.fullname" .) -}}
{{- else -}}
{{- $account.name | default "" -}}
{{- end -}}
{{- end -}}
