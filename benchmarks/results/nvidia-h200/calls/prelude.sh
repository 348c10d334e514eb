# Sourced by the call scripts (q.sh, r.sh) on the device machine: the carried wheels
# installed once into /tmp/site, the environment every call runs with, `since` (seconds since
# the call began) and `profile OUT_DIR SECONDS BATCHES [profile_step ARGS...]` (the frame
# profile under faulthandler, its table printed).
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR="$HOME/.triton/cache"
s=$(date +%s)
since() { echo "$(( $(date +%s) - s )) s"; }
profile() {
  local dir=$1 seconds=$2 batches=$3
  shift 3
  mkdir -p "$dir"
  timeout -s ABRT "$seconds" python3 -X faulthandler -m benchmarks.profile_step --no-bare --batches "$batches" \
    --out "$dir" "$@" > "$dir/profile.log" 2>&1; echo "profile $dir rc $? at $(since)"
  grep -E '^[|]|^Thread|^  File|Error' "$dir/profile.log" | head -30
}
