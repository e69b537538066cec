"""`accelstack detect --format nfd|prometheus` (issue 28): the files fleet tools read, checked by
those formats' own rules, for every replayed capture and for this machine with a runtime installed.

- NFD feature files, by the rules the NFD and Kubernetes docs state: NFD's "local feature source"
  input format (kubernetes-sigs/node-feature-discovery docs/usage/customization-guide.md: ``#``
  comments, ``<key>[=<value>]``, ``# +expiry-time=`` in RFC 3339, a 64 kB limit, dot-files ignored);
  Kubernetes label syntax (kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set:
  an optional DNS-subdomain prefix of at most 253 characters and ``/``, a name of at most 63
  characters ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``, a value of at most 63 of the same or empty);
  and nfd-master's namespace rule (docs/reference/master-commandline-reference.md, ``-deny-label-ns``:
  ``kubernetes.io`` and its subdomains are always denied, but ``feature.node.kubernetes.io``).
- Prometheus textfiles, by the Prometheus project's own parser (prometheus_client.parser), not a regex.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from accelstack.cli import build_parser, main
from accelstack.commands.fleet_format import nfd_text, prometheus_text
from accelstack.core.fleet import RuntimeFact, installed_runtimes, label_value, node_labels, node_metrics, vram_class
from accelstack.hardware.report import GPU, CPUInfo, HardwareReport, MemoryInfo, OSInfo, Problem
from accelstack.installer.home import Home
from accelstack.installer.records import Receipt, now_iso
from accelstack.manifests.plan import Plan
from accelstack.settings import Settings
from accelstack.verdict import VerifyReport

from cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
FLEET_DOC = REPO / "docs" / "fleet.md"
GiB = 1024 ** 3

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _captures() -> List[str]:
    return sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").is_file())


def label_problem(key: str, value: str) -> str:
    """What is wrong with the label ``key=value`` by Kubernetes' and nfd-master's rules ("" if nothing)."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return "more than one '/'"
    if prefix:
        if len(prefix) > 253 or not all(_DNS_LABEL.match(part) for part in prefix.split(".")):
            return f"prefix {prefix!r} is not a DNS subdomain"
        denied = prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))
        allowed = prefix in ("feature.node.kubernetes.io", "profile.node.kubernetes.io") or prefix.endswith(
            (".feature.node.kubernetes.io", ".profile.node.kubernetes.io"))
        if denied and not allowed:
            return f"nfd-master denies the namespace {prefix!r}"
    if len(name) > 63 or not _NAME.match(name):
        return f"name {name!r} is not a label name"
    if value and (len(value) > 63 or not _NAME.match(value)):
        return f"value {value!r} is not a label value"
    return ""


def parse_nfd(text: str) -> Tuple[Dict[str, str], List[str]]:
    """NFD's local-source reading of a feature file: ({label: value}, the expiry-time directives),
    failing on any line that is not a comment, a blank or a valid label."""
    assert len(text.encode()) <= 64 * 1024, "NFD ignores a feature file over 64 kB"
    labels: Dict[str, str] = {}
    expiry: List[str] = []
    for line in text.splitlines():
        if line.startswith("# +expiry-time="):
            expiry.append(line.split("=", 1)[1])
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        problem = label_problem(key, value)
        assert not problem, f"{line!r}: {problem}"
        assert key not in labels, f"{key} given twice"
        labels[key] = value if "=" in line else "true"
    return labels, expiry


def parse_prometheus(text: str) -> Dict[str, object]:
    """The textfile through prometheus_client's parser, with the naming rules the format sets."""
    families = {}
    for fam in text_string_to_metric_families(text):
        assert _METRIC.match(fam.name) and fam.name.startswith("accelstack_"), fam.name
        assert fam.type == "gauge" and fam.documentation, fam.name
        seen = set()
        for s in fam.samples:
            assert s.name == fam.name, (s.name, fam.name)
            for k in s.labels:
                assert _LABEL_NAME.match(k) and not k.startswith("__"), k
            key = tuple(sorted(s.labels.items()))
            assert key not in seen, f"{fam.name}: two samples with the labels {key}"
            seen.add(key)
            if fam.name.endswith("_info"):
                assert s.value == 1.0, s
        families[fam.name] = fam
    return families


