# Sourced by scripts/setup-vulkan.sh and scripts/vulkan-lavapipe.sh: package lists of one Debian suite
# in a temporary apt directory, so `apt-get download` can fetch a package from it without touching the
# system's sources, lists or installed packages (nothing is installed).
#   private_apt SUITE   sets apt_dir (removed on exit) and apt_opts, and runs `apt-get update` with them
private_apt() {
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/download"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $1 main" \
    > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Get::List-Cleanup=0"
            -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root" -qq)
  apt-get "${apt_opts[@]}" update >/dev/null
}
