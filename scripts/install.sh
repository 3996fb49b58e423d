# Install leantrain from this checkout into a virtual environment, with the torch that fits the machine.
#
#   bash scripts/install.sh '.[demo]'          # or sourced (quickstart.sh, test.sh): the venv stays active
#   LEANTRAIN_VENV=/tmp/lt bash scripts/install.sh .
#
# $1: what to install (default "."; e.g. ".[demo]", ".[dev]"). The venv is $LEANTRAIN_VENV (default .venv),
# created when missing. torch comes first, chosen by scripts/torch_choice.py: a torch already in the venv is
# kept; with an NVIDIA GPU, the default index's CUDA build; without one, the CPU build from PyTorch's CPU
# index, or where that index cannot be reached a CPU wheel in pip's find-links folders, else the default
# index. Then leantrain itself, which keeps that torch.
_lt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_lt_venv="${LEANTRAIN_VENV:-.venv}"
[ -x "$_lt_venv/bin/python" ] || python3 -m venv "$_lt_venv"
. "$_lt_venv/bin/activate"
# (pip's "Location ... is ignored" lines come from some machines' extra index settings: noise)
pipq() { python -m pip install -q "$@" 2> >(grep -v "is ignored" >&2); }
_lt_torch="torch>=2.4"  # the same lower bound as pyproject.toml
read -r _lt_choice _lt_wheel <<< "$(python "$_lt_root/scripts/torch_choice.py")"
case "$_lt_choice" in
  keep) ;;
  local-cpu) pipq "$_lt_wheel" ;;
  cpu-index)
    # fail fast (short timeout, no retries) and fall back to the default index rather than hang
    pipq "$_lt_torch" --index-url "${LEANTRAIN_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
        --timeout 10 --retries 0 \
      || { echo "leantrain install: the CPU index failed; torch from the default index" >&2; pipq "$_lt_torch"; } ;;
  *) pipq "$_lt_torch" ;;
esac
pipq -e "${1:-.}"
