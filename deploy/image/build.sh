#!/usr/bin/env bash
# Builds the ccm-rs image: the controller manager with every provider (sim, metal and aws:
# cargo feature `aws`), its root filesystem, and the image, with buildah.
#
#   deploy/image/build.sh [TAG]                       # default localhost/ccm-rs:<version>
#
# Environment:
#   CCM_PROFILE   cargo profile of the binary (default `dist`: fat LTO, one codegen unit,
#                 panic=abort; the release build). The image test builds with `dev`, whose
#                 AWS SDK libraries the test suite has already compiled: a dist build with the
#                 AWS SDK takes far longer than the suite's budget on a 2-core CI machine
#                 (docs/deploy.md).
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

cargo build --profile "$profile" --locked -p ccm --features aws,openstack --bin ccm-controller-manager
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
deploy/image/prepare-rootfs.sh "$target/$dir/ccm-controller-manager" "$rootfs/rootfs"
${BUILDAH:-buildah} bud --isolation chroot -f deploy/image/Containerfile -t "$tag" "$rootfs/rootfs"
