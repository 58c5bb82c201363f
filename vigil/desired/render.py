"""Render the desired unit and environment file of one host: pure, no I/O but templates.

Values from YAML never reach a shell and cannot add options: ExecStart is built as an
argv list, every option is written as one ``--flag=value`` word (so a value that starts
with ``--`` stays a value), and each word is quoted for systemd's own parser.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from vigil.desired.config import HostVars, ModelProfile
from vigil.desired.sandbox import Sandbox, render_template
from vigil.desired.stacks import Stack
from vigil.errors import ConfigError

# The service role owns the unit and env file templates; the package ships them.
TEMPLATES = Path(__file__).resolve().parents[1] / "roles" / "service" / "templates"
# One folder, or a search path: the first folder holding a template wins (an ops repo's
# roles/service/templates before the built-in one).
TemplateDirs = Path | Sequence[Path]
STATE_ROOT = "/var/lib/vigil"  # vigil's own state on a host: backups, locks, history
CACHE_ROOT = "/var/cache/vigil"  # per-service compile caches (systemd CacheDirectory=)
BANNER = "Managed by vigil - edits here are replaced by the next deploy."
API_SERVER = "vllm.entrypoints.openai.api_server"

# Names whose values are never printed: plans, diffs and logs show *** instead.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)$", re.I)
MASK = "***"
_SAFE_NAME = re.compile(r"^(export )?[A-Za-z_][A-Za-z0-9_]*$")


def systemd_quote(word: str) -> str:
    """Quote one ExecStart word: systemd expands %-specifiers and $VARS, so escape both."""
    escaped = (
        word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    )
    return f'"{escaped}"'


def env_quote(value: str) -> str:
    """Quote a value for an EnvironmentFile (no expansion of $ or backslashes)."""
    if "'" not in value:
        return f"'{value}'"
    escaped = "".join("\\" + c if c in '\\"$`' else c for c in value)
    return f'"{escaped}"'


def is_secret(name: str, declared: frozenset[str] = frozenset()) -> bool:
    return name in declared or bool(_SECRET_NAME.search(name))


def stack_hash(stack: Stack) -> str:
    """Content hash of a stack: a new hash means a new environment directory."""
    # no lock: the hash an unlocked stack always had (its environments stay current)
    canon = json.dumps(stack.model_dump(exclude={"description"} | (
        {"lock"} if stack.lock is None else set())), sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Paths:
    unit: str
    env: str
    env_dir: str  # the versioned environment this stack installs into
    current: str  # the link the unit runs through
    python: str
    backup_dir: str
    state: str
    cache: str
    lock: str


def service_paths(host: HostVars) -> dict[str, str]:
    """The files of one release (what a rollback swaps), independent of the stack."""
    svc = host.service
    return {
        "unit": f"{host.unit_dir}/{svc}.service",
        "env": f"{host.config_dir}/{svc}.env",
        "current": f"{host.env_root}/current",
        "backup_dir": f"{STATE_ROOT}/backup/{svc}",
    }


def lock_path(host: HostVars) -> str:
    """The service's deploy lock: deploy and rollback both take it."""
    return f"{STATE_ROOT}/{host.service}.lock"


def paths_for(host: HostVars, stack: Stack) -> Paths:
    svc = host.service
    release = service_paths(host)
    return Paths(
        unit=release["unit"],
        env=release["env"],
        env_dir=f"{host.env_root}/{stack.name}-{stack_hash(stack)}",
        current=release["current"],
        python=f"{release['current']}/bin/python",
        backup_dir=release["backup_dir"],
        state=f"{STATE_ROOT}/{svc}",
        cache=f"{CACHE_ROOT}/{svc}",
        lock=lock_path(host),
    )


