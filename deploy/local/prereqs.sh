#!/usr/bin/env bash
# Checks the system prerequisites; installs the missing ones with apt-get when running as root,
# otherwise prints one clear line saying what to install. Usage: prereqs.sh [--test] [--bench]
set -euo pipefail
missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
# nginx: the ingress of `tollgate up --split` (deploy/ingress.conf); in /usr/sbin, often off a user's PATH
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx)
command -v python3.11 >/dev/null || command -v python3 >/dev/null || missing+=(python3)
for option in "$@"; do
  case "$option" in
    --test)  # the console's browser tests (chromium), the Caddy ingress snippet (caddy), the alert rules (prometheus: promtool, and a real Prometheus)
      command -v chromium >/dev/null || missing+=(chromium)
      command -v caddy >/dev/null || missing+=(caddy)
      command -v promtool >/dev/null || missing+=(prometheus) ;;
    --bench) command -v wrk >/dev/null || missing+=(wrk) ;;  # bench/http.py: a real HTTP load generator
  esac
done
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "installing system packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "Missing system packages; install them first: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
