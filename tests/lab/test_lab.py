"""The lab itself: real nspawn hosts over real SSH (the tiny model generator:
tests/unit/test_lab_tiny_model.py)."""

from __future__ import annotations

import socket
import uuid

import paramiko
import pytest

from lab import hosts
from tests.lab_fixtures import LAB_HOSTS, lab_hosts  # noqa: F401  (pytest fixture)

HostList = list[hosts.HostStatus]
pytestmark = pytest.mark.drives(1, 2)


# --- lab hosts ------------------------------------------------------------------------


@pytest.mark.lab
def test_hosts_are_up_and_listed(lab_hosts: HostList) -> None:  # noqa: F811
    assert [h.name for h in lab_hosts] == [f"lab{i}" for i in range(1, LAB_HOSTS + 1)]
    by_name = {h.name: h for h in hosts.status()}
    for h in lab_hosts:
        assert by_name[h.name].running and by_name[h.name].ssh_ok
        assert by_name[h.name].port == 2200 + int(h.name[3:])


@pytest.mark.lab
def test_inventory_fragment_loads(lab_hosts: HostList) -> None:  # noqa: F811
    from vigil.desired import inventory

    text = hosts.INVENTORY_FRAGMENT.read_text()
    assert text.startswith("# written by `invoke lab.up`")
    inv = inventory.load(str(hosts.REPO / "inventory"))
    for h in lab_hosts:
        v = inv.host_vars(h.name)
        assert (v.address, v.ssh_port, v.ssh_user) == ("127.0.0.1", h.port, "root")
        assert v.ssh_key == str(hosts.key_path())
        assert v.known_hosts == str(hosts.known_hosts_path())
        assert (v.model, v.stack) == ("tiny-cpu", "lab-cpu")


@pytest.mark.lab
def test_ssh_checks_host_keys(lab_hosts: HostList) -> None:  # noqa: F811
    for h in lab_hosts:
        i = int(h.name[3:])
        client = hosts.connect(i)  # RejectPolicy + the lab's known_hosts
        try:
            _, out, _ = client.exec_command("hostname; systemctl is-active ssh")
            assert out.read().decode().split() == [h.name, "active"]
        finally:
            client.close()
    # A client that does not know the host key is refused: checking really is on.
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client.connect(
            "127.0.0.1",
            port=lab_hosts[0].port,
            username="root",
            key_filename=str(hosts.key_path()),
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )
    client.close()


@pytest.mark.lab
def test_unit_runs_and_logs_to_journal(lab_hosts: HostList) -> None:  # noqa: F811
    marker = f"vigil-lab-{uuid.uuid4().hex[:8]}"
    unit = f"{marker}.service"
    body = (
        "[Unit]\nDescription=lab test\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        f"ExecStart=/bin/echo hello from {marker}\n"
    )
    for h in lab_hosts:
        i = int(h.name[3:])
        code, _, err = hosts.run(
            i,
            f"cat > /etc/systemd/system/{unit} <<'EOF'\n{body}EOF\n"
            f"systemctl daemon-reload && systemctl start {unit} && systemctl is-active {unit}",
        )
        assert code == 0, err
        code, out, err = hosts.run(i, f"journalctl -u {unit} --no-pager -o cat")
        assert code == 0, err
        assert f"hello from {marker}" in out
        hosts.run(
            i, f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload"
        )


@pytest.mark.lab
def test_host_layout(lab_hosts: HostList) -> None:  # noqa: F811
    i = int(lab_hosts[0].name[3:])
    code, out, err = hosts.run(
        i,
        "set -e; id -u vllm; test -f /srv/models/tiny-llama/config.json; "
        "for d in /etc/vigil /var/lib/vigil /opt/vigil /var/cache/vigil /root/.cache/pip /tmp; "
        "do touch $d/.w && rm $d/.w; done; "
        "! touch /srv/models/.w 2>/dev/null; echo ok",
    )
    assert code == 0 and out.split()[-1] == "ok", err
    # /opt/vigil is the host's own, and persistent on the machine
    hosts.run(i, "echo x > /opt/vigil/.lab-test")
    mark = hosts.lab_dir() / "hosts" / lab_hosts[0].name / "opt-vigil" / ".lab-test"
    assert mark.read_text() == "x\n"
    mark.unlink()


@pytest.mark.lab
def test_noroot_user_cannot_write_units(lab_hosts: HostList) -> None:  # noqa: F811
    i = int(lab_hosts[0].name[3:])
    code, out, err = hosts.run(
        i, "id -un; touch /etc/systemd/system/vigil-noroot-test.service", user=hosts.NOROOT_USER
    )
    assert out.strip() == hosts.NOROOT_USER
    assert code != 0 and "Permission denied" in err


@pytest.mark.lab
def test_sshd_listens_on_loopback_only(lab_hosts: HostList) -> None:  # noqa: F811
    code, out, _ = hosts.run(int(lab_hosts[0].name[3:]), "ss -ltnH")
    assert code == 0
    ports = {line.split()[3] for line in out.splitlines()}
    assert f"127.0.0.1:{lab_hosts[0].port}" in ports
    with socket.socket() as s:
        s.settimeout(2)
        s.connect(("127.0.0.1", lab_hosts[0].port))
        assert s.recv(64).startswith(b"SSH-2.0-")
