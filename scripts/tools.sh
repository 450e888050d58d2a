#!/usr/bin/env bash
# Build the real components pkobatch's tests run against (etcd, kube-apiserver,
# kube-controller-manager, the Pulumi CLI and Python language host, the YAML language host,
# an older Pulumi CLI, the Kubernetes provider, helm, promtool, the Prometheus Operator's
# CRDs, Argo CD's health check for Stacks, kstatus, an OCI registry (distribution), and the
# real node: kubelet, kube-proxy, kube-scheduler, kubectl, pause, containerd, the CNI
# plugins, crictl) from the Go module
# proxy into a cache directory keyed by name and version. Idempotent: a component whose stamp file exists is reused. Versions are pinned in
# pkobatch/dev/versions.env.
#
#   scripts/tools.sh          build etcd kubernetes pulumi yaml kubernetes_provider where missing
#   scripts/tools.sh yaml kubernetes_provider
#                             build only the named components (etcd kubernetes pulumi yaml
#                             kubernetes_provider helm promtool prometheus_operator
#                             source_controller argocd_health kstatus registry node
#                             containerd cni_plugins crictl pulumi_old pulumi_mid); the last
#                             thirteen are built only when named: the tests of deploy/ (the
#                             registry: the chart from OCI), fluxSource, GitOps health, the
#                             real node and the CLI version check need them
#                             (scripts/test.sh asks), the demo not
#   PKOBATCH_TOOLS_DIR=...    cache root (default ~/.cache/pkobatch/tools)
#   KUBEBUILDER_ASSETS=...    use etcd/kube-apiserver/kube-controller-manager from there
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../pkobatch/dev/versions.env
. "$here/pkobatch/dev/versions.env"
TOOLS=${PKOBATCH_TOOLS_DIR:-$HOME/.cache/pkobatch/tools}
mkdir -p "$TOOLS"
# -dwarf=false: the binaries are linked with -w (no DWARF) anyway, but the compiler still
# generates DWARF for every package unless told not to; that work is wasted in a cold build.
export CGO_ENABLED=0 GOFLAGS='-modcacherw -gcflags=all=-dwarf=false' GOTOOLCHAIN=local
export GOPROXY=${GOPROXY:-https://proxy.golang.org,direct}

step=""
trap 'rc=$?; [ $rc -ne 0 ] && echo "tools.sh: FAILED at step: $step (exit $rc); see the output above" >&2' EXIT
say() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
need() { command -v "$1" >/dev/null || { echo "tools.sh: '$1' is required but not on PATH" >&2; exit 1; }; }
need go
need python3

build_etcd() {
  local out="$TOOLS/etcd-$ETCD_VERSION"
  if [ -f "$out/.stamp" ]; then say "etcd $ETCD_VERSION: cached in $out"; return; fi
  if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
    step="link etcd from KUBEBUILDER_ASSETS"; mkdir -p "$out"; ln -sf "$KUBEBUILDER_ASSETS/etcd" "$out/etcd"
    "$out/etcd" --version >/dev/null; touch "$out/.stamp"; say "etcd: using $KUBEBUILDER_ASSETS"; return
  fi
  local w; w=$(mktemp -d); cd "$w"
    step="etcd: resolve modules"; say "etcd $ETCD_VERSION: resolving modules"
    go mod init pkobatch-tools/etcd >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    step="etcd: build"; say "etcd $ETCD_VERSION: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
      -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  cd "$here"; rm -rf "$w"
  step="etcd: verify"; "$out.tmp/etcd" --version | sed -n 1p >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
}

# Make the current directory a module requiring k8s.io/kubernetes@$1: its staging modules,
# required at v0.0.0 with local replaces a consumer ignores, point at their published
# v0.<minor>.<patch>, and its godebug default is kept. Sets KUBE_LDFLAGS to the version
# stamps upstream's build sets (component-base and client-go).
kubernetes_module() {
  local K=$1 S="v0.${1#v1.}" MIN J GOMOD COMMIT GD BD m p
  MIN=${S#v0.}; MIN=${MIN%%.*}
  go mod init "pkobatch-tools/$2" >/dev/null 2>&1
  J=$(go mod download -json "k8s.io/kubernetes@$K")
  go mod edit -require="k8s.io/kubernetes@$K"
  GOMOD=$(printf '%s' "$J" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  COMMIT=$(printf '%s' "$J" | python3 -c 'import json,sys;print(json.load(sys.stdin).get("Origin",{}).get("Hash",""))')
  KUBE_MODULE_DIR=$(printf '%s' "$J" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  GD=$(awk '$1=="godebug" && $2 ~ /^default=/ {print $2}' "$GOMOD")
  if [ -n "$GD" ]; then go mod edit -godebug="$GD"; fi
  for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\/src\// {print $1}' "$GOMOD"); do
    go mod edit -replace="$m=$m@$S"
  done
  KUBE_LDFLAGS="-s -w"; BD=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KUBE_LDFLAGS="$KUBE_LDFLAGS -X $p.gitVersion=$K -X $p.gitMajor=1 -X $p.gitMinor=$MIN -X $p.gitTreeState=clean -X $p.buildDate=$BD"
    if [ -n "$COMMIT" ]; then KUBE_LDFLAGS="$KUBE_LDFLAGS -X $p.gitCommit=$COMMIT"; fi
  done
}

# Build the named commands of k8s.io/kubernetes@$1 into $2 (in a module made by
# kubernetes_module).
compile_kubernetes_commands() {
  local K=$1 out=$2 c; shift 2
  go get -tool $(for c in "$@"; do printf 'k8s.io/kubernetes/cmd/%s@%s ' "$c" "$K"; done)
  mkdir -p "$out"
  for c in "$@"; do
    step="kubernetes: build $c"; say "kubernetes $K: building $c"
    go build -trimpath -buildvcs=false -tags selinux,notest,grpcnotrace -ldflags "$KUBE_LDFLAGS" \
      -o "$out/$c" "k8s.io/kubernetes/cmd/$c"
  done
}

build_kubernetes() {
  local K=$KUBERNETES_VERSION out="$TOOLS/kubernetes-$KUBERNETES_VERSION"
  if [ -f "$out/.stamp" ]; then say "kubernetes $K: cached in $out"; return; fi
  if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/kube-controller-manager" ]; then
    step="link kubernetes from KUBEBUILDER_ASSETS"; mkdir -p "$out"
    ln -sf "$KUBEBUILDER_ASSETS/kube-apiserver" "$out/kube-apiserver"
    ln -sf "$KUBEBUILDER_ASSETS/kube-controller-manager" "$out/kube-controller-manager"
    touch "$out/.stamp"; say "kubernetes: using $KUBEBUILDER_ASSETS"; return
  fi
  local w; w=$(mktemp -d); cd "$w"
    step="kubernetes: resolve modules"; say "kubernetes $K: resolving modules"
    kubernetes_module "$K" kubernetes
    compile_kubernetes_commands "$K" "$out.tmp" kube-apiserver kube-controller-manager
  cd "$here"; rm -rf "$w"
  step="kubernetes: verify"; "$out.tmp/kube-apiserver" --version >&2; "$out.tmp/kube-controller-manager" --version >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
}

build_node() {
  local K=$KUBERNETES_VERSION out="$TOOLS/node-$KUBERNETES_VERSION"
  if [ -f "$out/.stamp" ]; then say "node (kubelet, kube-proxy, kube-scheduler, kubectl, pause) $K: cached in $out"; return; fi
  need gcc
  # The same module as the kubernetes component, so Go's build cache of that build serves.
  local w tag; w=$(mktemp -d); cd "$w"
    step="node: resolve modules"; say "node $K: resolving modules"
    kubernetes_module "$K" node
    # kubectl too: the tests' images call the API server with it, as a pod would.
    compile_kubernetes_commands "$K" "$out.tmp" kubelet kube-proxy kube-scheduler kubectl
    # The pod sandbox's process: upstream's pause.c, built as its Makefile builds it.
    step="node: build pause"; say "node $K: building pause $PAUSE_VERSION"
    tag=$(awk '$1=="TAG" && $2=="?=" {print $3}' "$KUBE_MODULE_DIR/build/pause/Makefile")
    [ "$tag" = "$PAUSE_VERSION" ] || { echo "tools.sh: k8s.io/kubernetes@$K builds pause $tag, versions.env pins PAUSE_VERSION=$PAUSE_VERSION: update the pin" >&2; exit 1; }
    gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-pkobatch" \
      -o "$out.tmp/pause" "$KUBE_MODULE_DIR/build/pause/linux/pause.c"
  cd "$here"; rm -rf "$w"
  step="node: verify"
  for c in kubelet kube-proxy kube-scheduler; do "$out.tmp/$c" --version >&2; done
  "$out.tmp/kubectl" version --client >&2
  "$out.tmp/pause" -v >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "node $K: built in $out"
}

build_containerd() {
  local V=$CONTAINERD_VERSION out="$TOOLS/containerd-$CONTAINERD_VERSION"
  if [ -f "$out/.stamp" ]; then say "containerd $V: cached in $out"; return; fi
  local w c LDF; w=$(mktemp -d); cd "$w"
    step="containerd: resolve modules"; say "containerd $V: resolving modules"
    go mod init pkobatch-tools/containerd >/dev/null 2>&1
    go get -tool "github.com/containerd/containerd/v2/cmd/containerd@$V" \
      "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$V" \
      "github.com/containerd/containerd/v2/cmd/ctr@$V"
    LDF="-s -w -X github.com/containerd/containerd/v2/version.Version=$V -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
    mkdir -p "$out.tmp"
    # As upstream's static release (Makefile: STATIC=1); the shim without the gRPC server.
    for c in containerd ctr containerd-shim-runc-v2; do
      step="containerd: build $c"; say "containerd $V: building $c"
      local tags="urfave_cli_no_docs osusergo netgo static_build"
      if [ "$c" = containerd-shim-runc-v2 ]; then tags="$tags no_grpc"; fi
      go build -trimpath -buildvcs=false -tags "$tags" -ldflags "$LDF" \
        -o "$out.tmp/$c" "github.com/containerd/containerd/v2/cmd/$c"
    done
  cd "$here"; rm -rf "$w"
  step="containerd: verify"; "$out.tmp/containerd" --version >&2; "$out.tmp/ctr" --version >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "containerd $V: built in $out"
}

# The plugins a pod network of one bridge needs (pkobatch/dev/node.py writes their config).
CNI_PLUGINS="main/bridge ipam/host-local main/loopback meta/portmap"

build_cni_plugins() {
  local V=$CNI_PLUGINS_VERSION out="$TOOLS/cni_plugins-$CNI_PLUGINS_VERSION" p
  if [ -f "$out/.stamp" ]; then say "CNI plugins $V: cached in $out"; return; fi
  local w; w=$(mktemp -d); cd "$w"
    step="cni_plugins: resolve modules"; say "CNI plugins $V: resolving modules"
    go mod init pkobatch-tools/cni-plugins >/dev/null 2>&1
    go get -tool $(for p in $CNI_PLUGINS; do printf 'github.com/containernetworking/plugins/plugins/%s@%s ' "$p" "$V"; done)
    mkdir -p "$out.tmp"
    for p in $CNI_PLUGINS; do
      step="cni_plugins: build ${p##*/}"; say "CNI plugins $V: building ${p##*/}"
      go build -trimpath -buildvcs=false \
        -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$V" \
        -o "$out.tmp/${p##*/}" "github.com/containernetworking/plugins/plugins/$p"
    done
  cd "$here"; rm -rf "$w"
  step="cni_plugins: verify"
  for p in $CNI_PLUGINS; do CNI_COMMAND=VERSION "$out.tmp/${p##*/}" </dev/null >/dev/null; done
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "CNI plugins $V: built in $out"
}

build_crictl() {
  local V=$CRI_TOOLS_VERSION out="$TOOLS/crictl-$CRI_TOOLS_VERSION"
  if [ -f "$out/.stamp" ]; then say "crictl $V: cached in $out"; return; fi
  local w; w=$(mktemp -d); cd "$w"
    step="crictl: resolve modules"; say "crictl $V: resolving modules"
    go mod init pkobatch-tools/crictl >/dev/null 2>&1
    go get -tool "sigs.k8s.io/cri-tools/cmd/crictl@$V"
    step="crictl: build"; say "crictl $V: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$V" \
      -o "$out.tmp/crictl" sigs.k8s.io/cri-tools/cmd/crictl
  cd "$here"; rm -rf "$w"
  step="crictl: verify"; "$out.tmp/crictl" --version >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "crictl $V: built in $out"
}

# Build the Pulumi CLI v$1 into $TOOLS/$2-$1; with $3=python also its Python pieces (the
# language host and the dynamic-provider plugin), which only the main CLI needs.
compile_pulumi_cli() {
  local V=$1 name=$2 python=${3:-} out="$TOOLS/$2-$1"
  if [ -f "$out/.stamp" ]; then say "$name $V: cached in $out"; return; fi
  local existing; existing=$(command -v pulumi || true)
  if [ -n "$python" ] && [ -n "$existing" ] && [ "$(pulumi version 2>/dev/null)" = "v$V" ] \
     && [ -f "$(dirname "$existing")/pulumi-resource-pulumi-python" ]; then
    step="link existing pulumi"; mkdir -p "$out"
    for f in pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-pulumi-python; do
      if [ -e "$(dirname "$existing")/$f" ]; then ln -sf "$(dirname "$existing")/$f" "$out/$f"; fi
    done
    touch "$out/.stamp"; say "pulumi: using $existing"; return
  fi
  local w; w=$(mktemp -d); cd "$w"
  step="$name: resolve modules"; say "$name $V: resolving modules"
  go mod init "pkobatch-tools/$name" >/dev/null 2>&1
  go mod edit -replace=github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e
  go get -tool "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@v$V"
  go get "github.com/pulumi/pulumi/sdk/v3@v$V"
  local m got LDF
  for m in github.com/pulumi/pulumi/pkg/v3 github.com/pulumi/pulumi/sdk/v3; do
    got=$(go list -m -f '{{.Version}}' "$m")
    [ "$got" = "v$V" ] || { echo "tools.sh: $m resolved to $got, expected v$V" >&2; exit 1; }
  done
  LDF="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$V"
  mkdir -p "$out.tmp"
  step="$name: build pulumi"; say "$name $V: building pulumi (the long one)"
  go build -trimpath -buildvcs=false -tags osusergo,grpcnotrace -ldflags "$LDF" -o "$out.tmp/pulumi" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  if [ -n "$python" ]; then install_pulumi_python "$LDF" "$out.tmp"; fi
  cd "$here"; rm -rf "$w"
  step="$name: verify"
  got=$("$out.tmp/pulumi" version)
  [ "$got" = "v$V" ] || { echo "tools.sh: built pulumi reports '$got', expected v$V" >&2; exit 1; }
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
}

# The main CLI's Python pieces into $2, from the module of the current directory (ldflags $1).
install_pulumi_python() {
  local LDF=$1 SDK
  SDK=$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
  install -m 0755 "$SDK/python/cmd/pulumi-language-python-exec" "$2/"
  install -m 0755 "$SDK/python/dist/pulumi-resource-pulumi-python" "$2/"
  # The Python language host is a separate module with no tags; the Go module proxy this
  # machine reaches does not serve it. pkobatch does not need it: the runner hands the
  # program to the CLI through the Automation API's own language server (--client), and
  # dynamic providers run through pulumi-resource-pulumi-python. Build it when available.
  step="pulumi: language host"
  if go get -tool "github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3@$PULUMI_LANGUAGE_HOST_COMMIT" 2>/dev/null; then
    go build -trimpath -buildvcs=false -tags osusergo,grpcnotrace -ldflags "$LDF" -o "$2/pulumi-language-python" \
      github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3
  else
    say "pulumi-language-python: not served by the Go module proxy; skipped (not needed, see docs/runner.md)"
  fi
}

build_pulumi() { compile_pulumi_cli "$PULUMI_VERSION" pulumi python; }

# An older CLI, first on the PATH of the e2e tests' runs that check PulumiVersionTooLow.
build_pulumi_old() { compile_pulumi_cli "$PULUMI_OLD_VERSION" pulumi_old; }

# A CLI between the structured-config minimum and PULUMI_VERSION, first on the PATH of the
# test runs that set config on a CLI older than today's.
build_pulumi_mid() { compile_pulumi_cli "$PULUMI_MID_VERSION" pulumi_mid; }

build_yaml() {
  local V=$PULUMI_YAML_VERSION out="$TOOLS/yaml-$PULUMI_YAML_VERSION"
  if [ -f "$out/.stamp" ]; then say "pulumi-language-yaml $V: cached in $out"; return; fi
  # A module of its own: pulumi-yaml requires its own pulumi pkg/sdk versions, which must not
  # move the CLI's pin.
  local w; w=$(mktemp -d); cd "$w"
    step="yaml: resolve modules"; say "pulumi-language-yaml $V: resolving modules"
    go mod init pkobatch-tools/yaml >/dev/null 2>&1
    go get -tool "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml@$V"
    step="yaml: build"; say "pulumi-language-yaml $V: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false -tags osusergo,grpcnotrace \
      -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=$V" \
      -o "$out.tmp/pulumi-language-yaml" github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
  cd "$here"; rm -rf "$w"
  step="yaml: verify"; [ -x "$out.tmp/pulumi-language-yaml" ]
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "pulumi-language-yaml $V: built in $out"
}

build_kubernetes_provider() {
  local M=$KUBERNETES_PROVIDER_MODULE_VERSION V=$KUBERNETES_PROVIDER_VERSION
  local out="$TOOLS/kubernetes_provider-$KUBERNETES_PROVIDER_MODULE_VERSION"
  if [ -f "$out/.stamp" ]; then say "pulumi-resource-kubernetes $V: cached in $out"; return; fi
  local w src; w=$(mktemp -d); cd "$w"
    step="kubernetes_provider: download"; say "pulumi-resource-kubernetes $V: downloading module $M"
    src=$(go mod download -json "github.com/pulumi/pulumi-kubernetes/provider/v4@$M" \
      | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
    # The module replaces its SDK with ../sdk (absent from the module zip) and its command
    # embeds schema files that generate.go writes: build from a writable copy.
    cp -r "$src" "$w/provider"; chmod -R u+w "$w/provider"; cd "$w/provider"
    go mod edit -dropreplace=github.com/pulumi/pulumi-kubernetes/sdk/v4 \
      -require="github.com/pulumi/pulumi-kubernetes/sdk/v4@$KUBERNETES_PROVIDER_SDK_VERSION"
    go mod download github.com/pulumi/pulumi-kubernetes/sdk/v4
    go mod tidy
    step="kubernetes_provider: generate schema"; say "pulumi-resource-kubernetes $V: writing the embedded schema"
    (cd cmd/pulumi-resource-kubernetes && VERSION=$V go run generate.go)
    step="kubernetes_provider: build"; say "pulumi-resource-kubernetes $V: building (the largest component after pulumi)"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$V" \
      -o "$out.tmp/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes
  cd "$here"; rm -rf "$w"
  step="kubernetes_provider: verify"; [ -x "$out.tmp/pulumi-resource-kubernetes" ]
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "pulumi-resource-kubernetes $V: built in $out"
}

build_helm() {
  local V=$HELM_VERSION out="$TOOLS/helm-$HELM_VERSION"
  if [ -f "$out/.stamp" ]; then say "helm $V: cached in $out"; return; fi
  local w KV LDF; w=$(mktemp -d); cd "$w"
    step="helm: resolve modules"; say "helm $V: resolving modules"
    go mod init pkobatch-tools/helm >/dev/null 2>&1
    go get -tool "helm.sh/helm/v3/cmd/helm@$V"
    # As helm's Makefile: the Kubernetes version `helm template` and `helm lint` assume
    # follows the client-go helm was built with (v0.37.x -> 1.37).
    KV=$(go list -m -f '{{.Version}}' k8s.io/client-go); KV=${KV#v0.}; KV=${KV%%.*}
    LDF="-s -w -X helm.sh/helm/v3/internal/version.version=$V -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      LDF="$LDF -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$KV"
    done
    step="helm: build"; say "helm $V: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false -ldflags "$LDF" -o "$out.tmp/helm" helm.sh/helm/v3/cmd/helm
  cd "$here"; rm -rf "$w"
  step="helm: verify"
  got=$("$out.tmp/helm" version --template '{{.Version}}')
  [ "$got" = "$V" ] || { echo "tools.sh: built helm reports '$got', expected $V" >&2; exit 1; }
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "helm $V: built in $out"
}

build_promtool() {
  local M=$PROMETHEUS_MODULE_VERSION out="$TOOLS/promtool-$PROMETHEUS_MODULE_VERSION"
  if [ -f "$out/.stamp" ]; then say "promtool $M: cached in $out"; return; fi
  # Prometheus 3.x releases are module versions v0.3XX.Y (v0.316.0 is Prometheus 3.16.0).
  local w V LDF; V=${M#v0.}; V="${V:0:1}.$((10#${V:1:2})).${V#*.}"; w=$(mktemp -d); cd "$w"
    step="promtool: resolve modules"; say "promtool $M: resolving modules"
    go mod init pkobatch-tools/promtool >/dev/null 2>&1
    go get -tool "github.com/prometheus/prometheus/cmd/promtool@$M"
    LDF="-s -w -X github.com/prometheus/common/version.Version=$V -X github.com/prometheus/common/version.Branch=HEAD"
    step="promtool: build"; say "promtool $M: building"
    mkdir -p "$out.tmp"
    # remove_all_sd leaves out the service-discovery plugins (cloud SDKs): they matter only
    # to `promtool check config` of SD sections, never to rules, and halve the build.
    go build -trimpath -buildvcs=false -tags netgo,remove_all_sd -ldflags "$LDF" \
      -o "$out.tmp/promtool" github.com/prometheus/prometheus/cmd/promtool
  cd "$here"; rm -rf "$w"
  step="promtool: verify"; "$out.tmp/promtool" --version 2>&1 | sed -n 1p >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "promtool $M: built in $out"
}

build_prometheus_operator() {
  local V=$PROMETHEUS_OPERATOR_VERSION out="$TOOLS/prometheus_operator-$PROMETHEUS_OPERATOR_VERSION"
  if [ -f "$out/.stamp" ]; then say "prometheus-operator CRDs $V: cached in $out"; return; fi
  # Nothing to build: the module ships its CRDs (example/prometheus-operator-crd).
  local src
  step="prometheus_operator: download"; say "prometheus-operator CRDs $V: downloading module"
  src=$(cd "$TOOLS" && GO111MODULE=on go mod download -json "github.com/prometheus-operator/prometheus-operator@$V" \
    | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/crds"
  install -m 0644 "$src"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$out.tmp/crds/"
  step="prometheus_operator: verify"
  [ -f "$out.tmp/crds/monitoring.coreos.com_servicemonitors.yaml" ] && [ -f "$out.tmp/crds/monitoring.coreos.com_prometheusrules.yaml" ]
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "prometheus-operator CRDs $V: in $out/crds"
}

build_source_controller() {
  local V=$SOURCE_CONTROLLER_VERSION out="$TOOLS/source_controller-$SOURCE_CONTROLLER_VERSION"
  if [ -f "$out/.stamp" ]; then say "source-controller $V: cached in $out"; return; fi
  local w src; w=$(mktemp -d); cd "$w"
    step="source_controller: download"; say "source-controller $V: downloading module"
    src=$(go mod download -json "github.com/fluxcd/source-controller@$V" \
      | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
    cp -r "$src" "$w/source-controller"; chmod -R u+w "$w/source-controller"; cd "$w/source-controller"
    # The nested ./api replace points into the module; use the published api module instead.
    go mod edit -dropreplace=github.com/fluxcd/source-controller/api \
      -replace="github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@$SOURCE_CONTROLLER_ARTIFACT_PKG_VERSION"
    step="source_controller: build"; say "source-controller $V: building (about 4 minutes on 2 cores)"
    mkdir -p "$out.tmp/crd"
    # -mod=mod resolves only what the binary imports (not `go mod tidy`: some of its test
    # dependencies are not served by the proxy).
    go build -mod=mod -trimpath -buildvcs=false -ldflags "-s -w" -o "$out.tmp/source-controller" .
    # Its CRDs (GitRepository, OCIRepository, Bucket, HelmRepository, HelmChart, ...).
    cp config/crd/bases/*.yaml "$out.tmp/crd/"
  cd "$here"; rm -rf "$w"
  step="source_controller: verify"; "$out.tmp/source-controller" --help >/dev/null 2>&1
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "source-controller $V: built in $out"
}

build_argocd_health() {
  local V=$ARGOCD_VERSION out="$TOOLS/argocd_health-$ARGOCD_VERSION"
  if [ -f "$out/.stamp" ]; then say "Argo CD $V health checks: cached in $out"; return; fi
  # Only files are needed (resource_customizations/pulumi.com/Stack: health.lua and Argo CD's
  # own test cases), so nothing is built. `go mod download` fetches and verifies the module
  # zip even when it reports that the module needs a newer Go than ours; take the files
  # from that verified zip.
  local w zip; w=$(mktemp -d); cd "$w"
    step="argocd_health: download"; say "Argo CD $V: downloading module github.com/argoproj/argo-cd/v3"
    zip=$( (go mod download -json "github.com/argoproj/argo-cd/v3@$V" || true) | python3 -c '
import json, os, sys
d = json.load(sys.stdin)
if not os.path.isfile(d.get("Zip", "")) or not d.get("Sum"):
    sys.exit("module not downloaded: " + d.get("Error", "no zip"))
print(d["Zip"])')
    step="argocd_health: extract"; mkdir -p "$out.tmp"
    python3 - "$zip" "github.com/argoproj/argo-cd/v3@$V/resource_customizations/pulumi.com/Stack/" "$out.tmp" <<'PY'
import pathlib, sys, zipfile
archive, prefix, dest = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
with zipfile.ZipFile(archive) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    for name in names:
        target = dest / "pulumi.com" / "Stack" / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(name))
if not (dest / "pulumi.com" / "Stack" / "health.lua").is_file():
    sys.exit(f"no health.lua under {prefix} in {archive}")
PY
  cd "$here"; rm -rf "$w"
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "Argo CD $V health checks: in $out/pulumi.com/Stack"
}

build_kstatus() {
  local V=$CLI_UTILS_VERSION out="$TOOLS/kstatus-$CLI_UTILS_VERSION"
  if [ -f "$out/.stamp" ]; then say "kstatus (cli-utils $V): cached in $out"; return; fi
  # A ten-line program around sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, the library
  # Flux's healthChecks use: the source is scripts/kstatus/main.go.
  local w; w=$(mktemp -d); cd "$w"
    step="kstatus: resolve modules"; say "kstatus: resolving sigs.k8s.io/cli-utils@$V"
    go mod init pkobatch-tools/kstatus >/dev/null 2>&1
    cp "$here/scripts/kstatus/main.go" .
    go get "sigs.k8s.io/cli-utils@$V"
    go mod tidy
    step="kstatus: build"; say "kstatus: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out.tmp/kstatus" .
  cd "$here"; rm -rf "$w"
  step="kstatus: verify"; echo '[]' | "$out.tmp/kstatus" >/dev/null
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "kstatus (cli-utils $V): built in $out"
}

build_registry() {
  local V=$DISTRIBUTION_VERSION out="$TOOLS/registry-$DISTRIBUTION_VERSION"
  if [ -f "$out/.stamp" ]; then say "registry (distribution $V): cached in $out"; return; fi
  local w; w=$(mktemp -d); cd "$w"
    step="registry: resolve modules"; say "registry: resolving github.com/distribution/distribution/v3@$V"
    go mod init pkobatch-tools/registry >/dev/null 2>&1
    go get -tool "github.com/distribution/distribution/v3/cmd/registry@$V"
    step="registry: build"; say "registry $V: building"
    mkdir -p "$out.tmp"
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$V" \
      -o "$out.tmp/registry" github.com/distribution/distribution/v3/cmd/registry
  cd "$here"; rm -rf "$w"
  step="registry: verify"; "$out.tmp/registry" --version >&2
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.stamp"
  say "registry (distribution $V): built in $out"
}

want=${*:-etcd kubernetes pulumi yaml kubernetes_provider}
start=$(date +%s)
for t in $want; do
  declare -F "build_$t" >/dev/null || { echo "tools.sh: unknown component '$t' (etcd kubernetes pulumi yaml kubernetes_provider helm promtool prometheus_operator source_controller argocd_health kstatus registry node containerd cni_plugins crictl pulumi_old pulumi_mid)" >&2; exit 2; }
  "build_$t"
done
step=""
say "done in $(( $(date +%s) - start ))s; tools in $TOOLS ($(du -sh "$TOOLS" | cut -f1))"