def vllm_argv(python: str, host: HostVars, profile: ModelProfile) -> list[str]:
    """The server's argv; every option is a single ``--name=value`` word."""
    args = [python, "-m", API_SERVER, f"--model={profile.path}"]
    if profile.served_model_name:
        args.append(f"--served-model-name={profile.served_model_name}")
    args += [
        f"--host={host.bind}",
        f"--port={host.port}",
        f"--tensor-parallel-size={profile.tensor_parallel_size}",
        f"--pipeline-parallel-size={profile.pipeline_parallel_size}",
    ]
    if profile.data_parallel_size > 1:
        args.append(f"--data-parallel-size={profile.data_parallel_size}")
    args += [
        f"--max-model-len={profile.max_model_len}",
        f"--gpu-memory-utilization={profile.gpu_memory_utilization}",
    ]
    if profile.dtype != "auto":
        args.append(f"--dtype={profile.dtype}")
    if profile.quantization:
        args.append(f"--quantization={profile.quantization}")
    if profile.kv_cache_dtype != "auto":
        args.append(f"--kv-cache-dtype={profile.kv_cache_dtype}")
    if profile.max_num_seqs:
        args.append(f"--max-num-seqs={profile.max_num_seqs}")
    if profile.enforce_eager:
        args.append("--enforce-eager")
    if profile.trust_remote_code:
        args.append("--trust-remote-code")
    if profile.shutdown_timeout_s:
        # a restart drains: requests in flight may finish instead of being aborted
        args.append(f"--shutdown-timeout={profile.shutdown_timeout_s}")
    args += ["--disable-access-log-for-endpoints=/health,/metrics"]
    args += profile.extra_args
    return args


@dataclass(frozen=True)
class Rendered:
    host: str
    paths: Paths
    argv: tuple[str, ...]
    unit_text: str
    env: Mapping[str, str]
    env_text: str
    env_masked: str  # what plans, diffs and logs may show
    secret_names: frozenset[str]
    # template name -> the file it was rendered from (an ops repo may override a built-in)
    templates: Mapping[str, str] = field(default_factory=dict)


def search_path(template_dir: TemplateDirs) -> list[str]:
    dirs = [template_dir] if isinstance(template_dir, Path) else list(template_dir)
    return [str(d) for d in dirs]


def template_file(template_dir: TemplateDirs, name: str) -> Path:
    """The file a template name resolves to on the search path (the first that has it)."""
    dirs = search_path(template_dir)
    return next((Path(d) / name for d in dirs if (Path(d) / name).is_file()),
                Path(dirs[0]) / name)


