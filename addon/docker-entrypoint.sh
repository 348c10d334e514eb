#!/bin/sh
# Entry point of the wyoming-qwen3tts image, which runs in two ways:
#
# * As a Home Assistant add-on. The Supervisor starts every add-on with
#   SUPERVISOR_TOKEN set, and the add-on build is FROM a Home Assistant base
#   image whose /init is s6-overlay: hand over to it. Its qwen3tts service turns
#   the add-on options into server flags (rootfs/etc/s6-overlay/s6-rc.d).
# * Standalone (docker run, docker compose): run the command, by default the
#   server with --data-dir /data --voices-dir /data/voices, as the unprivileged
#   user qwen3tts. Arguments that start with "-" are added to that default
#   command, so `docker run IMAGE --voice ryan` works.
set -eu

readonly APP_USER=qwen3tts
readonly DATA_DIR=/data

if [ -n "${SUPERVISOR_TOKEN:-}" ]; then
    if [ -x /init ]; then
        exec /init
    fi
    echo "This image was built without s6-overlay and cannot run as a Home" \
        "Assistant add-on; build it FROM a Home Assistant base image" \
        "(see build.yaml)." >&2
    exit 1
fi

case "${1:-}" in
    -*)
        set -- wyoming-qwen3tts --uri tcp://0.0.0.0:10200 \
            --data-dir "${DATA_DIR}" --voices-dir "${DATA_DIR}/voices" "$@"
        ;;
esac

if [ "$(id -u)" = 0 ]; then
    # A bind mount such as ./data is often created by Docker as root-owned:
    # give the server user what it has to write (models, voices) and drop root.
    mkdir -p "${DATA_DIR}/voices"
    find "${DATA_DIR}" ! -user "${APP_USER}" -exec chown "${APP_USER}:${APP_USER}" {} + \
        || echo "warning: cannot hand ${DATA_DIR} to user ${APP_USER}" >&2
    export HOME="/home/${APP_USER}"
    exec setpriv --reuid="${APP_USER}" --regid="${APP_USER}" --init-groups -- "$@"
fi

exec "$@"