def _cli(args: List[str], capsys) -> Tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name", _captures())
def test_every_capture_gives_a_valid_nfd_file_and_prometheus_textfile(name, capsys):
    capture = str(CAPTURES / name)
    rc, out, err = _cli(["detect", "--replay", capture, "--format", "nfd"], capsys)
    assert rc == 0, err
    labels, expiry = parse_nfd(out)
    assert expiry == []
    assert all(k.startswith("feature.node.kubernetes.io/accelstack.") for k in labels)
    assert labels["feature.node.kubernetes.io/accelstack.api.cpu"] == "true"
    assert not any(".runtime." in k for k in labels), "a replay is another machine: no runtime of this one"
    rc, out, err = _cli(["detect", "--replay", capture, "--json"], capsys)
    report = json.loads(out.splitlines()[-1])["result"]
    usable = {a["name"] for a in report["apis"] if a["usable"]}
    assert {k.rsplit(".", 1)[1] for k in labels if ".api." in k and not k.endswith(".preferred")} == usable
    assert labels["feature.node.kubernetes.io/accelstack.gpu.count"] == str(len(report["gpus"]))
    assert labels["feature.node.kubernetes.io/accelstack.npu.count"] == str(len(report["npus"]))
    if report["gpus"]:
        assert labels["feature.node.kubernetes.io/accelstack.gpu.vendor"] in {g["vendor"] for g in report["gpus"]}

    rc, out, err = _cli(["detect", "--replay", capture, "--format", "prometheus"], capsys)
    assert rc == 0, err
    families = parse_prometheus(out)
    assert {s.labels["api"]: s.value for s in families["accelstack_api_usable"].samples} == {
        a["name"]: float(a["usable"]) for a in report["apis"]}
    assert families["accelstack_gpus"].samples[0].value == len(report["gpus"])
    assert families["accelstack_npus"].samples[0].value == len(report["npus"])
    assert [s.labels["driver"] for s in families["accelstack_npu_info"].samples] == [n["driver"] for n in report["npus"]] \
        if report["npus"] else "accelstack_npu_info" not in families
    if report["gpus"]:
        assert len(families["accelstack_gpu_info"].samples) == len(report["gpus"])


def _report(**gpu: object) -> HardwareReport:
    facts = {"index": 0, "vendor": "intel", "name": "x", **gpu}
    return HardwareReport(os=OSInfo(name="linux"), cpu=CPUInfo(), memory=MemoryInfo(),
                          gpus=[GPU(**facts)],  # type: ignore[arg-type]
                          problems=[Problem("a", "one"), Problem("a", "the same code again")])


def test_odd_strings_survive_the_textfile_and_become_valid_label_values():
    name = 'Arc "A770" \\ 16GB\nsecond line'
    report = _report(name=name, intel_generation="Xe-HPG (Alchemist)", vram_total=16 * GiB, driver_version="1.3.2\\x")
    families = parse_prometheus(prometheus_text(node_metrics(report)))
    info = families["accelstack_gpu_info"].samples[0]
    assert info.labels["name"] == name and info.labels["driver_version"] == "1.3.2\\x"
    assert info.labels["arch"] == "Xe-HPG (Alchemist)"
    assert len(families["accelstack_problem_info"].samples) == 1  # one per code and severity
    labels, _ = parse_nfd(nfd_text(node_labels(report), "replay:odd\nfolder"))
    assert labels["feature.node.kubernetes.io/accelstack.gpu.arch"] == "Xe-HPG-Alchemist"
    assert label_value("((" * 40) == "" and len(label_value("a" * 100)) == 63 and label_value("-x.") == "x"


@pytest.mark.parametrize("size, cls", [(None, ""), (2 * GiB, "under4g"), (int(7.5 * GiB), "6g"), (int(7.7 * GiB), "8g"), (8 * GiB, "8g"),
                                       (int(11.99 * GiB), "12g"), (24564 * 1024 ** 2, "24g"), (int(139.8 * GiB), "128g")])
