#!/bin/sh
# Pin the container image's base to the digest its tag names today: deploy/base-image.txt holds
# `NAME:TAG@sha256:<64 hex>`, the one place the Dockerfile's build argument PYTHON_IMAGE comes from:
#
#   docker build --build-arg PYTHON_IMAGE="$(cat deploy/base-image.txt)" -t IMAGE .
#
#   scripts/update_base_image.sh [NAME:TAG]     # default: the name and tag already in the file
#
# The digest is the registry's manifest-list digest, read with the first tool found: crane, skopeo, or
# `docker buildx imagetools`. Review and commit the change like any dependency update (CHANGELOG).
set -eu
cd "$(dirname "$0")/.."
FILE=deploy/base-image.txt
NAME=${1:-$(sed -n '1s/@.*//p' "$FILE")}
case "$NAME" in *:*) ;; *) echo "update_base_image.sh: $NAME: give NAME:TAG" >&2; exit 2 ;; esac
if command -v crane >/dev/null; then
  DIGEST=$(crane digest "$NAME")
elif command -v skopeo >/dev/null; then
  DIGEST=$(skopeo inspect --format '{{.Digest}}' "docker://docker.io/library/$NAME")
elif command -v docker >/dev/null; then
  DIGEST=$(docker buildx imagetools inspect --format '{{json .Manifest.Digest}}' "$NAME" | tr -d '"')
else
  echo "update_base_image.sh: needs crane, skopeo or docker (buildx) to read the digest" >&2
  exit 1
fi
PINNED="$NAME@$DIGEST"
# The form tests/integration/deploy/test_image.py checks: never write anything else into the file.
if ! printf '%s\n' "$PINNED" | grep -Eq '^[a-z0-9._/-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$'; then
  echo "update_base_image.sh: unexpected digest for $NAME: $DIGEST" >&2
  exit 1
fi
printf '%s\n' "$PINNED" > "$FILE"
echo "$FILE: $PINNED"
