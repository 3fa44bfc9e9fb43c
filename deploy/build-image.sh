#!/usr/bin/env bash
# build-image.sh: the oxvs image without docker and without a registry.
#
#   deploy/build-image.sh [--bin-dir DIR] [--ref REF] [--out FILE] [--format oci|docker]
#
# Builds a rootfs from files of THIS host (Debian 12): the four oxvs
# binaries from --bin-dir (default target/release; build them with
#   cargo build --release -p oxvs-switch -p oxvs-agent -p oxvsctl -p oxvs-cni),
# the shared libraries `ldd` lists for them, busybox-static as /bin/sh and
# the small tools (cp, mv, printf, ls, wc, kill, grep...), the real
# `iptables` (xtables-nft-multi with its extensions in
# /usr/lib/x86_64-linux-gnu/xtables) the agent runs, and the real `ip`
# (iproute2) and `ethtool` to inspect the node from the container (no
# daemon runs them: interfaces are configured over netlink), each with its
# libraries. Then packs it with umoci and writes an archive with
# skopeo (default: an OCI archive, --format docker: a docker-archive), the
# image named REF (default localhost/oxvs:0.1.0, the name deploy/oxvs.yaml
# uses). Load it on a node with
#
#   ctr -n k8s.io images import target/oxvs-image.tar
#
# and set `imagePullPolicy: IfNotPresent` (the manifest's) so the kubelet
# never pulls. With a registry, deploy/Dockerfile is the normal way.
#
# Needs: root or rootless umoci, umoci, skopeo, busybox-static (apt-get
# install umoci skopeo busybox-static iproute2 ethtool iptables).
# Idempotent: a temporary work dir, the archive written to a temporary name
# and renamed. Prints each step; fails with the step that failed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
bin_dir="$root/target/release"
ref="localhost/oxvs:0.1.0"
out="$root/target/oxvs-image.tar"
format=oci

log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[build-image] ERROR: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case $1 in
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift ;;
    --ref) ref=${2:?--ref needs an image reference}; shift ;;
    --out) out=${2:?--out needs a file}; shift ;;
    --format) format=${2:?--format needs oci or docker}; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