def test_vram_classes_count_a_card_by_the_size_it_is_sold_as(size, cls):
    assert vram_class(size) == cls


def test_runtime_labels_and_metrics_come_from_the_receipts_verdict():
    report = _report(compute_capability="8.9")
    runtimes = [RuntimeFact("ggml", "ggml-cuda-1", "cuda", "pass", "verify", True),
                RuntimeFact("torch", "torch-cu126-1", "cuda", "fail", "torch", False)]
    labels, _ = parse_nfd(nfd_text(node_labels(report, runtimes), "live"))
    assert labels["feature.node.kubernetes.io/accelstack.runtime.ggml"] == "cuda"
    assert labels["feature.node.kubernetes.io/accelstack.runtime.ggml.verify"] == "pass"
    assert labels["feature.node.kubernetes.io/accelstack.runtime.torch.verify"] == "fail"
    assert labels["feature.node.kubernetes.io/accelstack.gpu.arch"] == "sm_89"
    families = parse_prometheus(prometheus_text(node_metrics(report, runtimes)))
    assert {s.labels["stack"]: s.value for s in families["accelstack_runtime_verified"].samples} == {"ggml": 1, "torch": 0}
    assert {s.labels["stack"]: s.value for s in families["accelstack_runtime_healthy"].samples} == {"ggml": 1, "torch": 0}


def _installed_home(root: Path) -> Path:
    """A home with a ggml runtime whose receipt says it passed verify (its runtime folder empty)."""
    home = Home(root)
    home.ensure()
    rt = home.runtimes("ggml") / "ggml-cpu-1"
    rt.mkdir(parents=True)
    home.write_receipt(Receipt(id="ggml-cpu-1", stack="ggml", backend="cpu", path=home.relative(rt),
                               plan=Plan(stack="ggml", summary="cpu build", backend="cpu"), verified_at=now_iso(),
                               verification=VerifyReport(ok=True, reason="", runtime=str(rt), backend="cpu")))
    home.set_active("ggml", "ggml-cpu-1")
    return root


@pytest.mark.parametrize("ok, verified_at, verdict", [(True, "2026-12-04T20:00:00.000000Z", "pass"),
                                                      (False, "2026-12-04T20:00:00.000000Z", "fail"), (False, "", "unverified")])
