#!/usr/bin/env bash
# A local multi-node Ray cluster on one machine: one head and N worker nodes, each a
# separate raylet (own `ray start --temp-dir`, own ports, own object store), so that
#
#   eval "$(cluster/local-ray-cluster.sh start)"
#   ray job submit --address http://127.0.0.1:8265 --working-dir . -- xling run --config configs/demo.yaml
#   cluster/local-ray-cluster.sh status        # `ray status` of this cluster
#   cluster/local-ray-cluster.sh stop
#
# behaves as on a real cluster (working_dir upload, tasks on another node, object transfer).
# A thin wrapper around `python -m xling.dev.localcluster` -- the same code the tests run;
# its module docstring explains the choices. In short:
#   * head:    ray start --head --node-ip-address 127.0.0.1 --port <free> --temp-dir ROOT/head
#              --dashboard-host 127.0.0.1 --dashboard-port 8265 --num-cpus 1
#              --resources '{"xling-head": 1}' --object-store-memory 512MiB + explicit ports
#   * workers: ray start --address 127.0.0.1:<gcs> --temp-dir ROOT/w1 --num-cpus 1
#              --resources '{"xling-worker": 1}' + their own explicit ports
#     (run through `python -m xling.dev.localcluster ray-start`, see "Loopback" there);
#   * everything listens on 127.0.0.1 only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0);
#   * token auth with a per-cluster token in ROOT/auth_token: clients need the variables
#     that `start` and `env` print (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH, RAY_ADDRESS, ...);
#   * `stop` signals only the processes of THIS cluster (found by an environment marker,
#     their sessions and their descendants), raylets first and GCS last. It never runs
#     `ray stop`, which would kill every Ray instance of the user on this machine.
#
# Commands: start [--workers N] [--cpus-per-node N] [--dashboard-port P|0] [--object-store-mb M]
#                 [--auth token|disabled] [--no-loopback]
#           stop | status | env
# Common option: --root DIR (default $XLING_RAY_ROOT or <repo>/.xling-cache/ray-cluster).
# If 8265 is taken (a `ray.init()` with dashboard elsewhere), use --dashboard-port 0 and
# take the address from the printed RAY_API_SERVER_ADDRESS.
# Python: $PYTHON, else <repo>/.venv/bin/python, else python3 (needs ray[default]).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi

cmd="${1:-}"
case "$cmd" in
  start|stop|status|env) shift ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac

args=("$cmd")
if [[ " $* " != *" --root "* && " $* " != *" --root="* ]]; then
  args+=(--root "${XLING_RAY_ROOT:-$ROOT/.xling-cache/ray-cluster}")
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m xling.dev.localcluster "${args[@]}" "$@"
