#!/usr/bin/env bash
# Lays out the image's root filesystem from a built binary (target/dist/ccm-controller-manager,
# the CCM alone, built with the `dist` profile; any build of it or of the full `ccm` works too) installed as /usr/local/bin/ccm, the shared
# libraries ldd reports (with the dynamic loader), the CA bundle, a passwd/group entry for the
# non-root user 65532 and a writable /tmp (service-account token files go there; the
# Deployment mounts an emptyDir over it because the root filesystem is read-only).
set -euo pipefail
bin="${1:?usage: prepare-rootfs.sh CCM_BINARY OUT_DIR}"
out="${2:?usage: prepare-rootfs.sh CCM_BINARY OUT_DIR}"
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/tmp"
chmod 1777 "$out/tmp"
install -m 0755 "$bin" "$out/usr/local/bin/ccm"
# Shared libraries (a static binary has none: ldd says "not a dynamic executable").
if ldd "$bin" >/dev/null 2>&1; then
  ldd "$bin" | grep -o '/[^ ]*' | sort -u | while read -r lib; do
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
  done
fi
for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  if [ -f "$ca" ]; then cp "$ca" "$out/etc/ssl/certs/ca-certificates.crt"; break; fi
done
echo "nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin" > "$out/etc/passwd"
echo "nonroot:x:65532:" > "$out/etc/group"