def test_the_verdict_is_the_receipts_last_verify(ok, verified_at, verdict, tmp_path):
    home = Home(_installed_home(tmp_path / "home"))
    receipt = home.read_receipt("ggml-cpu-1")
    receipt.verified_at = verified_at
    receipt.verification = VerifyReport(ok=ok, reason="" if ok else "black image", runtime="", backend="cpu")
    home.write_receipt(receipt)
    report = HardwareReport(os=OSInfo(name="linux"), cpu=CPUInfo(), memory=MemoryInfo())
    (fact,) = installed_runtimes(report, Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache"))
    assert (fact.stack, fact.runtime, fact.backend, fact.verdict) == ("ggml", "ggml-cpu-1", "cpu", verdict)
    assert installed_runtimes(report, Settings.resolve(home=tmp_path / "none", cache=tmp_path / "cache")) == []
    assert not (tmp_path / "none").exists(), "reading the runtimes makes no home"


def test_format_json_is_json(capsys):
    capture = str(CAPTURES / "linux-nvidia-rtx4070-550")
    given, same = ([json.loads(_cli(["detect", "--replay", capture, *how], capsys)[1])["result"]]
                   for how in (["--format", "json"], ["--json"]))
    for report in given + same:
        report.pop("duration_ms")
    assert given == same


def _env(tmp_path: Path) -> Dict[str, str]:
    return {"ACCELSTACK_HOME": str(tmp_path / "home"), "ACCELSTACK_CACHE": str(tmp_path / "cache")}


def test_this_machine_with_a_verified_runtime_written_atomically_to_the_collector_folder(tmp_path):
    _installed_home(tmp_path / "home")
    folder = tmp_path / "textfile_collector"
    folder.mkdir()
    target = folder / "accelstack.prom"
    target.write_text("stale\n")
    rc, out, err = run_cli(["detect", "--format", "prometheus", "--output", target], env=_env(tmp_path))
    assert rc == 0, err
    assert out == "" and str(target) in err
    assert sorted(p.name for p in folder.iterdir()) == ["accelstack.prom"], "no temporary file left beside it"
    families = parse_prometheus(target.read_text())
    assert families["accelstack_runtime_info"].samples[0].labels == {
        "stack": "ggml", "runtime": "ggml-cpu-1", "backend": "cpu", "verdict": "pass"}
    assert families["accelstack_runtime_verified"].samples[0].value == 1

    features = tmp_path / "features.d" / "accelstack"  # the folder is made, as NFD's hostPath may not exist yet
    rc, out, err = run_cli(["detect", "--format", "nfd", "-o", features, "--expires-in", "3600", "--home", tmp_path / "home"])
    assert rc == 0, err
    labels, expiry = parse_nfd(features.read_text())
    assert labels["feature.node.kubernetes.io/accelstack.runtime.ggml"] == "cpu"
    assert labels["feature.node.kubernetes.io/accelstack.runtime.ggml.verify"] == "pass"
    (when,) = expiry
    left = datetime.datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp() - time.time()
    assert 3000 < left <= 3600


@pytest.mark.parametrize("args, says", [
    (["--json", "--format", "nfd"], "two outputs"),
    (["--output", "x.json"], "--output writes an nfd or prometheus file"),
    (["--format", "prometheus", "--expires-in", "60"], "expiry of an NFD feature file"),
    (["--format", "nfd", "--expires-in", "0"], "must be a positive number"),
    (["--format", "nfd", "--expires-in", "nan"], "must be a positive number"),
    (["--format", "nfd", "--output", "/proc/nope/features"], "cannot write the nfd file"),
])
def test_what_cannot_be_done_is_a_usage_error_before_detection(args, says, tmp_path):
    rc, out, err = run_cli(["detect", "--replay", str(CAPTURES / "linux-nvidia-rtx4070-550"), *args], env=_env(tmp_path))
    assert rc == 2 and says in out + err, (rc, out, err)


def test_a_folder_as_output_is_refused(tmp_path):
    rc, out, err = run_cli(["detect", "--format", "nfd", "--output", tmp_path], env=_env(tmp_path))
    assert rc == 2 and "cannot write" in err
    assert os.listdir(tmp_path) == [], "nothing written"


def test_help_teaches_where_each_file_goes():
    rc, out, err = run_cli(["detect", "--help"])
    assert rc == 0
    assert "/etc/kubernetes/node-feature-discovery/features.d/" in out and "textfile_collector" in out
    assert "--format" in out and "--expires-in" in out


# docs/fleet.md: every `accelstack ...` command it shows is one the CLI parses, as written.
def _doc_commands() -> List[str]:
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", FLEET_DOC.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"(?:^|\s)#", line)[0]  # a comment says "accelstack" in words
            for m in re.finditer(r"(?:^|[\s/=$'\"(])(accelstack [^|;&>#\n'\"]*)", line):
                found.append(m.group(1).strip())
    return found


def test_the_fleet_doc_names_every_step_with_commands():
    text = FLEET_DOC.read_text(encoding="utf-8")
    commands = _doc_commands()
    for step in ("channel add", "manifest", "bundle create", "install --bundle", "detect --capture",
                 "status --json", "doctor", "detect --format nfd", "detect --format prometheus"):
        assert any(c.startswith("accelstack " + step) for c in commands), step
    for words in ("features.d", "textfile", "expiry-time", "DaemonSet", "OnCalendar"):
        assert words in text, words


@pytest.mark.parametrize("command", _doc_commands())
def test_a_fleet_doc_command_parses(command):
    argv = shlex.split(command)[1:]
    try:
        build_parser().parse_args(argv)
    except (SystemExit, Exception) as exc:  # noqa: BLE001  (the parser's own errors, whatever their type)
        pytest.fail(f"docs/fleet.md: `{command}` does not parse: {exc}")
