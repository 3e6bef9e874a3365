# shellcheck shell=bash
# The project's interpreter, for the recipes (_common.sh) and recipes/slurm/train.sbatch: no venv need be activated.
# Source it, then `ve_find_python <repository>`: sets VE_PYTHON, or leaves it empty and says why in
# VE_PYTHON_PROBLEM (one line; ve_need_python prints it and stops).

# shellcheck disable=SC2034  # VE_PYTHON is read by the scripts that source this file
ve_find_python() {
  local repo="$1" found=""
  VE_PYTHON="" VE_PYTHON_PROBLEM=""
  if [ -n "${PYTHON:-}" ]; then  # the user's word, taken as given
    if command -v "$PYTHON" >/dev/null 2>&1; then VE_PYTHON="$PYTHON"; return 0; fi
    VE_PYTHON_PROBLEM="PYTHON=$PYTHON is not a program: point it at the interpreter verl-evidence is installed in"
    return 0
  fi
  if [ -x "$repo/.venv/bin/python" ]; then
    VE_PYTHON="$repo/.venv/bin/python"
    return 0
  fi
  found="$(command -v python3 2>/dev/null || true)"
  # the project and what it trains with, found (not imported: verl takes seconds), from / (not the current directory)
  local check='import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("verl_evidence", "verl", "ray"))))'
  if [ -n "$found" ] && (cd / && "$found" -c "$check" >/dev/null 2>&1); then
    VE_PYTHON="$found"
    return 0
  fi
  VE_PYTHON_PROBLEM="no Python with verl-evidence installed: no $repo/.venv (make install creates it) and"
  VE_PYTHON_PROBLEM="$VE_PYTHON_PROBLEM ${found:-no python3 on PATH}${found:+ cannot import verl_evidence, verl and ray}; activate"
  VE_PYTHON_PROBLEM="$VE_PYTHON_PROBLEM the environment you installed it in, or set PYTHON=/path/to/its/python"
}

ve_need_python() {  # stop with the one line when no interpreter was found
  [ -z "${VE_PYTHON_PROBLEM:-}" ] && return 0
  echo "error: $VE_PYTHON_PROBLEM" >&2
  exit 2
}
