#!/usr/bin/env bash
# A newer lavapipe (Mesa's Vulkan driver on the CPU) for accelstack's Vulkan tests on Debian 12, without
# installing it: Debian 12's Mesa 22.3.6 lavapipe corrupts its heap in stable-diffusion.cpp's first UNet
# graph (docs/engine.md, "Vulkan"), so the Vulkan end-to-end test cannot pass on it.
#
# When the system's lavapipe is older than Mesa 23 and the distribution's backports suite has a newer
# mesa-vulkan-drivers (bookworm-backports: 25.x, built for bookworm's libc), this script downloads that
# package with `apt-get download` (package lists in a temporary apt directory; the system's sources,
# lists and packages are not touched), extracts only libvulkan_lvp.so (and the libLLVM it needs, when
# that is not installed) into <build cache>/vulkan-lavapipe/<version>/, and writes there:
#   lvp_icd.json  a Vulkan ICD manifest whose library_path is that driver (absolute);
#   env           KEY=VALUE lines that point the Vulkan loader at it (VK_DRIVER_FILES, and
#                 VK_ICD_FILENAMES for loaders older than 1.3.207; LD_LIBRARY_PATH when a libLLVM was
#                 extracted too), and MESA_SHADER_CACHE_DIR=<that folder>/shader-cache: llvmpipe's
#                 first compile of ggml's shaders takes tens of minutes with LLVM 15 (docs/engine.md),
#                 so its cache lives beside the driver, in the build cache a CI runner keeps, not in
#                 ~/.cache. Only tests/engine/verification/test_vulkan_e2e.py reads it, and only with
#                 ACCELSTACK_NEWER_LAVAPIPE=1; nothing else changes.
# Idempotent; prints the env file's path on stdout when there is one (nothing when the system's lavapipe
# is new enough or no newer one is available); notes go to stderr.
# Usage: scripts/vulkan-lavapipe.sh BUILD_CACHE_DIR
set -euo pipefail

note() { echo "vulkan-lavapipe: $*" >&2; }

cache=${1:?usage: scripts/vulkan-lavapipe.sh BUILD_CACHE_DIR}
root="$cache/vulkan-lavapipe"
PACKAGE=mesa-vulkan-drivers
OLDEST_GOOD=23  # Mesa major version from which the system's own lavapipe is used

# Already extracted: the newest version with a driver and an env file.
for dir in $(ls -d "$root"/*/ 2>/dev/null | sort -V -r); do
  if [ -s "$dir/env" ] && [ -s "$dir/lvp_icd.json" ] && ls "$dir"/usr/lib/*/libvulkan_lvp.so >/dev/null 2>&1; then
    if ! grep -q '^MESA_SHADER_CACHE_DIR=' "$dir/env"; then  # extracted before the cache moved here
      echo "MESA_SHADER_CACHE_DIR=${dir%/}/shader-cache" >> "$dir/env"
    fi
    echo "${dir%/}/env"
    exit 0
  fi
done

system_version=$(dpkg-query -W -f='${Version}' "$PACKAGE" 2>/dev/null || true)
if [ -z "$system_version" ]; then
  note "no system $PACKAGE: nothing to replace"
  exit 0
fi
if dpkg --compare-versions "$system_version" ge "$OLDEST_GOOD"; then
  exit 0  # the system's lavapipe is new enough
fi
codename=$(. /etc/os-release 2>/dev/null && echo "${ID:-}:${VERSION_CODENAME:-}")
case "$codename" in
  debian:?*) suite="${codename#debian:}-backports" ;;
  *) note "system lavapipe is Mesa $system_version and no backports suite is known for ${codename:-this system}"; exit 0 ;;
esac

. "$(dirname "$0")/private-apt.sh"
private_apt "$suite"
candidate=$(apt-cache "${apt_opts[@]}" show "$PACKAGE/$suite" 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -n 1 || true)
if [ -z "$candidate" ] || dpkg --compare-versions "$candidate" lt "$OLDEST_GOOD"; then
  note "system lavapipe is Mesa $system_version and $suite has no newer $PACKAGE"
  exit 0
fi
note "fetching $PACKAGE $candidate from Debian $suite (lavapipe only, not installed)"
(cd "$apt_dir/download" && apt-get "${apt_opts[@]}" download "$PACKAGE=$candidate" >/dev/null)
deb=$(ls "$apt_dir"/download/${PACKAGE}_*.deb)
unpack="$apt_dir/unpack"
dpkg-deb -x "$deb" "$unpack"
lvp=$(cd "$unpack" && ls usr/lib/*/libvulkan_lvp.so | head -n 1)
api=$(sed -n 's/.*"api_version": *"\([^"]*\)".*/\1/p' "$unpack"/usr/share/vulkan/icd.d/lvp_icd*.json | head -n 1)

dest="$root/$candidate"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/$(dirname "$lvp")"
cp -a "$unpack/$lvp" "$dest.tmp/$lvp"

# The libLLVM it links: the system's when installed (bookworm-backports' Mesa 25 uses bookworm's
# libllvm15), else the package from the same suite, extracted next to the driver.
libdir=""
llvm_pkg=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -n 's/^ *\(libllvm[0-9][0-9]*\).*/\1/p' | head -n 1)
if [ -n "$llvm_pkg" ] && ! dpkg-query -W -f='${Status}' "$llvm_pkg" 2>/dev/null | grep -q "install ok installed"; then
  note "fetching $llvm_pkg from Debian $suite (not installed)"
  (cd "$apt_dir/download" && apt-get "${apt_opts[@]}" download "$llvm_pkg/$suite" >/dev/null)
  dpkg-deb -x "$(ls "$apt_dir"/download/${llvm_pkg}_*.deb)" "$apt_dir/llvm"
  libdir="$dest/$(dirname "$lvp")"
  cp -a "$apt_dir"/llvm/usr/lib/*/libLLVM*.so* "$dest.tmp/$(dirname "$lvp")/"
fi

# Every library it needs resolves here (with its own directory first, as the env file says).
if unresolved=$(LD_LIBRARY_PATH="$dest.tmp/$(dirname "$lvp")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                ldd -r "$dest.tmp/$lvp" 2>&1 | grep -E "not found|undefined symbol|version .* not found"); then
  rm -rf "$dest.tmp"
  note "lavapipe $candidate does not load on this system: $(echo "$unresolved" | head -n 3)"
  exit 1
fi

printf '{\n    "file_format_version": "1.0.0",\n    "ICD": {\n        "library_path": "%s",\n        "api_version": "%s"\n    }\n}\n' \
  "$dest/$lvp" "${api:-1.3.0}" > "$dest.tmp/lvp_icd.json"
{
  echo "# lavapipe from Mesa $candidate (Debian $suite), for accelstack's Vulkan tests (scripts/vulkan-lavapipe.sh)"
  echo "VK_DRIVER_FILES=$dest/lvp_icd.json"
  echo "VK_ICD_FILENAMES=$dest/lvp_icd.json"
  if [ -n "$libdir" ]; then echo "LD_LIBRARY_PATH=$libdir"; fi
  echo "MESA_SHADER_CACHE_DIR=$dest/shader-cache"
} > "$dest.tmp/env"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
echo "$dest/env"
