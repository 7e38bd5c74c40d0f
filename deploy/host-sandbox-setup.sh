#!/usr/bin/env bash
# `make setup`: what host jobs' sandbox needs (jobs/backends/local_sandbox.py). Installs
# Debian's bubblewrap, slirp4netns and iproute2, and for dev environments openssh-server,
# jupyter-server, nbclassic and ipykernel, where missing (as root, with apt-get), and
# checks that the uid/gid range reserved for jobs holds no login account or group.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v slirp4netns >/dev/null || missing+=(slirp4netns)
command -v ip >/dev/null || missing+=(iproute2)
# What dev environments run inside the sandbox (environments.sshd, environments.jupyter).
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
[ -x /usr/bin/jupyter-nbclassic ] || missing+=(python3-jupyter-server python3-nbclassic python3-ipykernel)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "host sandbox: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  else
    echo "host sandbox: ${missing[*]} missing; host jobs will not be sandboxed and only one" \
         "organisation may run on this host (apt-get install ${missing[*]})" >&2
  fi
fi
base=${LOCAL_JOB_UID_BASE:-1200000}
gbase=${LOCAL_JOB_GID_BASE:-1200000}
count=${LOCAL_JOB_ID_COUNT:-100000}
clash=$(awk -F: -v lo="$base" -v hi="$((base + count))" '$3 >= lo && $3 < hi {print "user " $1 " (" $3 ")"}' /etc/passwd
        awk -F: -v lo="$gbase" -v hi="$((gbase + count))" '$3 >= lo && $3 < hi {print "group " $1 " (" $3 ")"}' /etc/group)
if [ -n "$clash" ]; then
  echo "host sandbox: the ids reserved for jobs ($base.. and $gbase.., $count each) are in use:" >&2
  echo "$clash" >&2
  echo "set LOCAL_JOB_UID_BASE / LOCAL_JOB_GID_BASE to a free range" >&2
  exit 1
fi
