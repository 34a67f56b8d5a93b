#!/usr/bin/env bash
# Builds the ccm-rs image: the controller manager with every provider (sim, metal, aws and
# openstack: cargo features `aws,openstack`), its root filesystem, and the image, with buildah.
#
#   deploy/image/build.sh [TAG]                       # default localhost/ccm-rs:<version>
#
# Environment:
#   CCM_PROFILE   cargo profile of the binary (default `dist`: fat LTO, one codegen unit,
#                 panic=abort; the release build). A dist build with the AWS SDK takes far
#                 longer than the test suite's budget on a 2-core CI machine (docs/deploy.md).
#   CCM_BINARY    a controller manager already built with `--features aws,openstack`, packed
#                 instead of building one (the image test packs the one its own build made).
#   BUILDAH       buildah with its options (default: `buildah`; the test adds --root/--runroot
#                 and --storage-driver vfs).
#   CARGO_TARGET_DIR  as for cargo (default: target).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile="${CCM_PROFILE:-dist}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
tag="${1:-localhost/ccm-rs:$version}"
target="${CARGO_TARGET_DIR:-target}"
case "$profile" in dev) dir=debug ;; *) dir="$profile" ;; esac

binary="${CCM_BINARY:-$target/$dir/ccm-controller-manager}"
if [ -z "${CCM_BINARY:-}" ]; then
  cargo build --profile "$profile" --locked -p ccm --features aws,openstack --bin ccm-controller-manager
fi
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
deploy/image/prepare-rootfs.sh "$binary" "$rootfs/rootfs"
${BUILDAH:-buildah} bud --isolation chroot -f deploy/image/Containerfile -t "$tag" "$rootfs/rootfs"
