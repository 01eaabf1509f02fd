# SPDX-License-Identifier: MIT
"""deploy/: the Kubernetes manifests against the Kubernetes schemas (kubernetes-validate, offline),
what they must agree on with each other and with the image, the systemd unit (systemd-analyze
verify where systemd is installed), and the sdist (make sdist) standing alone.

Run by `make wheel-test` (part of make test) with build/venv's Python, which has
kubernetes-validate and build (python/requirements/wheel.txt).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
# Native sidecars (init containers with restartPolicy: Always) are 1.29's; the newest schema
# kubernetes-validate carries is its default.
K8S_VERSIONS = ("1.29.0", "1.37.0")
SOCKET = "/run/kvbroker/kvbroker.sock"


def _docs() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for m in MANIFESTS:
        out += [(m, d) for d in yaml.safe_load_all(m.read_text()) if d]
    return out


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] == "Pod":
        return doc["spec"]  # type: ignore[no-any-return]
    if doc["kind"] in ("DaemonSet", "Deployment"):
        return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def _brokers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in spec.get("containers", []) + spec.get("initContainers", [])
            if c["name"] == "kvbrokerd"]


def test_manifests_exist() -> None:
    names = {m.name for m in MANIFESTS}
    assert {"daemonset.yaml", "engine-pod.yaml", "sidecar.yaml"} <= names, names


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate(version: str) -> None:
    r = subprocess.run([str(VALIDATE), "--strict", "-k", version, *map(str, MANIFESTS)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == len(_docs()), r.stdout


def test_validation_catches_a_misspelled_field(tmp_path: Path) -> None:
    # The check above can fail: a field the schema does not have is refused (--strict).
    bad = tmp_path / "bad.yaml"
    bad.write_text((DEPLOY / "k8s" / "sidecar.yaml").read_text()
                   .replace("readinessProbe:", "readinesProbe:", 1))
    r = subprocess.run([str(VALIDATE), "--strict", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr, r.stdout + r.stderr


def test_broker_containers_are_complete() -> None:
    shapes = set()
    for path, doc in _docs():
        spec = _pod_spec(doc)
        if spec is None:
            continue
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for c in _brokers(spec):
            where = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
            args = c["args"]
            assert args[args.index("--socket") + 1] == SOCKET, where
            assert {"name": "KVB_SOCKET", "value": SOCKET} in c["env"], where
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, f"{where}: no {probe}"
            res = c["resources"]
            assert res["requests"] == res["limits"], f"{where}: requests != limits"
            assert "hugepages-2Mi" in res["limits"] and "--hugepages" in args, where
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/run/kvbroker")
            vol = vols[mount["name"]]
            if "hostPath" in vol:
                shapes.add("daemonset")
                assert doc["kind"] == "DaemonSet" and vol["hostPath"]["path"] == "/run/kvbroker"
            else:
                shapes.add("sidecar")
                assert "emptyDir" in vol, where
                assert c.get("restartPolicy") == "Always", f"{where}: not a native sidecar"
    assert shapes == {"daemonset", "sidecar"}, shapes


def test_engines_reach_the_broker() -> None:
    # Every engine mounts the broker's socket directory and names the same socket; on the
    # DaemonSet's nodes, it is in the group the broker admits.
    ds = next(d for _, d in _docs() if d["kind"] == "DaemonSet")
    ds_spec = ds["spec"]["template"]["spec"]
    args = _brokers(ds_spec)[0]["args"]
    assert args[args.index("--group") + 1] == "kvbroker"
    broker_gid = ds_spec["securityContext"]["runAsGroup"]
    engines = 0
    for path, doc in _docs():
        spec = _pod_spec(doc)
        if spec is None:
            continue
        for c in spec["containers"]:
            if c["name"] == "kvbrokerd":
                continue
            engines += 1
            assert {"name": "KVB_SOCKET", "value": SOCKET} in c["env"], path
            assert any(m["mountPath"] == "/run/kvbroker" for m in c["volumeMounts"]), path
            if not _brokers(spec):
                assert broker_gid in spec["securityContext"]["supplementalGroups"], path
                assert spec.get("nodeSelector") == ds_spec["nodeSelector"], path
    assert engines >= 2


def test_containerfile_matches_the_manifests() -> None:
    cf = (DEPLOY / "Containerfile").read_text()
    assert "COPY build/wheel/kvbroker-*.whl" in cf
    assert re.search(r"groupadd .*--gid 10001 kvbroker", cf)
    assert re.search(r"useradd .*--uid 10001 --gid kvbroker", cf)
    assert "USER 10001:10001" in cf
    ds = next(d for _, d in _docs() if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_systemd_unit(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "kvbrokerd.service").read_text()
    for want in ("Type=notify", "RuntimeDirectory=kvbroker", "RuntimeDirectoryMode=0750",
                 f"--socket {SOCKET}", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "CapabilityBoundingSet=", "RestrictAddressFamilies="):
        assert want in unit, want
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze (systemd) here")
    # verify wants the program to exist: any executable will do for the unit's syntax.
    copy = tmp_path / "kvbrokerd.service"
    copy.write_text(unit.replace("/usr/local/bin/kvbrokerd", "/bin/true"))
    r = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    problems = [line for line in (r.stdout + r.stderr).splitlines()
                # systemd < 254 does not know this option yet and ignores it (the unit says so)
                if line.strip() and "Unknown key 'FileDescriptorStorePreserve'" not in line
                # no D-Bus in a container or chroot: verify cannot ask for the unit's deps
                and "Failed to" not in line and "bus" not in line.lower()]
    assert not problems, "\n".join(problems)


def test_sdist_stands_alone(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "build", "-q", "--sdist", "--no-isolation",
                        "-o", str(tmp_path), str(ROOT / "python")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = tmp_path.glob("kvbroker-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
        # The "data" filter where this Python has it (3.11.4 on; Debian 12's 3.11.2 has not):
        # the tarball is the one just built, so the filter is hygiene, not a defence.
        if hasattr(tarfile, "data_filter"):
            t.extractall(tmp_path / "x", filter="data")
        else:
            t.extractall(tmp_path / "x")
    for want in ("setup.py", "pyproject.toml", "native/Makefile", "native/tools/deps.sh",
                 "native/include/kvbroker.h", "native/broker/main.c",
                 "native/client/libkvbroker.map",
                 "native/tools/kvbctl.c", "native/tools/kvbbench/main.c",
                 "native/broker/kernels/copy_segs.cu", "native/broker/kernels/crc32c_gf.h",
                 "src/kvbroker/sglang.py", "csrc/module.c"):
        assert want in names, f"{want} missing from {sdist.name}"
    # Unpacked where ../ is no repository: setup.py finds the C tree in native/.
    (top,) = (tmp_path / "x").iterdir()
    r = subprocess.run([sys.executable, "setup.py", "--version"], cwd=top,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == sdist.name[len("kvbroker-"):-len(".tar.gz")]
