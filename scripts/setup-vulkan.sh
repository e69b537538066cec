#!/usr/bin/env bash
# Make this Debian/Ubuntu machine able to build and run the `vulkan` ggml variant, without a GPU:
#   - Debian packages: mesa-vulkan-drivers (lavapipe, a conformant Vulkan driver that runs on the
#     CPU), libvulkan1 (the loader), libvulkan-dev and glslc (the shader compiler ggml-vulkan needs);
#     installed with apt-get only when one is missing (`apt-get update` only then too);
#   - Vulkan 1.4 headers: Debian 12's libvulkan-dev (1.3.239) lacks vk::LayerSettingEXT, which
#     ggml-vulkan uses, so Debian 13 (trixie)'s libvulkan-dev is downloaded (never installed: it
#     would pull a newer libc) and only its usr/include is extracted into the build cache, where
#     `accelstack build ggml --backend vulkan` finds it. The system's 1.3 loader runs the result;
#   - with ACCELSTACK_NEWER_LAVAPIPE=1 only: a newer lavapipe for the tests when the system's is
#     Mesa 22 (Debian 12's crashes in stable-diffusion.cpp's UNet): scripts/vulkan-lavapipe.sh
#     extracts bookworm-backports' driver into the build cache, with an env file the Vulkan
#     end-to-end test reads under the same variable (never installed); the test passes on it. Opt-in
#     because with a cold shader cache Mesa 25 and bookworm's LLVM 15 spend tens of minutes compiling
#     the UNet's shaders (docs/engine.md).
# The trixie package index lives in a temporary apt directory: the system's sources are not touched.
# Idempotent and quiet: prints only the include directory on stdout (notes go to stderr).
# Usage: scripts/setup-vulkan.sh [BUILD_CACHE_DIR]   (default: accelstack's build cache)
set -euo pipefail
cd "$(dirname "$0")/.."

HEADERS_SUITE=trixie
HEADERS_PACKAGE=libvulkan-dev
PACKAGES=(mesa-vulkan-drivers libvulkan1 libvulkan-dev glslc)

note() { echo "setup-vulkan: $*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  note "installing ${missing[*]}"
  # wait for another apt or dpkg (an unattended upgrade) instead of failing at once
  lock=(-o "DPkg::Lock::Timeout=${APT_LOCK_TIMEOUT:-300}")
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" update -qq >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The build cache, as accelstack resolves it (ACCELSTACK_BUILD_CACHE, ACCELSTACK_CACHE, XDG).
cache=${1:-}
if [ -z "$cache" ]; then
  for py in .venv/bin/python python3; do
    if cache=$("$py" -c 'from accelstack.settings import Settings; print(Settings.resolve().build_cache)' 2>/dev/null); then
      break
    fi
    cache=""
  done
fi
if [ -z "$cache" ]; then
  cache=${ACCELSTACK_BUILD_CACHE:-${ACCELSTACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/accelstack}/builds}
fi
root="$cache/vulkan-headers"

# The newer lavapipe first, when asked for (its failure only leaves the tests on the system's driver).
if [ "${ACCELSTACK_NEWER_LAVAPIPE:-}" = 1 ]; then
  if env_file=$(scripts/vulkan-lavapipe.sh "$cache"); then
    : "${env_file}"  # its path (empty: the system's lavapipe is new enough, or none newer exists)
  else
    note "no newer lavapipe: the Vulkan tests use the system's"
  fi
fi

headers() {
  # Already extracted? (any version with the C++ header ggml-vulkan includes, that has LayerSettingEXT)
  for dir in $(ls -d "$root"/*/usr/include 2>/dev/null | sort -V -r); do
    if grep -qs "LayerSettingEXT" "$dir/vulkan/vulkan_structs.hpp"; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}
if headers; then
  exit 0
fi

note "fetching $HEADERS_PACKAGE from Debian $HEADERS_SUITE (headers only)"
. scripts/private-apt.sh
private_apt "$HEADERS_SUITE"
(cd "$apt_dir/download" && apt-get "${apt_opts[@]}" download "$HEADERS_PACKAGE/$HEADERS_SUITE" >/dev/null)
deb=$(ls "$apt_dir"/download/*.deb)
version=$(dpkg-deb -f "$deb" Version)
unpack="$apt_dir/unpack"
dpkg-deb -x "$deb" "$unpack"
dest="$root/$version"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/usr"
cp -a "$unpack/usr/include" "$dest.tmp/usr/include"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest/usr/include"
