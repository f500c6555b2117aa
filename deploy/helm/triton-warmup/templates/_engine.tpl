{{/*
The engine profile (engine.name: vllm, sglang or torch): the server's command, port and
probes, the cache folders the engine really writes, and what enters its cache key, held
equal in the server, the warmup and the sidecar of every pod.
*/}}

{{- define "triton-warmup.engineName" -}}
{{- (.Values.engine | default dict).name | default "torch" -}}
{{- end -}}

{{/* Paths every container and every pod agree on: an engine's cache key holds absolute
paths (vLLM's traced sources, and paths under HOME before vLLM PR 47573). */}}
{{- define "triton-warmup.engineCacheRoot" -}}/var/cache/engine{{- end -}}
{{- define "triton-warmup.homePath" -}}/home/serving{{- end -}}

{{- define "triton-warmup.serverPort" -}}
{{- $ports := dict "vllm" 8000 "sglang" 30000 "torch" 8000 -}}
{{- .Values.server.port | default (get $ports (include "triton-warmup.engineName" .)) -}}
{{- end -}}

{{/* The folders the engine writes, as JSON: name, path, the engine kind the manifest
names (registry's engine key), the variables that point the engine there (set alike in
the three containers), and the variable patterns that enter its key. vLLM and SGLang set
Inductor's and Triton's cache dirs themselves, under these roots: the chart's
TORCHINDUCTOR_CACHE_DIR never reaches their compiled graphs. */}}
{{- define "triton-warmup.engineFolders" -}}
{{- $engine := .Values.engine | default dict -}}
{{- $name := include "triton-warmup.engineName" . -}}
{{- $root := include "triton-warmup.engineCacheRoot" . -}}
{{- $folders := list -}}
{{- if eq $name "vllm" -}}
{{- $folders = append $folders (dict "name" "vllm" "engine" "vllm" "env" (list "VLLM_CACHE_ROOT") "key_env" (list "VLLM_*")) -}}
{{- else if eq $name "sglang" -}}
{{- $folders = append $folders (dict "name" "sglang" "engine" "sglang" "env" (list "SGLANG_CACHE_DIR") "key_env" (list "SGLANG_*")) -}}
{{- end -}}
{{- if and (ne $name "torch") (ne (toString $engine.deepgemm) "false") -}}
{{- /* SGLang points DeepGEMM at SGLANG_DG_CACHE_DIR itself, overriding DG_JIT_CACHE_DIR */ -}}
{{- $vars := ternary (list "DG_JIT_CACHE_DIR" "SGLANG_DG_CACHE_DIR") (list "DG_JIT_CACHE_DIR") (eq $name "sglang") -}}
{{- $folders = append $folders (dict "name" "deepgemm" "engine" "deepgemm" "env" $vars "key_env" (list "DG_*")) -}}
{{- end -}}
{{- if and (ne $name "torch") (ne (toString $engine.flashinfer) "false") -}}
{{- $folders = append $folders (dict "name" "flashinfer" "engine" "flashinfer" "env" (list "FLASHINFER_WORKSPACE_BASE") "key_env" (list "FLASHINFER_*")) -}}
{{- end -}}
{{- $out := list -}}
{{- range $folders -}}
{{- $out = append $out (set . "path" (printf "%s/%s" $root .name)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The engine's folders as the manifest's caches: entries; the key says what their
files depend on (the model, the server's image, the tensor-parallel size). */}}
{{- define "triton-warmup.engineCaches" -}}
{{- $model := (.Values.engine | default dict).model | default "" -}}
{{- $key := printf "%s %s:%s tp%d" $model .Values.server.image.repository .Values.server.image.tag (int .Values.gpus) | trunc 256 -}}
{{- $caches := list -}}
{{- range (include "triton-warmup.engineFolders" . | fromJsonArray) -}}
{{- $cache := dict "name" .name "path" .path "key" $key "engine" .engine "key_env" .key_env -}}
{{- if hasPrefix "/" $model -}}
{{- $_ := set $cache "key_paths" (list $model) -}}
{{- end -}}
{{- $caches = append $caches $cache -}}
{{- end -}}
{{- toJson $caches -}}
{{- end -}}

{{/* The environment that enters the engine's cache key or points it at its folders:
rendered identically into the server, the warmup and the sidecar, so that what the
warmup and the sidecar record for a folder is what the server runs with. */}}
{{- define "triton-warmup.engineEnv" -}}
{{- $folders := include "triton-warmup.engineFolders" . | fromJsonArray -}}
{{- $set := list "HOME" -}}
{{- $prefixes := list -}}
- name: HOME
  value: {{ include "triton-warmup.homePath" . | quote }}
{{- range $folders }}
{{- $path := .path }}
{{- range .env }}
{{- $set = append $set . }}
- name: {{ . }}
  value: {{ $path | quote }}
{{- end }}
{{- range .key_env }}
{{- $prefixes = append $prefixes (trimSuffix "*" .) }}
{{- end }}
{{- end }}
{{- range (.Values.server.env | default list) }}
{{- if has .name $set }}
{{- fail (printf "server.env sets %s, which engine=%s sets to the folder it mounts and declares: remove it from server.env" .name (include "triton-warmup.engineName" $)) }}
{{- end }}
{{- $entry := . }}
{{- range $prefixes }}
{{- if hasPrefix . $entry.name }}
- {{ toJson $entry }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* server.env without the engine's own variables (rendered by engineEnv). */}}
{{- define "triton-warmup.serverOwnEnv" -}}
{{- $prefixes := list -}}
{{- range (include "triton-warmup.engineFolders" . | fromJsonArray) }}
{{- range .key_env }}
{{- $prefixes = append $prefixes (trimSuffix "*" .) }}
{{- end }}
{{- end }}
{{- range (.Values.server.env | default list) }}
{{- $entry := . }}
{{- $engines := false }}
{{- range $prefixes }}
{{- if hasPrefix . $entry.name }}{{ $engines = true }}{{ end }}
{{- end }}
{{- if not $engines }}
- {{ toJson $entry }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The server's command and arguments: the engine's, serving engine.model on the
server's port over the pod's GPUs, then server.args; or server.command and server.args. */}}
{{- define "triton-warmup.serverCommand" -}}
{{- $name := include "triton-warmup.engineName" . -}}
{{- $model := (.Values.engine | default dict).model | default "" -}}
{{- $port := include "triton-warmup.serverPort" . -}}
{{- $gpus := int .Values.gpus -}}
{{- $command := .Values.server.command | default list -}}
{{- $args := list -}}
{{- if and (not $command) (eq $name "vllm") -}}
{{- $command = list "vllm" "serve" -}}
{{- $args = list $model "--port" $port -}}
{{- if gt $gpus 0 }}{{ $args = concat $args (list "--tensor-parallel-size" (toString $gpus)) }}{{ end -}}
{{- else if and (not $command) (eq $name "sglang") -}}
{{- $command = list "python3" "-m" "sglang.launch_server" -}}
{{- $args = list "--model-path" $model "--host" "0.0.0.0" "--port" $port -}}
{{- if gt $gpus 0 }}{{ $args = concat $args (list "--tp-size" (toString $gpus)) }}{{ end -}}
{{- end -}}
{{- toJson (dict "command" $command "args" (concat $args (.Values.server.args | default list))) -}}
{{- end -}}

{{/* A probe of the server: the default (httpGet healthPath on the port named http) with
the value merged in; a value with its own handler replaces the default's. Empty when the
value is null (turned off). */}}
{{- define "triton-warmup.serverProbe" -}}
{{- $server := .root.Values.server -}}
{{- if hasKey $server .key -}}
{{- $given := get $server .key | default dict -}}
{{- $probe := dict "httpGet" (dict "path" ($server.healthPath | default "/health") "port" "http") -}}
{{- range list "exec" "grpc" "tcpSocket" "httpGet" -}}
{{- if hasKey $given . }}{{ $probe = dict }}{{ end -}}
{{- end -}}
{{- toYaml (mergeOverwrite (merge $probe .defaults) (deepCopy $given)) -}}
{{- end -}}
{{- end -}}

{{/* One message naming every value the pod cannot run without. */}}
{{- define "triton-warmup.checkRunnable" -}}
{{- $name := include "triton-warmup.engineName" . -}}
{{- $missing := list -}}
{{- if and (ne $name "torch") (not (.Values.engine | default dict).model) -}}
{{- $missing = append $missing (printf "engine.model (the model every pod serves: a path on a mounted volume or a hub id)") -}}
{{- end -}}
{{- if not .Values.server.image.repository -}}
{{- $missing = append $missing (printf "server.image.repository (the %s image with triton-warmup installed: deploy/engines/%s.Dockerfile)" $name $name) -}}
{{- end -}}
{{- if or (not .Values.server.image.tag) (eq .Values.server.image.tag "latest") -}}
{{- $missing = append $missing "server.image.tag (a pinned tag, never latest: every pod and the warmup run the same code)" -}}
{{- end -}}
{{- if and (eq $name "torch") (not .Values.server.command) -}}
{{- $missing = append $missing "server.command (your server's command, e.g. [python3, -m, my_server])" -}}
{{- end -}}
{{- range $value, $image := dict "warmup.image.tag" (.Values.warmup.image | default dict) "sidecar.image.tag" .Values.sidecar.image -}}
{{- if eq ($image.tag | default "") "latest" -}}
{{- $missing = append $missing (printf "%s (a pinned tag, never latest)" $value) -}}
{{- end -}}
{{- end -}}
{{- if not (hasKey .Values.server "readinessProbe") -}}
{{- $missing = append $missing "server.readinessProbe ({} for the default: without it the pod is Ready before its server)" -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "engine=%s cannot run as set: set %s" $name (join "; " $missing)) -}}
{{- end -}}
{{- end -}}

{{/* What an operator adds must not collide with what the chart renders: a duplicate key,
port or volume passes the schema and fails only at install (or breaks the selector). */}}
{{- define "triton-warmup.checkExtensions" -}}
{{- $own := include "triton-warmup.labels" . | fromYaml -}}
{{- $_ := set $own "app.kubernetes.io/component" "inference-server" -}}
{{- range $key, $_ := (.Values.podLabels | default dict) -}}
{{- if hasKey $own $key -}}
{{- fail (printf "podLabels: %s is a label the chart sets (its selector and component); use another key" $key) -}}
{{- end -}}
{{- end -}}
{{- if hasKey (.Values.podAnnotations | default dict) "checksum/manifest" -}}
{{- fail "podAnnotations: checksum/manifest is the chart's own; set manifest.checksum to give it for an existing ConfigMap" -}}
{{- end -}}
{{- $port := include "triton-warmup.serverPort" . | int -}}
{{- range (.Values.server.ports | default list) -}}
{{- if or (eq (toString .name) "http") (eq (int .containerPort) $port) -}}
{{- fail (printf "server.ports: the chart already exposes the server's port %d as http; list only other ports (server.port sets that one)" $port) -}}
{{- end -}}
{{- end -}}
{{- $reserved := list "cache-volume" "triton-cache" "inductor-cache" "warmup-work" "family-folders" "serving-metrics" "tmp" "server-tmp" "home" "dshm" "manifest" "bundles" "trusted-keys" "bundle-keys" "signing-key" "redis-ca" -}}
{{- range (.Values.extraVolumes | default list) -}}
{{- if or (has .name $reserved) (hasPrefix "declared-cache-" (toString .name)) -}}
{{- fail (printf "extraVolumes: %s is a volume the chart mounts; name yours otherwise" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
