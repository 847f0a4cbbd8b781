# Sourced by the scripts that install Debian packages for their tests
# (deploy/check-dashboards.sh, loadtest/bench-smoke.sh).
#
# apt_install_no_services PKG...
#   Installs PKG... with apt-get, quietly and without recommends, keeping the packages' scripts
#   from starting their services: the tests start their own servers, and on a machine without an
#   init system (a container) a postinst that starts a service fails the install. A
#   /usr/sbin/policy-rc.d that refuses every start is put in place for the install and removed
#   afterwards (also if the install fails); one that was already there is left alone. Needs root.
apt_install_no_services() {
  [ "$(id -u)" = 0 ] || { echo "need $*: apt-get install $*, or run as root" >&2; return 1; }
  local created=0 rc=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# created by loadtest/lib/apt.sh for an apt-get install\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    created=1
  fi
  apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
    rc=$?
  [ "$created" = 1 ] && rm -f /usr/sbin/policy-rc.d
  return "$rc"
}