def _environment(template_dir: TemplateDirs) -> jinja2.Environment:
    env = Sandbox(  # an ops repo's templates are code run here: sandboxed and bounded
        loader=jinja2.FileSystemLoader(search_path(template_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["envquote"] = env_quote
    # systemd expands %-specifiers in most unit settings, Description= included
    env.filters["unitesc"] = lambda text: str(text).replace("%", "%%")
    return env


def _render(jenv: jinja2.Environment, name: str, context: Mapping[str, object]) -> str:
    where = str(template_file([Path(d) for d in jenv.loader.searchpath],  # type: ignore[union-attr]
                              name))
    # any failure (syntax, undefined, 1/0, a missing include, a limit) is one TemplateError
    return render_template(jenv, name, context, where,
                           undefined_fix="use only variables vigil/desired/render.py passes")


def mask_env_text(text: str, secrets: frozenset[str]) -> str:
    """Mask secret values in an env file as found on a host (any quoting). Lines end at
    \n only, as systemd reads them: a U+2028 inside a value must not end the masking."""
    out = []
    for line in text.split("\n"):
        name, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith("#") and is_secret(name.strip(), secrets):
            line = f"{name}={MASK}"
        out.append(line)
    return "\n".join(out)


def redact_env_text(text: str, public: frozenset[str], shown: frozenset[str],
                    key: bytes) -> str:
    """An env file fit to print: a line stays only when it is one vigil renders in the
    open (``shown``: comments, public settings) or sets a ``public`` name; every other
    value (a secret, a variable found only on the host) becomes *** and a keyed hash, so
    a diff still tells changed from unchanged without giving the value away."""
    out = []
    for line in text.split("\n"):
        name, sep, value = line.partition("=")
        if line in shown or (sep and name.strip() in public) or not line.strip():
            out.append(line)
            continue
        digest = hmac.new(key, value.encode(errors="replace"), hashlib.sha256).hexdigest()
        label = f"{name}=" if sep and _SAFE_NAME.fullmatch(name.strip()) else "(a line) "
        out.append(f"{label}{MASK} (hash {digest[:10]})")
    return "\n".join(out)


# Which secrets of secret_env must be set in the operator's environment: all (True), none
# (False: a render for review), or these names (the tasks that write nothing).
Secrets = bool | frozenset[str]
API_KEY = "VLLM_API_KEY"  # vLLM reads --api-key from it; every smoke completion sends it
SMOKE_SECRETS: frozenset[str] = frozenset({API_KEY})  # what verify and rollback need


def check_secrets(host_name: str, host: HostVars, operator_env: Mapping[str, str],
                  required: Secrets = True) -> None:
    """Refuse when a required name of secret_env is not in the operator's environment."""
    wanted = [n for n in host.secret_env
              if required is True or (not isinstance(required, bool) and n in required)]
    missing = [n for n in wanted if n not in operator_env]
    if missing:
        raise ConfigError(
            f"secret_env of host {host_name} needs {', '.join(missing)}, "
            "not set in your environment",
            key="secret_env",
            fix=f"export {missing[0]}=... before running, or remove it from secret_env",
        )


def api_key(host: HostVars, operator_env: Mapping[str, str],
            profile_env: Mapping[str, str] | None = None) -> str | None:
    """VLLM_API_KEY as ``render`` writes it in the env file (secret_env, from the
    operator's environment, over the host's env over the profile's): the key a smoke
    completion sends, in deploy, verify and rollback alike."""
    if API_KEY in host.secret_env:
        return operator_env.get(API_KEY, "")
    return {**(profile_env or {}), **host.env}.get(API_KEY)


def render(
    host_name: str,
    host: HostVars,
    profile: ModelProfile,
    stack: Stack,
    operator_env: Mapping[str, str],
    template_dir: TemplateDirs = TEMPLATES,
    *,
    require_secrets: Secrets = True,
    argv: Sequence[str] | None = None,
    node_note: str = "",
) -> Rendered:
    """Render one host's files. ``require_secrets=False`` (render for review) writes
    missing secrets as empty values; they are masked in every shown form anyway; a set of
    names requires only those (verify: the one its smoke sends, SMOKE_SECRETS). A node
    of a node group (vigil.desired.groups) passes its own ``argv`` and a ``node_note``
    that the unit carries as a comment."""
    paths = paths_for(host, stack)
    env: dict[str, str] = {**profile.env, **host.env}
    check_secrets(host_name, host, operator_env, require_secrets)
    for name in host.secret_env:
        env[name] = operator_env.get(name, "")
    for name, value in env.items():
        if not re.fullmatch(r"[^\x00-\x1f\x7f]*", value):
            raise ConfigError(f"value of {name} contains a control character", key=name)
    secrets = frozenset(n for n in env if is_secret(n, frozenset(host.secret_env)))
    argv = list(argv) if argv is not None else vllm_argv(paths.python, host, profile)
    jenv = _environment(template_dir)
    context: dict[str, object] = {
        "managed_banner": BANNER,
        "host": host,
        "profile": profile,
        "unit_name": host.service,
        "env_path": paths.env,
        "state_path": paths.state,
        "cache_path": paths.cache,
        "state_dir_rel": paths.state.removeprefix("/var/lib/"),
        "cache_dir_rel": paths.cache.removeprefix("/var/cache/"),
        "exec_start": " ".join(systemd_quote(a) for a in argv),
        # unit settings: the service role's defaults.yml, overridable per host
        "start_limit_interval_s": host.start_limit_interval_s,
        "start_limit_burst": host.start_limit_burst,
        "restart_sec": host.restart_sec,
        "timeout_start_s": int(host.serve_timeout_s),
        # systemd must not SIGKILL a drain that vLLM is allowed to take
        "timeout_stop_s": max(host.timeout_stop_s, profile.shutdown_timeout_s + 30),
        "limit_nofile": host.limit_nofile,
        "node_note": node_note,
    }
    unit_text = _render(jenv, "vllm.service.j2", context)
    env_text = _render(jenv, "vllm.env.j2", {**context, "env": env})
    masked_env = {n: (MASK if n in secrets else v) for n, v in env.items()}
    env_masked = _render(jenv, "vllm.env.j2", {**context, "env": masked_env})
    return Rendered(
        host=host_name,
        paths=paths,
        argv=tuple(argv),
        unit_text=unit_text,
        env=env,
        env_text=env_text,
        env_masked=env_masked,
        secret_names=secrets,
        templates={n: str(template_file(template_dir, n))
                   for n in ("vllm.service.j2", "vllm.env.j2")},
    )