[[ $format == oci || $format == docker ]] || die "--format must be oci or docker, not '$format'"
[[ $ref == */*:* ]] || die "--ref must be a full reference like localhost/oxvs:0.1.0, not '$ref'"

bins=(oxvs-switchd oxvs-agent oxvsctl oxvs-cni)
for b in "${bins[@]}"; do
    [[ -x $bin_dir/$b ]] || die "$bin_dir/$b missing: cargo build --release -p oxvs-switch -p oxvs-agent -p oxvsctl -p oxvs-cni (or --bin-dir)"
done
for t in umoci skopeo ldd; do
    command -v "$t" >/dev/null || die "$t not installed (apt-get install umoci skopeo)"
done
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox missing (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then die "$busybox is dynamically linked: install busybox-static"; fi
host_tool() { # name -> absolute path of the host's binary
    local p
    p=$(command -v "$1" 2>/dev/null) || die "$1 not installed on this host (apt-get install $2)"
    readlink -f "$p"
}
ip_bin=$(host_tool ip iproute2)
ethtool_bin=$(host_tool ethtool ethtool)
xt_bin=/usr/sbin/xtables-nft-multi
[[ -x $xt_bin ]] || die "$xt_bin missing (apt-get install iptables)"
xt_ext=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)/xtables
[[ -d $xt_ext ]] || xt_ext=/usr/lib/x86_64-linux-gnu/xtables
[[ -d $xt_ext ]] || die "iptables extensions not found in $xt_ext"

work=$(mktemp -d "${TMPDIR:-/tmp}/oxvs-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
layout="$work/oci" bundle="$work/bundle"
t0=$SECONDS

log "1/5 umoci: empty image"
umoci init --layout "$layout" >/dev/null
umoci new --image "$layout:oxvs" >/dev/null
umoci unpack --rootless --image "$layout:oxvs" "$bundle" >/dev/null 2>&1 ||
    umoci unpack --image "$layout:oxvs" "$bundle" >/dev/null
r="$bundle/rootfs"

log "2/5 rootfs: merged-/usr layout, busybox, oxvs binaries from $bin_dir"
mkdir -p "$r"/usr/{bin,sbin,lib,lib64,local/bin} "$r"/{etc,proc,sys,dev,tmp,run,var/lib,root,host}
ln -s usr/bin "$r/bin"; ln -s usr/sbin "$r/sbin"; ln -s usr/lib "$r/lib"; ln -s usr/lib64 "$r/lib64"
chmod 1777 "$r/tmp"
cp "$busybox" "$r/usr/bin/busybox"
# the real tools (below) keep their names; busybox provides the rest
for a in $("$busybox" --list); do
    case $a in busybox | ip | ethtool | iptables* | ip6tables* | nft) continue ;; esac
    [[ -e $r/usr/bin/$a ]] || ln -s busybox "$r/usr/bin/$a"
done
for b in "${bins[@]}"; do install -m 0755 "$bin_dir/$b" "$r/usr/local/bin/$b"; done
install -m 0755 "$ip_bin" "$r/usr/sbin/ip"
install -m 0755 "$ethtool_bin" "$r/usr/sbin/ethtool"
install -m 0755 "$xt_bin" "$r/usr/sbin/xtables-nft-multi"
for a in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -s xtables-nft-multi "$r/usr/sbin/$a"
done
mkdir -p "$r$xt_ext"
cp -a "$xt_ext/." "$r$xt_ext/"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
for f in /etc/protocols /etc/services /etc/ethertypes; do [[ -f $f ]] && cp "$f" "$r$f"; done
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    mkdir -p "$r/etc/ssl/certs"; cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
fi

log "3/5 shared libraries (ldd of every ELF file in the rootfs)"
libs=$(
    find "$r/usr" -type f -perm -u+x -o -type f -name '*.so*' | while read -r f; do
        [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == 177ELF ]] || continue
        # (static files: ldd fails, nothing to copy)
        { ldd "$f" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
    done | sort -u
)
n=0
for l in $libs; do
    # /lib is /usr/lib on Debian 12: store every library under usr/
    dst="$r/usr${l#/usr}"
    [[ -e $dst ]] && continue
    mkdir -p "$(dirname "$dst")"
    cp -L "$l" "$dst"
    n=$((n + 1))
done
log "    $n libraries"
# every binary must resolve all its libraries inside the rootfs
missing=$(for b in "${bins[@]}"; do ldd "$r/usr/local/bin/$b" | grep 'not found' || true; done)
[[ -z $missing ]] || die "libraries not found: $missing"

log "4/5 umoci repack + config"
umoci repack --image "$layout:oxvs" "$bundle" >/dev/null
umoci config --image "$layout:oxvs" --config.cmd oxvs-agent --config.cmd --help \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.workingdir / \
    --config.label org.opencontainers.image.title=oxvs \
    --config.label org.opencontainers.image.source=deploy/build-image.sh \
    --architecture "$(dpkg --print-architecture 2>/dev/null || echo amd64)" --os linux >/dev/null

log "5/5 skopeo: $format archive $out ($ref)"
mkdir -p "$(dirname "$out")"
rm -f "$out.tmp"
case $format in
oci) skopeo copy --quiet --insecure-policy "oci:$layout:oxvs" "oci-archive:$out.tmp:$ref" >/dev/null ;;
docker) skopeo copy --quiet --insecure-policy "oci:$layout:oxvs" "docker-archive:$out.tmp:$ref" >/dev/null ;;
esac
mv -f "$out.tmp" "$out"
log "done in $((SECONDS - t0))s: $out ($(du -h "$out" | cut -f1)); load with: ctr -n k8s.io images import $out"
